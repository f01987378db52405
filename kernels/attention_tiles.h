// The tile schedule of the tensor-core attention kernels (kernels/cuda/flash_attention.cuh),
// written once for the GPU and for the host test that replays it tile by tile against the CPU
// attention (test_ops.cpp, AttentionTiles.*): the tile shapes, which tiles a block visits, where
// the causal mask cuts a tile, and the online softmax's arithmetic.
//
// Scores are kept in log2 units, x = (q . k) * scale * log2(e), so that every exponential is one
// exp2 (a single MUFU.EX2 on the GPU); the saved log-sum-exp is in natural units, as the CPU
// backend's and PyTorch's are.
#pragma once
#include <cmath>

#include "../common/host_device.h"

namespace attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ----------------------------------------------------------------------------
// tile shapes. A warp's tensor-core products cover 16 rows (mma m16n8k16), so every row count is
// 16 rows per warp times a small factor. HS is the head size padded to the kernel's (64 or 128).

// forward: a block of `warps` warps owns query_rows = warps * 16 * row_tiles rows and streams
// the keys through shared memory key_tile at a time
template <int HS_, int WARPS, int ROW_TILES, int KEY_TILE>
struct ForwardTiles {
    static constexpr int HS = HS_, warps = WARPS, row_tiles = ROW_TILES, key_tile = KEY_TILE;
    static constexpr int rows_per_warp = 16 * ROW_TILES, query_rows = WARPS * rows_per_warp;
};
// backward, dK and dV: a block owns key_rows = warps * 16 keys and streams the queries at or
// after its first key, query_tile at a time. kv_in_registers: each warp keeps its K and V rows
// as tensor-core operands in registers (HS = 64) instead of rereading them from shared memory.
template <int HS_, int WARPS, int QUERY_TILE, bool KV_IN_REGISTERS>
struct BackwardKVTiles {
    static constexpr int HS = HS_, warps = WARPS, query_tile = QUERY_TILE;
    static constexpr bool kv_in_registers = KV_IN_REGISTERS;
    static constexpr int keys_per_warp = 16, key_rows = WARPS * 16;
};
// backward, dQ: a block owns query_rows = warps * 16 queries and streams keys up to its last
template <int HS_, int WARPS, int KEY_TILE>
struct BackwardQTiles {
    static constexpr int HS = HS_, warps = WARPS, key_tile = KEY_TILE;
    static constexpr int rows_per_warp = 16, query_rows = WARPS * 16;
};

// The shapes the kernels use, by padded head size. Registers decide them: a warp holds its
// accumulators (16 x HS fp32: HS/2 registers a thread, twice in backward dK/dV) and one tile of
// scores (16 x tile fp32: tile/2) at once, under the 255 a thread may have.
template <int HS>
struct FlashTiles;
template <>
struct FlashTiles<64> {
    using Forward = ForwardTiles<64, 4, 2, 64>;           // 128 query rows, 32 a warp
    using BackwardKV = BackwardKVTiles<64, 8, 64, true>;  // 128 keys, queries 64 at a time
    using BackwardQ = BackwardQTiles<64, 4, 64>;          // 64 queries, keys 64 at a time
};
template <>
struct FlashTiles<128> {
    using Forward = ForwardTiles<128, 4, 1, 64>;
    using BackwardKV = BackwardKVTiles<128, 4, 32, false>;
    using BackwardQ = BackwardQTiles<128, 4, 32>;
};

// Hopper (sm_90a, kernels/cuda/flash_attention_hopper.cuh): a consumer warpgroup (4 warps) owns
// 64 rows of a product (wgmma m64nNk16); a block has two consumers and a producer warpgroup that
// loads the tiles. The names follow the warp-level shapes above (a consumer in place of a warp),
// so that one host replay covers both.
//
// forward: 128 query rows, keys key_tile at a time, two stages deep. The key tile equals the
// query rows, so each consumer sees every tile its block loads (none is wholly above its rows).
template <int HS_, int KEY_TILE>
struct HopperForwardTiles {
    static constexpr int HS = HS_, key_tile = KEY_TILE, stages = 2;
    static constexpr int warps = 2, rows_per_warp = 64, query_rows = warps * rows_per_warp;
    static_assert(KEY_TILE == query_rows, "each consumer must see every key tile of its block");
};
// backward: a block owns 128 keys, 64 a consumer, and streams the queries at or after its first
// key, query_tile at a time; each tile's dQ is summed over the key blocks (dq_last_key_block)
template <int HS_, int QUERY_TILE>
struct HopperBackwardTiles {
    static constexpr int HS = HS_, query_tile = QUERY_TILE, stages = 2;
    static constexpr int warps = 2, keys_per_warp = 64, key_rows = warps * keys_per_warp;
    static_assert(key_rows % QUERY_TILE == 0 && QUERY_TILE % 64 == 0, "a key block starts on a query tile");
};
// Registers decide the shapes, as above: a thread of a consumer holds 1/128 of each of its
// 64-row products. Forward: the scores of a key tile (64 x 128 fp32: 64 registers), P (32) and
// O (HS/2). Backward: S^T and dP^T (64 x query_tile each), dK and dV (64 x HS each) and dQ's part
// (64 x 64): queries 64 at a time (at HS 64, 128 at a time spilled: 64 + 64 + 32 + 32 + 32).
template <int HS>
struct HopperTiles;
template <>
struct HopperTiles<64> {
    using Forward = HopperForwardTiles<64, 128>;
    using Backward = HopperBackwardTiles<64, 64>;
};
template <>
struct HopperTiles<128> {
    using Forward = HopperForwardTiles<128, 128>;
    using Backward = HopperBackwardTiles<128, 64>;
};

// ----------------------------------------------------------------------------
// which tiles a block visits

// causal: query q sees keys 0..q
HOST_DEVICE inline bool key_visible(int q, int k) { return k <= q; }

// number of key tiles (0, 1, ...) that queries [q0, q0 + rows) see, rows past T left out
HOST_DEVICE inline int key_tiles_seen(int q0, int rows, int T, int key_tile) {
    const int last_query = (q0 + rows < T ? q0 + rows : T) - 1;
    return last_query / key_tile + 1;
}
// the first query tile that sees key k0 (keys are never seen by earlier queries)
HOST_DEVICE inline int first_query_tile(int k0, int query_tile) { return k0 / query_tile; }
HOST_DEVICE inline int query_tiles(int T, int query_tile) { return (T + query_tile - 1) / query_tile; }

// one warp's product of queries [q_first, q_last] with keys [k_first, k_last]:
// nothing visible (skip the product) / some keys past some queries (apply the mask)
HOST_DEVICE inline bool tile_all_masked(int q_last, int k_first) { return k_first > q_last; }
HOST_DEVICE inline bool tile_needs_mask(int q_first, int k_last) { return k_last > q_first; }

// Hopper backward's dQ, deterministic in one kernel: query tile i's dQ is the sum of the parts of
// key blocks 0..dq_last_key_block(i) (those whose queries reach tile i), added in a fixed order,
// highest key block first. The highest stores its part in a global fp32 accumulator; each
// lower one adds its own once the counter of tile i says that all above it have
// (dq_adds_before); key block 0 adds the accumulator to its part in registers and writes dQ.
// Tile i is the highest block's first tile and a lower block's later one, so the order follows
// the work: a block seldom waits, and never for a block launched after it (the grid launches the
// highest key blocks first).
HOST_DEVICE inline int dq_last_key_block(int query_tile_index, int query_tile, int key_rows) {
    return query_tile_index * query_tile / key_rows;
}
HOST_DEVICE inline int dq_adds_before(int key_block, int last_key_block) { return last_key_block - key_block; }

// ----------------------------------------------------------------------------
// online softmax, one row at a time: the running maximum m (log2 units) and the running sum of
// exp2(x - m). A new maximum rescales what was summed (and the output accumulated) by
// exp2(m_old - m_new). Every row sees key 0 in the first tile, so m is finite from then on and
// the first rescale is exp2(-inf) = 0.

HOST_DEVICE inline float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}

HOST_DEVICE inline float scale_log2(int hs) { return kLog2e / sqrtf((float)hs); }
HOST_DEVICE inline float rescale_factor(float m_old, float m_new) { return fast_exp2(m_old - m_new); }
HOST_DEVICE inline float softmax_term(float x, float m) { return fast_exp2(x - m); }
// the saved statistic: natural log of sum_k exp(s_k * scale)
HOST_DEVICE inline float log_sum_exp(float m, float sum) { return (m + log2f(sum)) * kLn2; }

// backward: P rebuilt from the saved log-sum-exp, and the softmax's gradient without the scale
// (dS = P (dP - D), D = rowsum(dO . O)); the kernels multiply the scale in once, at the end
HOST_DEVICE inline float prob_from_lse(float x, float lse_log2) { return fast_exp2(x - lse_log2); }
HOST_DEVICE inline float softmax_grad(float p, float dp, float delta) { return p * (dp - delta); }

}  // namespace attn
