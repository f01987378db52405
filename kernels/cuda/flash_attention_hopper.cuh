// Causal attention for Hopper (sm_90a), forward and backward, bf16, head sizes 64 and 128: the
// design of flash_attention.cuh (online softmax, only the log-sum-exp saved, a deterministic
// backward rebuilt from it) on warpgroup tensor cores, in the manner of FlashAttention-3. Other
// GPUs and head sizes keep flash_attention.cuh's kernels (attention.cuh chooses).
//
// A block is three warpgroups. The producer (warpgroup 0) gives most of its registers to the
// others (setmaxnreg) and loads the tiles with the bulk tensor copy engine, two stages deep, each
// load completing on an mbarrier that the consumers wait on and handing the stage back through
// another. The two consumers (warpgroups 1 and 2) own 64 rows each and multiply with wgmma,
// operands in shared memory or, for P and dS, in registers: a product's accumulators become the
// next product's A operand in place (wgmma_layout.h says where everything lives).
//
// Forward: each consumer issues S = Q K^T of tile j and O += P V of tile j - 1 together, waits
// for S only and computes tile j's exponentials while P V runs (FlashAttention-3's pipelining
// within a warpgroup); the two consumers, independent of each other, fill each other's gaps too.
//
// Backward: a block owns 128 keys (64 a consumer), streams the query tiles at or after them and
// sums dK and dV in registers, as flash_backward_kv_kernel does. dQ is summed over the key blocks
// without the second kernel that recomputes the scores: each block writes its part (fp32) to
// shared memory, and the producer's other three warps add it to a global accumulator in a fixed
// order (attention_tiles.h, dq_last_key_block), waiting on a counter in global memory: the same
// sums in the same order on every run. Their adds overlap the consumers' next tiles.
#pragma once
#include <cuda.h>

#include "../attention_tiles.h"
#include "../wgmma_layout.h"
#include "attention_heads.cuh"
#include "common.cuh"
#include "flash_attention.cuh"
#include "mma.cuh"
#include "sm90.cuh"

namespace gpu {

constexpr int kHopperThreads = 384;  // producer + two consumers
constexpr int kConsumerThreads = 128;

// what the backward kernel needs besides FlashArgs: dQ's accumulator (fp32, a tile of
// query_tile x hs after another, the staging layout of wgmma_layout.h) and a counter per
// (b, h, query tile), zero at the start, that orders the adds to it
struct HopperDq {
    float* accumulator;
    uint32_t* order;
};

template <class Tiles>
struct HopperForwardSmem {  // byte offsets from a 1024-byte boundary
    static constexpr uint32_t q_bytes = Tiles::query_rows * Tiles::HS * 2, kv_bytes = Tiles::key_tile * Tiles::HS * 2;
    static constexpr uint32_t q = 0, k = q + q_bytes, v = k + 2 * kv_bytes, barriers = v + 2 * kv_bytes;
    static constexpr size_t total = barriers + 9 * sizeof(uint64_t) + wgmma::kSwizzleBytes;  // + alignment
};
template <class Tiles>
struct HopperBackwardSmem {
    static constexpr int HS = Tiles::HS, BQ = Tiles::query_tile, BKV = Tiles::key_rows;
    static constexpr uint32_t kv_bytes = BKV * HS * 2, q_bytes = BQ * HS * 2, dq_bytes = BQ * HS * 4;
    static constexpr uint32_t k = 0, v = kv_bytes, q = 2 * kv_bytes, dout = q + 2 * q_bytes, ds = dout + 2 * q_bytes,
                              dq = ds + BKV * BQ * 2, stats = dq + 2 * dq_bytes, barriers = stats + 4 * BQ * 4;
    static constexpr size_t total = barriers + 9 * sizeof(uint64_t) + wgmma::kSwizzleBytes;
    // registers a thread after setmaxnreg (3 x 128 threads share 64K): the producer's dQ writers
    // need more than the forward's 24
    static constexpr int producer_registers = 40, consumer_registers = 232;
};

__device__ inline char* align_to_swizzle(char* p) {
    return p + ((wgmma::kSwizzleBytes - (sm90::smem_u32(p) & (wgmma::kSwizzleBytes - 1))) & (wgmma::kSwizzleBytes - 1));
}
// one arrival per warp on a barrier that counts warps
__device__ inline void warp_arrive(uint32_t bar) {
    if (threadIdx.x % kWarp == 0) sm90::mbarrier_arrive(bar);
}
// wait parity of tile `use` (0, 1, ...) through a two-stage ring, whose stage use % 2 it takes for
// the (use / 2)-th time: for the stage's "full" barrier; its "empty" barrier's is the other (the
// fresh barrier passes the first wait)
__device__ inline uint32_t full_parity(int use) { return (use >> 1) & 1; }
__device__ inline uint32_t empty_parity(int use) { return ((use >> 1) & 1) ^ 1; }

// accumulators 2j, 2j + 1 rounded to bf16 as register j of the next product's A operand
template <int N>
__device__ inline void accumulators_to_operand(uint32_t (&a)[N / 2], const float (&acc)[N]) {
#pragma unroll
    for (int j = 0; j < N / 2; j++) a[j] = pack_bf16(acc[2 * j], acc[2 * j + 1]);
}
// a consumer's 64 x N accumulators times a factor per row, as bf16, into a swizzled tile of
// `rows` rows at row row0 (staging for a bulk tensor store)
template <int N>
__device__ inline void store_accumulators(char* tile, int rows, int row0, const float (&acc)[N / 2], const float (&factor)[2],
                                          int tid) {
#pragma unroll
    for (int i = 0; i < N / 2; i += 2) {
        const float f = factor[(i >> 1) & 1];
        *reinterpret_cast<uint32_t*>(tile + wgmma::tile_offset(rows, row0 + wgmma::acc_row(tid, i), wgmma::acc_col(tid, i))) =
            pack_bf16(acc[i] * f, acc[i + 1] * f);
    }
}

// ----------------------------------------------------------------------------
// forward. grid (query blocks, attention_grid's heads); qkv_map: boxes of 64 columns and 128
// rows of qkv (B, T, 3C); out_map: boxes of 64 columns and 64 rows of out (B, T, C)

template <class Tiles>
__global__ void __launch_bounds__(kHopperThreads, 1)
    hopper_forward_kernel(const __grid_constant__ CUtensorMap qkv_map, const __grid_constant__ CUtensorMap out_map, FlashArgs args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace sm90;
    using L = HopperForwardSmem<Tiles>;
    constexpr int HS = Tiles::HS, BQ = Tiles::query_rows, BK = Tiles::key_tile, CB = HS / wgmma::kBlockCols;
    extern __shared__ char smem_raw[];
    char* smem = align_to_swizzle(smem_raw);
    // barriers: Q loaded; K loaded, K free, V loaded, V free by stage
    const uint32_t bars = smem_u32(smem + L::barriers), q_full = bars;
    auto k_full = [=](int s) { return bars + 8 * (1 + s); };
    auto k_empty = [=](int s) { return bars + 8 * (3 + s); };
    auto v_full = [=](int s) { return bars + 8 * (5 + s); };
    auto v_empty = [=](int s) { return bars + 8 * (7 + s); };
    int b, h;
    if (!head_of_block(args.NH, args.B, &b, &h)) return;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the longest (last) query blocks start first
    const int tiles = attn::key_tiles_seen(q0, BQ, args.T, BK);
    const int warpgroup = threadIdx.x / kConsumerThreads, tid = threadIdx.x % kConsumerThreads;
    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        for (int s = 0; s < 2; s++) {
            mbarrier_init(k_full(s), 1);
            mbarrier_init(v_full(s), 1);
            mbarrier_init(k_empty(s), 2 * kConsumerThreads / kWarp);
            mbarrier_init(v_empty(s), 2 * kConsumerThreads / kWarp);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {  // producer: one thread issues every load
        registers_release<24>();
        if (tid != 0) return;
        const int col = h * HS;
        mbarrier_expect_bytes(q_full, L::q_bytes);
        for (int cb = 0; cb < CB; cb++) tma_load_3d(smem + L::q + cb * BQ * 128, &qkv_map, col + cb * 64, q0, b, q_full);
        mbarrier_arrive(q_full);
        for (int j = 0; j < tiles; j++) {
            const int s = j & 1;
            mbarrier_wait(k_empty(s), empty_parity(j));
            mbarrier_expect_bytes(k_full(s), L::kv_bytes);
            for (int cb = 0; cb < CB; cb++)
                tma_load_3d(smem + L::k + s * L::kv_bytes + cb * BK * 128, &qkv_map, args.C + col + cb * 64, j * BK, b, k_full(s));
            mbarrier_arrive(k_full(s));
            mbarrier_wait(v_empty(s), empty_parity(j));
            mbarrier_expect_bytes(v_full(s), L::kv_bytes);
            for (int cb = 0; cb < CB; cb++)
                tma_load_3d(smem + L::v + s * L::kv_bytes + cb * BK * 128, &qkv_map, 2 * args.C + col + cb * 64, j * BK, b,
                            v_full(s));
            mbarrier_arrive(v_full(s));
        }
        return;
    }

    // consumer: rows [row0, row0 + 64) of the block
    registers_claim<240>();
    const int consumer = warpgroup - 1, row0 = consumer * 64, q_first = q0 + row0;
    const uint32_t q_addr = smem_u32(smem + L::q), k_addr = smem_u32(smem + L::k), v_addr = smem_u32(smem + L::v);
    const float scale_log2 = attn::scale_log2(HS);
    float s[BK / 2], o[HS / 2], m[2], l[2];
    uint32_t p[BK / 4];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < BK / 2; i++) s[i] = 0.0f;
#pragma unroll
    for (int half = 0; half < 2; half++) m[half] = -INFINITY, l[half] = 0.0f;

    auto issue_scores = [&](int stage) {  // S = Q K^T (its old values unread: no fence before)
        wgmma_fence();
        wgmma_product<BK, 0, 0, HS / 16>(
            s, [&](int kk) { return wgmma::k_major(q_addr, BQ, row0, 16 * kk); },
            [&](int kk) { return wgmma::k_major(k_addr + stage * L::kv_bytes, BK, 0, 16 * kk); });
        wgmma_commit();
    };
    auto issue_pv = [&](int stage) {  // O += P V
        fence_operands(o);
        fence_operands(p);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
            wgmma_rs<HS, 1>(o, p + 4 * kk, wgmma::mn_major(v_addr + stage * L::kv_bytes, BK, 16 * kk, 0));
        wgmma_commit();
    };
    // the online softmax of a tile's scores, in place (S -> unnormalised P, log2 units), as
    // flash_forward_kernel's; alpha: the factor the output so far is to be rescaled by
    auto softmax = [&](int k0, bool last_tile, float (&alpha)[2]) {
        const bool mask = last_tile && attn::tile_needs_mask(q_first, k0 + BK - 1);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int q = q_first + wgmma::acc_row(tid, 2 * half);
            float mx = m[half];
#pragma unroll
            for (int c = 0; c < BK / 8; c++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int i = 4 * c + 2 * half + e;
                    float x = s[i] * scale_log2;
                    if (mask && !attn::key_visible(q, k0 + wgmma::acc_col(tid, i))) x = -INFINITY;
                    s[i] = x;
                    mx = fmaxf(mx, x);
                }
            // the four threads of a quad hold the row's columns between them
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            alpha[half] = attn::rescale_factor(m[half], mx);
            m[half] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < BK / 8; c++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int i = 4 * c + 2 * half + e;
                    s[i] = attn::softmax_term(s[i], mx);
                    sum += s[i];
                }
            l[half] = l[half] * alpha[half] + sum;
        }
    };

    float alpha[2];
    mbarrier_wait(q_full, 0);
    mbarrier_wait(k_full(0), full_parity(0));
    issue_scores(0);
    wgmma_wait<0>();
    fence_operands(s);
    warp_arrive(k_empty(0));
    softmax(0, tiles == 1, alpha);  // alpha = 0: nothing summed yet
    accumulators_to_operand<BK / 2>(p, s);
    for (int j = 1; j < tiles; j++) {
        const int stage = j & 1, prev = stage ^ 1;
        mbarrier_wait(k_full(stage), full_parity(j));
        issue_scores(stage);
        mbarrier_wait(v_full(prev), full_parity(j - 1));
        issue_pv(prev);
        wgmma_wait<1>();  // S done; P V of the previous tile still running
        fence_operands(s);
        warp_arrive(k_empty(stage));
        softmax(j * BK, j == tiles - 1, alpha);
        wgmma_wait<0>();
        fence_operands(o);
        fence_operands(p);
        warp_arrive(v_empty(prev));
#pragma unroll
        for (int i = 0; i < HS / 2; i++) o[i] *= alpha[(i >> 1) & 1];
        accumulators_to_operand<BK / 2>(p, s);
    }
    const int last = (tiles - 1) & 1;
    mbarrier_wait(v_full(last), full_parity(tiles - 1));
    issue_pv(last);
    wgmma_wait<0>();
    fence_operands(o);
    warp_arrive(v_empty(last));

    float inv[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float sum = l[half];  // each thread summed its own columns
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        inv[half] = 1.0f / sum;
        const int q = q_first + wgmma::acc_row(tid, 2 * half);
        if (tid % 4 == 0 && q < args.T) args.lse[((size_t)b * args.NH + h) * args.T + q] = attn::log_sum_exp(m[half], sum);
    }
    // the consumer's own Q rows, read by its products only, stage its output for the bulk store
    store_accumulators<HS>(smem + L::q, BQ, row0, o, inv, tid);
    fence_async_shared();
    named_barrier(1 + consumer, kConsumerThreads);
    if (tid == 0) {
        for (int cb = 0; cb < CB; cb++) tma_store_3d(&out_map, h * HS + cb * 64, q_first, b, smem + L::q + (cb * BQ + row0) * 128);
        bulk_commit();
        bulk_wait_read();
    }
#else
    __trap();  // the host launches this only where the sm_90a image is present
#endif
}

// ----------------------------------------------------------------------------
// backward. grid (key blocks, attention_grid's heads), highest key block first (the order of
// dQ's adds); q_map and dout_map: boxes of 64 columns and query_tile rows of qkv and dout;
// kv_map: 64 x 128 of qkv; dqkv_map: 64 x 64 of dqkv (B, T, 3C)

template <class Tiles>
__global__ void __launch_bounds__(kHopperThreads, 1)
    hopper_backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                           const __grid_constant__ CUtensorMap dout_map, const __grid_constant__ CUtensorMap dqkv_map,
                           FlashArgs args, HopperDq dq) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace sm90;
    using L = HopperBackwardSmem<Tiles>;
    constexpr int HS = Tiles::HS, BQ = Tiles::query_tile, BKV = Tiles::key_rows, CB = HS / wgmma::kBlockCols;
    constexpr int kWriters = kConsumerThreads - kWarp;  // the producer's warps 1-3
    extern __shared__ char smem_raw[];
    char* smem = align_to_swizzle(smem_raw);
    float* stats = reinterpret_cast<float*>(smem + L::stats);  // stage s: lse (log2 units) at 2s, D at 2s + 1
    // barriers: K, V loaded; Q, dO, lse, D loaded and free by stage; dQ's part staged and free by buffer
    const uint32_t bars = smem_u32(smem + L::barriers), kv_full = bars;
    auto qdo_full = [=](int s) { return bars + 8 * (1 + s); };
    auto qdo_empty = [=](int s) { return bars + 8 * (3 + s); };
    auto dq_full = [=](int s) { return bars + 8 * (5 + s); };
    auto dq_empty = [=](int s) { return bars + 8 * (7 + s); };
    int b, h;
    if (!head_of_block(args.NH, args.B, &b, &h)) return;
    const int key_block = gridDim.x - 1 - blockIdx.x, k0 = key_block * BKV;
    const int first = attn::first_query_tile(k0, BQ), last = attn::query_tiles(args.T, BQ);
    const size_t bh = (size_t)b * args.NH + h;
    const int warpgroup = threadIdx.x / kConsumerThreads, tid = threadIdx.x % kConsumerThreads;
    if (threadIdx.x == 0) {
        mbarrier_init(kv_full, 1);
        for (int s = 0; s < 2; s++) {
            mbarrier_init(qdo_full(s), kWarp);  // the loading warp's lanes, after their lse and D
            mbarrier_init(qdo_empty(s), 2 * kConsumerThreads / kWarp);
            mbarrier_init(dq_full(s), (HS == 64 ? 1 : 2) * kConsumerThreads);  // the threads that write dQ's part last
            mbarrier_init(dq_empty(s), 1);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        registers_release<L::producer_registers>();
        if (tid < kWarp) {  // warp 0 loads: K and V once, then Q, dO, lse, D for each query tile
            const int col = h * HS;
            if (tid == 0) {
                mbarrier_expect_bytes(kv_full, 2 * L::kv_bytes);
                for (int cb = 0; cb < CB; cb++) {
                    tma_load_3d(smem + L::k + cb * BKV * 128, &kv_map, args.C + col + cb * 64, k0, b, kv_full);
                    tma_load_3d(smem + L::v + cb * BKV * 128, &kv_map, 2 * args.C + col + cb * 64, k0, b, kv_full);
                }
                mbarrier_arrive(kv_full);
            }
            for (int i = first, use = 0; i < last; i++, use++) {
                const int s = use & 1;
                mbarrier_wait(qdo_empty(s), empty_parity(use));
                if (tid == 0) {
                    mbarrier_expect_bytes(qdo_full(s), 2 * L::q_bytes);
                    for (int cb = 0; cb < CB; cb++) {
                        tma_load_3d(smem + L::q + s * L::q_bytes + cb * BQ * 128, &q_map, col + cb * 64, i * BQ, b, qdo_full(s));
                        tma_load_3d(smem + L::dout + s * L::q_bytes + cb * BQ * 128, &dout_map, col + cb * 64, i * BQ, b,
                                    qdo_full(s));
                    }
                }
                float* stats_stage = stats + 2 * s * BQ;
                for (int r = tid; r < BQ; r += kWarp) {
                    const int q = i * BQ + r;
                    stats_stage[r] = q < args.T ? args.lse[bh * args.T + q] * attn::kLog2e : INFINITY;  // P = 0 past T
                    stats_stage[BQ + r] = q < args.T ? args.delta[bh * args.T + q] : 0.0f;
                }
                mbarrier_arrive(qdo_full(s));
            }
            return;
        }
        // warps 1-3: dQ's parts into the accumulator, in order; key block 0 writes dQ
        const int writer = tid - kWarp;
        if (key_block > 0 && writer != 0) return;
        const int tiles = attn::query_tiles(args.T, BQ);
        const float scale = 1.0f / sqrtf((float)HS);
        for (int i = first, use = 0; i < last; i++, use++) {
            const int buf = use & 1, top = attn::dq_last_key_block(i, BQ, BKV);
            const float* part = reinterpret_cast<const float*>(smem + L::dq + buf * L::dq_bytes);
            float* accumulator = dq.accumulator + (bh * tiles + i) * (size_t)(BQ * HS);
            uint32_t* order = dq.order + bh * tiles + i;
            const uint32_t before = (uint32_t)attn::dq_adds_before(key_block, top);
            mbarrier_wait(dq_full(buf), full_parity(use));
            if (key_block == 0) {
                if (writer == 0)
                    while (load_acquire(order) != before) {
                    }
                named_barrier(4, kWriters);
#pragma unroll 1  // the writers have few registers (setmaxnreg above)
                for (int u = writer; u < BQ * HS / 4; u += kWriters) {  // 4 columns at a time
                    const int r = u / (HS / 4), c = (u % (HS / 4)) * 4, q = i * BQ + r, at = wgmma::dq_stage_index(HS, r, c);
                    float4 v = *reinterpret_cast<const float4*>(part + at);
                    if (top > 0) {  // the blocks above have stored or added theirs
                        const float4 w = __ldcg(reinterpret_cast<const float4*>(accumulator + at));
                        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
                    }
                    if (q < args.T)
                        *reinterpret_cast<uint2*>(args.dqkv + ((size_t)b * args.T + q) * 3 * args.C + h * HS + c) =
                            make_uint2(pack_bf16(v.x * scale, v.y * scale), pack_bf16(v.z * scale, v.w * scale));
                }
                named_barrier(4, kWriters);
                if (writer == 0) mbarrier_arrive(dq_empty(buf));
            } else {
                while (load_acquire(order) != before) {
                }
                fence_async_global();  // the adds above, seen through the counter, before this one
                if (before == 0) bulk_copy_to_global(accumulator, part, L::dq_bytes);
                else bulk_add_to_global(accumulator, part, L::dq_bytes);
                bulk_commit();
                bulk_wait_read();
                mbarrier_arrive(dq_empty(buf));
                bulk_wait_written();
                fence_async_global();
                add_release(order, 1);
            }
        }
        return;
    }

    // consumer: keys [k0 + key0, k0 + key0 + 64). dQ (64 queries x HS) is 64 x 64 products: at HS
    // 128 a consumer takes columns 64 cb.. over all 128 keys; at HS 64 each takes its own 64 keys,
    // and the two parts are summed in the staging buffer (consumer 0's, then 1's added)
    registers_claim<L::consumer_registers>();
    static_assert(BQ == 64, "dQ's products are 64 query rows");
    constexpr bool kSplitKeys = HS == 64;
    const int consumer = warpgroup - 1, key0 = consumer * 64, cb = kSplitKeys ? 0 : consumer;
    const int dq_keys0 = kSplitKeys ? key0 : 0;
    const uint32_t k_addr = smem_u32(smem + L::k), v_addr = smem_u32(smem + L::v), ds_addr = smem_u32(smem + L::ds);
    const float scale_log2 = attn::scale_log2(HS);
    float st[BQ / 2], dpt[BQ / 2], dk[HS / 2], dv[HS / 2], dqp[32];
    uint32_t pt[BQ / 4], dst[BQ / 4];
#pragma unroll
    for (int i = 0; i < HS / 2; i++) dk[i] = dv[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < BQ / 2; i++) st[i] = dpt[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) dqp[i] = 0.0f;

    mbarrier_wait(kv_full, 0);
    for (int i = first, use = 0; i < last; i++, use++) {
        const int s = use & 1, q0 = i * BQ;
        const uint32_t q_addr = smem_u32(smem + L::q + s * L::q_bytes), do_addr = smem_u32(smem + L::dout + s * L::q_bytes);
        const float* stats_stage = stats + 2 * s * BQ;
        const float* delta = stats_stage + BQ;
        mbarrier_wait(qdo_full(s), full_parity(use));
        wgmma_fence();
        auto queries = [&](uint32_t tile) { return [=](int kk) { return wgmma::k_major(tile, BQ, 0, 16 * kk); }; };
        auto own_keys = [&](uint32_t tile) { return [=](int kk) { return wgmma::k_major(tile, BKV, key0, 16 * kk); }; };
        wgmma_product<BQ, 0, 0, HS / 16>(st, own_keys(k_addr), queries(q_addr));     // S^T = K Q^T
        wgmma_product<BQ, 0, 0, HS / 16>(dpt, own_keys(v_addr), queries(do_addr));  // dP^T = V dO^T
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(st);
        fence_operands(dpt);

        // P^T and dS^T / scale, as flash_backward_kv_kernel's, rounded to bf16 as A operands.
        // Accumulator i sits acc_row(tid, i) - acc_row(tid, 0) rows and acc_col(tid, i) -
        // acc_col(tid, 0) columns from the thread's first: offsets known at compile time.
        const bool mask = attn::tile_needs_mask(q0, k0 + key0 + 63);
        const int key_first = k0 + key0 + wgmma::acc_row(tid, 0), col_first = wgmma::acc_col(tid, 0);
        const float* lse_first = stats_stage + col_first;
        const float* delta_first = delta + col_first;
#pragma unroll
        for (int j = 0; j < BQ / 4; j++) {
            const int dr = wgmma::acc_row(0, 2 * j), dc = wgmma::acc_col(0, 2 * j);
            const float2 l2 = *reinterpret_cast<const float2*>(lse_first + dc), d2 = *reinterpret_cast<const float2*>(delta_first + dc);
            float p0 = attn::prob_from_lse(st[2 * j] * scale_log2, l2.x), p1 = attn::prob_from_lse(st[2 * j + 1] * scale_log2, l2.y);
            if (mask && !attn::key_visible(q0 + col_first + dc, key_first + dr)) p0 = 0.0f;
            if (mask && !attn::key_visible(q0 + col_first + dc + 1, key_first + dr)) p1 = 0.0f;
            pt[j] = pack_bf16(p0, p1);
            dst[j] = pack_bf16(attn::softmax_grad(p0, dpt[2 * j], d2.x), attn::softmax_grad(p1, dpt[2 * j + 1], d2.y));
        }

        // dS^T to shared memory for dQ, once both consumers' dQ products of the last tile are done
        // with it: a 16 x 16 block a warp at a time
        named_barrier(3, 2 * kConsumerThreads);
        const int lane = tid % kWarp, st_row = key0 + (tid / kWarp) * 16 + wgmma::stmatrix_row(lane);
#pragma unroll
        for (int m = 0; m < BQ / 16; m++)
            stmatrix_x4(ds_addr + wgmma::tile_offset(BKV, st_row, 16 * m + wgmma::stmatrix_col(lane)), dst[4 * m], dst[4 * m + 1],
                        dst[4 * m + 2], dst[4 * m + 3]);
        fence_async_shared();

        fence_operands(dv);
        fence_operands(dk);
        fence_operands(pt);
        fence_operands(dst);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++)  // dV += P^T dO
            wgmma_rs<HS, 1>(dv, pt + 4 * kk, wgmma::mn_major(do_addr, BQ, 16 * kk, 0));
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++)  // dK += dS^T Q
            wgmma_rs<HS, 1>(dk, dst + 4 * kk, wgmma::mn_major(q_addr, BQ, 16 * kk, 0));
        wgmma_commit();

        named_barrier(3, 2 * kConsumerThreads);  // all of dS^T written
        wgmma_fence();
        wgmma_product<64, 1, 1, (kSplitKeys ? 64 : BKV) / 16>(  // this consumer's 64 x 64 of dQ = dS K
            dqp, [&](int kk) { return wgmma::mn_major(ds_addr, BKV, dq_keys0 + 16 * kk, 0); },
            [&](int kk) { return wgmma::mn_major(k_addr, BKV, dq_keys0 + 16 * kk, 64 * cb); });
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(dqp);
        fence_operands(dv);
        fence_operands(dk);
        fence_operands(pt);
        fence_operands(dst);
        warp_arrive(qdo_empty(s));

        // dQ's part to the staging buffer for the producer's writers
        const int buf = use & 1;
        float* parts = reinterpret_cast<float*>(smem + L::dq);
        const int first_in_buf = buf * BQ * HS + wgmma::dq_stage_index(HS, wgmma::acc_row(tid, 0), 64 * cb + wgmma::acc_col(tid, 0));
        mbarrier_wait(dq_empty(buf), empty_parity(use));
        if (kSplitKeys && consumer == 1) named_barrier(3, 2 * kConsumerThreads);  // consumer 0's part is in
#pragma unroll
        for (int k = 0; k < 32; k += 2) {
            float2* at = reinterpret_cast<float2*>(parts + wgmma::dq_stage_of(first_in_buf, HS, k));
            if (kSplitKeys && consumer == 1) *at = make_float2(at->x + dqp[k], at->y + dqp[k + 1]);
            else *at = make_float2(dqp[k], dqp[k + 1]);
        }
        if (kSplitKeys && consumer == 0) named_barrier(3, 2 * kConsumerThreads);
        fence_async_shared();
        if (!kSplitKeys || consumer == 1) mbarrier_arrive(dq_full(buf));
    }

    // dK (times the scale) and dV through the consumer's own K and V rows, once neither
    // consumer's dQ products read K any more (the thread's place computed anew: registers)
    named_barrier(3, 2 * kConsumerThreads);
    const int thread = thread_index_reread(), own = thread / kConsumerThreads - 1, own_key0 = own * 64;
    const float scale = 1.0f / sqrtf((float)HS), scaled[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
    store_accumulators<HS>(smem + L::k, BKV, own_key0, dk, scaled, thread % kConsumerThreads);
    store_accumulators<HS>(smem + L::v, BKV, own_key0, dv, one, thread % kConsumerThreads);
    fence_async_shared();
    named_barrier(1 + own, kConsumerThreads);
    if (thread % kConsumerThreads == 0) {
        for (int c = 0; c < CB; c++) {
            const int at = (c * BKV + own_key0) * 128;
            tma_store_3d(&dqkv_map, args.C + h * HS + c * 64, k0 + own_key0, b, smem + L::k + at);
            tma_store_3d(&dqkv_map, 2 * args.C + h * HS + c * 64, k0 + own_key0, b, smem + L::v + at);
        }
        bulk_commit();
        bulk_wait_read();
    }
#else
    __trap();
#endif
}

// ----------------------------------------------------------------------------
// host: tensor maps, the choice of kernels, launchers

using TensorMapEncoder = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                      const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                      CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// the driver's cuTensorMapEncodeTiled, looked up once per process (the trainer links no libcuda)
inline TensorMapEncoder tensor_map_encoder() {
    static const TensorMapEncoder encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || fn == nullptr)
            fatal(1, "attention: the CUDA driver has no cuTensorMapEncodeTiled, which the sm_90a kernels need");
        return reinterpret_cast<TensorMapEncoder>(fn);
    }();
    return encode;
}
// a (B, T, width) bf16 tensor in boxes of 64 columns by `rows` rows, 128-byte swizzled (what
// wgmma_layout.h's tile_offset describes); rows past T load as zeros and are not stored
inline CUtensorMap tensor_map(const floatX* base, int width, int T, int B, int rows) {
    CUtensorMap map;
    const cuuint64_t dims[3] = {(cuuint64_t)width, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[2] = {(cuuint64_t)width * sizeof(floatX), (cuuint64_t)width * T * sizeof(floatX)};
    const cuuint32_t box[3] = {(cuuint32_t)wgmma::kBlockCols, (cuuint32_t)rows, 1}, unit[3] = {1, 1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<floatX*>(base), dims, strides, box,
                                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        fatal(1, "attention: cuTensorMapEncodeTiled failed (error %d) for a (%d, %d, %d) tensor in boxes of %d rows", (int)r, B, T,
              width, rows);
    return map;
}

// This GPU is an sm_90 one and this binary holds the sm_90a kernels for it (not the sm_80 image
// in their place): asked once per process, the device does not change.
inline bool hopper_attention_present_cached() {
    static const bool present = [] {
        int major = 0, minor = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx().device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx().device));
        cudaFuncAttributes attr;
        CUDA_CHECK(cudaFuncGetAttributes(&attr, hopper_forward_kernel<attn::HopperTiles<64>::Forward>));
        return major == 9 && minor == 0 && attr.binaryVersion == 90;
    }();
    return present;
}
inline bool hopper_head_size(int hs) { return hs == 64 || hs == 128; }
// the Hopper kernels take these inputs: their head size, 16-byte aligned rows and pointers (the
// bulk copies'), on a GPU that runs them
inline bool hopper_attention_takes(const FlashArgs& args) {
    return hopper_head_size(args.hs) && args.vec && hopper_attention_present_cached();
}

template <class Kernel>
inline void prepare_hopper_kernel(Kernel kernel, size_t smem, int hs, const char* what) {
    if (smem > ctx().max_smem_optin)
        fatal(1, "attention %s (sm_90a): head size %d needs %zu bytes of shared memory a block, the GPU has %zu", what, hs, smem,
              ctx().max_smem_optin);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

template <int HS>
inline void hopper_attention_forward_hs(const FlashArgs& args) {
    using F = typename attn::HopperTiles<HS>::Forward;
    const CUtensorMap qkv_map = tensor_map(args.qkv, 3 * args.C, args.T, args.B, F::query_rows), out_map = tensor_map(args.out, args.C, args.T, args.B, 64);
    constexpr size_t smem = HopperForwardSmem<F>::total;
    prepare_hopper_kernel(hopper_forward_kernel<F>, smem, HS, "forward");
    hopper_forward_kernel<F><<<attention_grid(ceil_div(args.T, F::query_rows), args.B, args.NH), kHopperThreads, smem, stream()>>>(
        qkv_map, out_map, args);
    check_launch();
}
inline void hopper_attention_forward(const FlashArgs& args) {
    if (args.hs == 64) hopper_attention_forward_hs<64>(args);
    else hopper_attention_forward_hs<128>(args);
}

// dQ's accumulator and counters, by the backward's query tile
inline int hopper_query_tile(int hs) { return hs == 64 ? attn::HopperTiles<64>::Backward::query_tile : attn::HopperTiles<128>::Backward::query_tile; }
inline size_t hopper_dq_counters(int B, int T, int NH, int hs) { return (size_t)B * NH * ceil_div(T, hopper_query_tile(hs)); }
inline size_t hopper_dq_accumulator_floats(int B, int T, int NH, int hs) {
    return hopper_dq_counters(B, T, NH, hs) * hopper_query_tile(hs) * hs;
}

// dq.order must hold zeros (attention_backward_delta clears it)
template <int HS>
inline void hopper_attention_backward_hs(const FlashArgs& args, const HopperDq& dq) {
    using Bw = typename attn::HopperTiles<HS>::Backward;
    const CUtensorMap q_map = tensor_map(args.qkv, 3 * args.C, args.T, args.B, Bw::query_tile);
    const CUtensorMap kv_map = tensor_map(args.qkv, 3 * args.C, args.T, args.B, Bw::key_rows);
    const CUtensorMap dout_map = tensor_map(args.dout, args.C, args.T, args.B, Bw::query_tile);
    const CUtensorMap dqkv_map = tensor_map(args.dqkv, 3 * args.C, args.T, args.B, 64);
    constexpr size_t smem = HopperBackwardSmem<Bw>::total;
    prepare_hopper_kernel(hopper_backward_kernel<Bw>, smem, HS, "backward");
    hopper_backward_kernel<Bw><<<attention_grid(ceil_div(args.T, Bw::key_rows), args.B, args.NH), kHopperThreads, smem, stream()>>>(
        q_map, kv_map, dout_map, dqkv_map, args, dq);
    check_launch();
}
inline void hopper_attention_backward(const FlashArgs& args, const HopperDq& dq) {
    if (args.hs == 64) hopper_attention_backward_hs<64>(args, dq);
    else hopper_attention_backward_hs<128>(args, dq);
}

}  // namespace gpu
