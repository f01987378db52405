// Warp-level tensor-core building blocks (sm_80+), as PTX: the bf16 matrix product m16n8k16
// with fp32 accumulators, ldmatrix to feed it from shared memory, and cp.async to fill shared
// memory without passing through registers.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), lane = 4 * g + t (g = lane / 4, t = lane % 4):
//   A 16x16 (row major), 4 registers of 2 bf16: {a0: row g, cols 2t,2t+1; a1: row g+8, same cols;
//                                                a2: row g, cols 2t+8,2t+9; a3: row g+8, same}
//   B 16x8 (k x n),      2 registers:           {b0: k 2t,2t+1 of col g; b1: k 2t+8,2t+9 of col g}
//   C 16x8 fp32,         4 floats:              {c0,c1: row g, cols 2t,2t+1; c2,c3: row g+8}
// Two C fragments side by side (16 x 16) hold exactly the elements of one A fragment in the same
// lanes: a product's output becomes the next product's input without leaving registers.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace gpu {

// d += a * b
__device__ inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// two floats as one register of two bf16 (round to nearest), lo in the low half
__device__ inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// A fragment (16 x 16) from two accumulators side by side: c_left holds cols 0-7, c_right 8-15
__device__ inline void accumulators_to_a(uint32_t (&a)[4], const float (&c_left)[4], const float (&c_right)[4]) {
    a[0] = pack_bf16(c_left[0], c_left[1]);
    a[1] = pack_bf16(c_left[2], c_left[3]);
    a[2] = pack_bf16(c_right[0], c_right[1]);
    a[3] = pack_bf16(c_right[2], c_right[3]);
}

// Four 8x8 bf16 matrices from shared memory: lanes 8i..8i+7 give the 8 row addresses (16 bytes
// each) of matrix i, and each lane receives, in register i, elements (lane/4, 2(lane%4) + {0,1})
// of matrix i; with .trans, elements (2(lane%4) + {0,1}, lane/4): the matrix transposed.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// 16 bytes global -> shared, asynchronously; visible after cp_async_wait and a barrier
__device__ inline void cp_async_16(void* smem, const void* global) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(global) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// wait until at most `pending` committed groups are still in flight
template <int pending>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace gpu
