// Where the Hopper attention kernels (kernels/cuda/flash_attention_hopper.cuh) keep their bf16
// tiles in shared memory, how wgmma's matrix descriptors point into them, and which element of a
// product each thread's registers hold. Written once for the GPU and for the host test that
// checks them against a model of the hardware (test_ops.cpp, WgmmaLayout.*): a layout bug here
// would otherwise surface only as wrong numbers on a GPU.
//
// Tiles: the bulk tensor copy (TMA) writes a box whose rows are 128 bytes (64 bf16) with 128-byte
// swizzling: within each group of 8 rows (1024 bytes) the 16-byte chunk c of row r lands at chunk
// c ^ (r % 8), so that the 8 rows of one column chunk sit in 8 different groups of banks. A tile
// of `rows` rows and 64 * blocks columns is `blocks` such boxes one after the other ("column
// blocks"), each starting on a 1024-byte boundary, the swizzle a function of the address bits.
//
// Descriptors (PTX ISA, "Matrix Descriptor Format"; canonical layouts as CUTLASS's cute
// documents them, in 16-byte units): an operand of an m64nNk16 product is
//   K-major  (its k index runs along a tile row: Q and K in Q K^T): rows of 128 bytes, groups of
//            8 rows `stride` bytes apart; a k-slice of 16 starts 32 bytes into the row
//   MN-major (its k index runs down the tile: V in P V, dO and Q in dV and dK, dS^T and K in
//            dQ): 64 columns a 128-byte row, k rows 128 bytes apart, groups of 8 k rows `stride`
//            bytes apart, the next 64 columns `leading` bytes further (the next column block)
#pragma once
#include <cstdint>

#include "../common/host_device.h"

namespace wgmma {

constexpr int kBlockCols = 64;      // bf16 columns of one column block (128 bytes)
constexpr int kRowBytes = 128;
constexpr int kSwizzleBytes = 1024;  // the swizzle pattern repeats every 8 rows
constexpr int kGroupStride = 1024;   // bytes between groups of 8 rows within a column block

// the 128-byte swizzle on a shared-memory address (or an offset from a 1024-byte boundary)
HOST_DEVICE inline uint32_t swizzle128(uint32_t byte) { return byte ^ (((byte >> 7) & 7u) << 4); }

// byte offset of element (r, c) in a tile of `rows` rows, where the bulk copy puts it
HOST_DEVICE inline uint32_t tile_offset(int rows, int r, int c) {
    return swizzle128((uint32_t)((c / kBlockCols) * rows * kRowBytes + r * kRowBytes + (c % kBlockCols) * 2));
}

// the 64-bit descriptor: addresses and offsets in 16-byte units, swizzle mode 1 (128 bytes)
HOST_DEVICE inline uint64_t descriptor(uint32_t start, uint32_t leading, uint32_t stride) {
    return (uint64_t)((start & 0x3FFFFu) >> 4) | (uint64_t)((leading & 0x3FFFFu) >> 4) << 16 |
           (uint64_t)((stride & 0x3FFFFu) >> 4) << 32 | 1ull << 62;
}
// K-major operand: tile rows [row0, row0 + 64 or N) as M or N, columns [k0, k0 + 16) as k
// (k0 a multiple of 16). The leading offset is unused when a k-slice fits in a row.
HOST_DEVICE inline uint64_t k_major(uint32_t tile, int rows, int row0, int k0) {
    return descriptor(tile + (k0 / kBlockCols) * rows * kRowBytes + row0 * kRowBytes + (k0 % kBlockCols) * 2, 16,
                      kGroupStride);
}
// MN-major operand: tile rows [k0, k0 + 16) as k, columns [col0, ...) as M or N (col0 a multiple of
// 64: an operand starts on a column block)
HOST_DEVICE inline uint64_t mn_major(uint32_t tile, int rows, int k0, int col0) {
    return descriptor(tile + (col0 / kBlockCols) * rows * kRowBytes + k0 * kRowBytes, rows * kRowBytes, kGroupStride);
}

// ----------------------------------------------------------------------------
// registers of a warpgroup's thread (tid = 0..127; warp tid / 32 owns rows 16 (tid / 32) ...)

// accumulator i (float) of an m64nN product: its row and column
HOST_DEVICE inline int acc_row(int tid, int i) { return (tid / 32) * 16 + (tid % 32) / 4 + 8 * ((i >> 1) & 1); }
HOST_DEVICE inline int acc_col(int tid, int i) { return (i >> 2) * 8 + (tid % 4) * 2 + (i & 1); }
// register j (0..3) of the A operand's k-slice, from registers: two bf16, half e (0: low bits)
HOST_DEVICE inline int a_row(int tid, int j) { return (tid / 32) * 16 + (tid % 32) / 4 + 8 * (j & 1); }
HOST_DEVICE inline int a_col(int tid, int j, int e) { return (j >> 1) * 8 + (tid % 4) * 2 + e; }
// So accumulators 2j and 2j + 1 of a 64 x K product, rounded to bf16 together, are register j % 4
// of k-slice j / 4 of the next product's A operand: a product's output is the next one's input
// without moving between threads (P in P V, P^T and dS^T in dV and dK).

// stmatrix .x4 of a warp's 16 x 16 block of such an operand (registers 4m..4m+3: k-slice m):
// register j holds the block's rows 8 (j & 1) .., columns 8 (j >> 1) .. (an 8x8 matrix each), and
// lane gives the address of row stmatrix_row(lane), columns stmatrix_col(lane) .. + 8 of the block
HOST_DEVICE inline int stmatrix_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
HOST_DEVICE inline int stmatrix_col(int lane) { return (lane >> 4) * 8; }

// ----------------------------------------------------------------------------
// dQ's fp32 staging tile (rows x hs floats, in shared memory and in the global accumulator it is
// copied to as it is): row-major, each row's 16-byte chunks permuted by the row so that a
// warp's stores of its accumulators (8 rows, 8 bytes at 4 columns apart each) hit 32 different
// banks
HOST_DEVICE inline int dq_stage_index(int hs, int row, int col) {
    return row * hs + ((((col >> 2) ^ ((row & 3) << 1))) << 2) + (col & 3);
}
// the same for accumulator i of a consumer thread writing rows row0.., columns col0.. (multiples
// of 8) of the tile: the thread's first, dq_stage_index(hs, row0 + acc_row(tid, 0), col0 +
// acc_col(tid, 0)), plus `base` (a multiple of 64 floats: a staging buffer's), XOR a term known
// at compile time. One instruction an address, where precomputed addresses took a register each.
HOST_DEVICE inline int dq_stage_of(int first, int hs, int i) { return (first ^ ((i >> 2) << 3)) + ((i >> 1) & 1) * 8 * hs; }

}  // namespace wgmma
