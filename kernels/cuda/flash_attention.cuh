// Causal attention on tensor cores, in the manner of FlashAttention-2 (bf16 build). Each warp owns
// 16 rows of a product (query rows in forward and dQ, key rows in dK/dV) and computes them with
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix; the other side streams through
// shared memory a tile at a time, two stages deep (cp.async fills the next tile while the warps
// compute on this one). Scores and probabilities never leave registers: a product's fp32
// accumulators are rounded to bf16 in place and become the next product's A operand
// (mma.cuh says why that works). Tiles above the causal diagonal are skipped per warp; the
// schedule, the mask and the softmax's arithmetic are kernels/attention_tiles.h's, which a host
// test replays against the CPU attention.
//
// Forward keeps an online softmax per row (running max and sum, output rescaled when the max
// grows) and saves only the log-sum-exp. Backward is deterministic: no atomics, every sum in a
// fixed order. One kernel owns key rows and sums dK, dV over the queries after them; a second
// owns query rows and sums dQ over the keys before them, recomputing the scores. FlashAttention-2
// instead adds dQ from the first kernel with float atomics (in a different order every run):
// that saves the second kernel's two score products (Q K^T, dO V^T), a third of its work.
//
// Design occupancy (H100/H200: 64K registers, 228 KiB shared memory, 4 schedulers per SM), at
// hs = 64 with the shapes in attention_tiles.h (registers from ptxas -v, sm_90):
//   forward      4 warps, 128 query rows, keys 64 a tile:  248 registers, 54 KiB -> 2 blocks, 8 warps/SM
//   backward dKV 8 warps, 128 key rows, queries 64 a tile: 174 registers, 73 KiB -> 1 block, 8 warps/SM
//   backward dQ  4 warps,  64 query rows, keys 64 a tile:  148 registers, 54 KiB -> 3 blocks, 12 warps/SM
// Registers bind first: a warp's accumulators and one tile of scores must stay in registers (no
// spills: `make test` checks ptxas's report for sm_80 and sm_90), which leaves room for 8 to 12
// warps an SM; two warps per scheduler hide ldmatrix and exp2 latency behind the other's mma.
// Rows of 32 a warp (forward) instead of 16 let each K and V fragment loaded from shared memory
// serve two products, halving the shared-memory reads per mma. Each shape is the fastest of those
// scripts/bench_attention --sweep times that keep every register; a faster dK/dV shape (4 warps,
// query tiles of 128) needs all 255 registers on sm_90 and spills on sm_80 (docs/gpu_runs.md).
#pragma once
#include "../attention_tiles.h"
#include "attention_heads.cuh"
#include "common.cuh"
#include "mma.cuh"

#include <type_traits>

namespace gpu {

// everything the three kernels read and write
struct FlashArgs {
    const floatX* qkv;   // (B, T, 3C): q | k | v
    floatX* out;         // (B, T, C): forward output
    float* lse;          // (B, NH, T): forward's log-sum-exp, natural units
    const floatX* dout;  // (B, T, C)
    const float* delta;  // (B, NH, T): rowsum(dout . out)
    floatX* dqkv;        // (B, T, 3C)
    int B, T, C, NH, hs;
    bool vec;  // 16-byte global access: hs and C multiples of 8, every pointer 16-byte aligned
};

// Shared-memory rows are the padded head size plus 16 bytes: the 8 rows one ldmatrix reads then
// start in 8 different 16-byte bank groups instead of all in the same one.
template <int HS>
constexpr int kSmemLd = HS + 8;

// rows [r0, r0 + ROWS) of a (T x stride) matrix, hs columns, into shared [ROWS][HS + 8], zeros
// past T and past hs. With vec the copy is asynchronous (cp.async; the caller commits and waits).
template <int HS, int ROWS, int THREADS>
__device__ inline void load_tile(floatX* dst, const floatX* src, size_t stride, int r0, int T, int hs, bool vec) {
    constexpr int kChunks = HS / 8;  // 16-byte chunks a row
    for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
        const int r = i / kChunks, c = (i % kChunks) * 8, row = r0 + r;
        floatX* d = dst + r * kSmemLd<HS> + c;
        const floatX* s = src + (size_t)row * stride + c;
        if (vec) {
            if (row < T && c < hs) cp_async_16(d, s);
            else *reinterpret_cast<int4*>(d) = make_int4(0, 0, 0, 0);
        } else {
            for (int k = 0; k < 8; k++) d[k] = (row < T && c + k < hs) ? s[k] : (floatX)0.0f;
        }
    }
}

// Shared-memory addresses that one lane hands to ldmatrix_x4 (mma.cuh), for a tile with rows of
// kSmemLd<HS> elements:
//  A operand, 16 x 16 at (row r0, col c0) of a row-major tile
template <int HS>
__device__ inline const floatX* a_operand(const floatX* tile, int r0, int c0, int lane) {
    return tile + (r0 + (lane & 15)) * kSmemLd<HS> + c0 + (lane >> 4) * 8;
}
//  B operands of two n-tiles (n0, n0 + 8) over k [k0, k0 + 16), the tile stored [n][k] (rows are
//  n: K rows in Q K^T); registers 0,1 serve n-tile n0, 2,3 n-tile n0 + 8
template <int HS>
__device__ inline const floatX* b_operand_nk(const floatX* tile, int n0, int k0, int lane) {
    return tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * kSmemLd<HS> + k0 + ((lane >> 3) & 1) * 8;
}
//  the same, the tile stored [k][n] (rows are k: V rows in P V), for ldmatrix_x4_trans
template <int HS>
__device__ inline const floatX* b_operand_kn(const floatX* tile, int k0, int n0, int lane) {
    return tile + (k0 + (lane & 15)) * kSmemLd<HS> + n0 + (lane >> 4) * 8;
}

// left += a b[0..1], right += a b[2..3]: the two n-tiles (8 columns each) that one ldmatrix_x4
// of B operands holds
__device__ inline void mma_two_n_tiles(float (&left)[4], float (&right)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[4]) {
    mma_bf16_16816(left, a, b[0], b[1]);
    mma_bf16_16816(right, a, b[2], b[3]);
}

// acc[.][n-tiles] += A (16 x HS a row tile) times the transpose of `tile`'s first N rows ([N][HS]):
// scores of a warp's rows against a tile's rows, 16 columns at a time. rows(mt, kc, a) gives the
// A operand of row tile mt, columns [16 kc, 16 kc + 16): from registers, or from shared memory.
template <int HS, int ROW_TILES, int N, class Rows>
__device__ inline void mma_rows_times_tile_t(float (&acc)[ROW_TILES][N / 8][4], const Rows& rows,
                                             const floatX* tile, int lane) {
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++) {
        uint32_t a[ROW_TILES][4];
#pragma unroll
        for (int mt = 0; mt < ROW_TILES; mt++) rows(mt, kc, a[mt]);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t b[4];
            ldmatrix_x4(b, b_operand_nk<HS>(tile, np * 16, kc * 16, lane));
#pragma unroll
            for (int mt = 0; mt < ROW_TILES; mt++) mma_two_n_tiles(acc[mt][2 * np], acc[mt][2 * np + 1], a[mt], b);
        }
    }
}
// the A operands of a warp, kept in registers
template <int HS, int ROW_TILES>
struct RegisterRows {
    uint32_t frag[ROW_TILES][HS / 16][4];
    // rows [r0, r0 + 16 ROW_TILES) of a shared tile
    __device__ void load(const floatX* tile, int r0, int lane) {
#pragma unroll
        for (int mt = 0; mt < ROW_TILES; mt++)
#pragma unroll
            for (int kc = 0; kc < HS / 16; kc++) ldmatrix_x4(frag[mt][kc], a_operand<HS>(tile, r0 + mt * 16, kc * 16, lane));
    }
    __device__ void operator()(int mt, int kc, uint32_t (&a)[4]) const {
#pragma unroll
        for (int e = 0; e < 4; e++) a[e] = frag[mt][kc][e];
    }
};
// the A operands of a warp, reread from shared memory at every use (where registers are short)
template <int HS>
struct SharedRows {
    const floatX* tile;
    int r0, lane;
    __device__ void operator()(int mt, int kc, uint32_t (&a)[4]) const {
        ldmatrix_x4(a, a_operand<HS>(tile, r0 + mt * 16, kc * 16, lane));
    }
};

// acc[.][HS/8] += P (registers, 16 x K per row tile, as accumulators) times `tile` ([K][HS]):
// P rounded to bf16 on the way, as tensor cores take it
template <int HS, int ROW_TILES, int K>
__device__ inline void mma_p_times_tile(float (&acc)[ROW_TILES][HS / 8][4], const float (&p)[ROW_TILES][K / 8][4],
                                        const floatX* tile, int lane) {
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) {
        uint32_t a[ROW_TILES][4];
#pragma unroll
        for (int mt = 0; mt < ROW_TILES; mt++) accumulators_to_a(a[mt], p[mt][2 * kc], p[mt][2 * kc + 1]);
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, b_operand_kn<HS>(tile, kc * 16, dp * 16, lane));
#pragma unroll
            for (int mt = 0; mt < ROW_TILES; mt++) mma_two_n_tiles(acc[mt][2 * dp], acc[mt][2 * dp + 1], a[mt], b);
        }
    }
}

template <int N, int M>
__device__ inline void zero(float (&acc)[N][M][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < M; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
}

// A warp's accumulators (16 * ROW_TILES rows, HS columns) times a factor per row, rounded to
// floatX, into global rows [row0, ...) of dst (stride elements apart): through the warp's own
// shared rows `stage`, so that global stores are 16 bytes wide. Rows past T, columns past hs are
// left alone.
template <int HS, int ROW_TILES>
__device__ inline void store_rows(floatX* dst, size_t stride, int row0, int T, int hs, bool vec, floatX* stage,
                                  const float (&acc)[ROW_TILES][HS / 8][4], const float (&factor)[ROW_TILES][2],
                                  int lane) {
    constexpr int LD = kSmemLd<HS>, kChunks = HS / 8;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < ROW_TILES; mt++)
#pragma unroll
        for (int nt = 0; nt < HS / 8; nt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const float f = factor[mt][half];
                *reinterpret_cast<uint32_t*>(stage + (mt * 16 + g + 8 * half) * LD + nt * 8 + 2 * t) =
                    pack_bf16(acc[mt][nt][2 * half] * f, acc[mt][nt][2 * half + 1] * f);
            }
    __syncwarp();
    for (int i = lane; i < 16 * ROW_TILES * kChunks; i += kWarp) {
        const int r = i / kChunks, c = (i % kChunks) * 8, row = row0 + r;
        if (row >= T || c >= hs) continue;
        floatX* d = dst + (size_t)row * stride + c;
        const floatX* s = stage + r * LD + c;
        if (vec) *reinterpret_cast<int4*>(d) = *reinterpret_cast<const int4*>(s);
        else
            for (int k = 0; k < 8 && c + k < hs; k++) d[k] = s[k];
    }
}

// The side a kernel streams (K and V, or Q, dO, lse and D) goes through shared memory a tile at
// a time, two stages deep: while the block computes on tile i in stage i & 1, cp.async fills
// tile i + 1 into the other stage. load(tile, stage) issues one tile's copies. A kernel calls
// stream_first_tile before its loop over the tiles, prefetch_next_await_tile first in each
// iteration and __syncthreads() last, so that no warp still reads the stage tile i + 2 fills.
//
// the first tile's copies, in one group with those the caller issued before (the block's own rows)
template <class Load>
__device__ inline void stream_first_tile(int first, const Load& load) {
    load(first, first & 1);
    cp_async_commit();
}
// starts tile i + 1 (the other stage was last read before the previous iteration's barrier), then
// waits until the whole block sees tile i
template <class Load>
__device__ inline void prefetch_next_await_tile(int i, int last, const Load& load) {
    if (i + 1 < last) {
        load(i + 1, (i + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// K and V rows [tile * ROWS, tile * ROWS + ROWS) of the block's head into stage `stage` of
// kv_smem: K at 2 stage, V at 2 stage + 1 (ROWS rows each). q_base: the head's first q element.
template <int HS, int ROWS, int THREADS>
__device__ inline void load_kv_tile(floatX* kv_smem, int tile, int stage, const floatX* q_base, const FlashArgs& args) {
    constexpr int LD = kSmemLd<HS>;
    const size_t C3 = (size_t)3 * args.C;
    floatX* k_dst = kv_smem + 2 * stage * ROWS * LD;
    load_tile<HS, ROWS, THREADS>(k_dst, q_base + args.C, C3, tile * ROWS, args.T, args.hs, args.vec);
    load_tile<HS, ROWS, THREADS>(k_dst + ROWS * LD, q_base + 2 * args.C, C3, tile * ROWS, args.T, args.hs, args.vec);
}

// ----------------------------------------------------------------------------
// forward. grid (query blocks, attention_grid's heads)

template <class Tiles>
constexpr size_t flash_forward_smem() {  // Q | 2 stages of K, V
    return (size_t)(Tiles::query_rows + 4 * Tiles::key_tile) * kSmemLd<Tiles::HS> * sizeof(floatX);
}

template <class Tiles>
__global__ void __launch_bounds__(Tiles::warps * kWarp) flash_forward_kernel(FlashArgs args) {
    constexpr int HS = Tiles::HS, LD = kSmemLd<HS>, MT = Tiles::row_tiles, BK = Tiles::key_tile;
    constexpr int BQ = Tiles::query_rows, THREADS = Tiles::warps * kWarp;
    extern __shared__ __align__(128) char smem_raw[];
    floatX* q_smem = reinterpret_cast<floatX*>(smem_raw);
    floatX* kv_smem = q_smem + BQ * LD;  // stage s: K at 2s, V at 2s + 1 (BK rows each)
    int b, h;
    if (!head_of_block(args.NH, args.B, &b, &h)) return;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the longest (last) query blocks start first
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
    const int warp_row = warp * Tiles::rows_per_warp, warp_q0 = q0 + warp_row;
    const int warp_q_last = warp_q0 + Tiles::rows_per_warp - 1;
    const size_t C3 = (size_t)3 * args.C;
    const floatX* q_base = args.qkv + (size_t)b * args.T * C3 + h * args.hs;
    const float scale_log2 = attn::scale_log2(args.hs);
    const int tiles = attn::key_tiles_seen(q0, BQ, args.T, BK);

    auto load_kv = [&](int tile, int stage) { load_kv_tile<HS, BK, THREADS>(kv_smem, tile, stage, q_base, args); };
    load_tile<HS, BQ, THREADS>(q_smem, q_base, C3, q0, args.T, args.hs, args.vec);
    stream_first_tile(0, load_kv);

    RegisterRows<HS, MT> q_rows;
    float o[MT][HS / 8][4], m[MT][2], l[MT][2];
    zero(o);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) m[mt][half] = -INFINITY, l[mt][half] = 0.0f;

    for (int j = 0; j < tiles; j++) {
        prefetch_next_await_tile(j, tiles, load_kv);
        if (j == 0) q_rows.load(q_smem, warp_row, lane);
        const int k0 = j * BK;
        const floatX* k_tile = kv_smem + 2 * (j & 1) * BK * LD;
        if (!attn::tile_all_masked(warp_q_last, k0)) {
            float s[MT][BK / 8][4];
            zero(s);
            mma_rows_times_tile_t<HS, MT, BK>(s, q_rows, k_tile, lane);  // S = Q K^T
            const bool mask = attn::tile_needs_mask(warp_q0, k0 + BK - 1);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int q = warp_q0 + mt * 16 + g + 8 * half;
                    float mx = m[mt][half];
#pragma unroll
                    for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float x = s[mt][nt][2 * half + e] * scale_log2;
                            if (mask && !attn::key_visible(q, k0 + nt * 8 + 2 * t + e)) x = -INFINITY;
                            s[mt][nt][2 * half + e] = x;
                            mx = fmaxf(mx, x);
                        }
                    // the four lanes of a quad hold the row's columns between them
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float alpha = attn::rescale_factor(m[mt][half], mx);
                    m[mt][half] = mx;
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float p = attn::softmax_term(s[mt][nt][2 * half + e], mx);
                            s[mt][nt][2 * half + e] = p;
                            sum += p;
                        }
                    l[mt][half] = l[mt][half] * alpha + sum;
#pragma unroll
                    for (int nt = 0; nt < HS / 8; nt++) {
                        o[mt][nt][2 * half] *= alpha;
                        o[mt][nt][2 * half + 1] *= alpha;
                    }
                }
            mma_p_times_tile<HS, MT, BK>(o, s, k_tile + BK * LD, lane);  // O += P V
        }
        __syncthreads();  // no warp still reads the stage tile j + 2 fills
    }

    float inv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float sum = l[mt][half];  // each lane summed its own columns
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            inv[mt][half] = 1.0f / sum;
            const int q = warp_q0 + mt * 16 + g + 8 * half;
            if (t == 0 && q < args.T)
                args.lse[((size_t)b * args.NH + h) * args.T + q] = attn::log_sum_exp(m[mt][half], sum);
        }
    // the warp's own Q rows, read once into q_rows, stage its output
    store_rows<HS, MT>(args.out + (size_t)b * args.T * args.C + h * args.hs, args.C, warp_q0, args.T, args.hs, args.vec,
                       q_smem + warp_row * LD, o, inv, lane);
}

// ----------------------------------------------------------------------------
// backward, dK and dV. grid (key blocks, attention_grid's heads). Each warp computes the
// transposed products, S^T = K Q^T and dP^T = V dO^T (its 16 keys against a tile of queries), so
// that P^T and dS^T come out as A operands of dV += P^T dO and dK += dS^T Q.

template <class Tiles>
constexpr size_t flash_backward_kv_smem() {  // K | V | 2 stages of Q, dO | 2 stages of lse, D
    return (size_t)(2 * Tiles::key_rows + 4 * Tiles::query_tile) * kSmemLd<Tiles::HS> * sizeof(floatX) +
           (size_t)4 * Tiles::query_tile * sizeof(float);
}

template <class Tiles>
__global__ void __launch_bounds__(Tiles::warps * kWarp) flash_backward_kv_kernel(FlashArgs args) {
    constexpr int HS = Tiles::HS, LD = kSmemLd<HS>, BQ = Tiles::query_tile, BKV = Tiles::key_rows;
    constexpr int THREADS = Tiles::warps * kWarp;
    extern __shared__ __align__(128) char smem_raw[];
    floatX* k_smem = reinterpret_cast<floatX*>(smem_raw);
    floatX* v_smem = k_smem + BKV * LD;
    floatX* qdo_smem = v_smem + BKV * LD;  // stage s: Q at 2s, dO at 2s + 1 (BQ rows each)
    float* stats_smem = reinterpret_cast<float*>(qdo_smem + 4 * BQ * LD);  // stage s: lse at 2s, D at 2s + 1
    int b, h;
    if (!head_of_block(args.NH, args.B, &b, &h)) return;
    const int k0 = blockIdx.x * BKV;  // low key blocks see the most queries: they start first
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
    const int warp_row = warp * Tiles::keys_per_warp, warp_k0 = k0 + warp_row;
    const size_t C3 = (size_t)3 * args.C, bh = ((size_t)b * args.NH + h) * args.T;
    const floatX* q_base = args.qkv + (size_t)b * args.T * C3 + h * args.hs;
    const floatX* do_base = args.dout + (size_t)b * args.T * args.C + h * args.hs;
    const float scale_log2 = attn::scale_log2(args.hs);
    const int first = attn::first_query_tile(k0, BQ), last = attn::query_tiles(args.T, BQ);

    auto load_queries = [&](int tile, int stage) {
        floatX* q_dst = qdo_smem + 2 * stage * BQ * LD;
        load_tile<HS, BQ, THREADS>(q_dst, q_base, C3, tile * BQ, args.T, args.hs, args.vec);
        load_tile<HS, BQ, THREADS>(q_dst + BQ * LD, do_base, args.C, tile * BQ, args.T, args.hs, args.vec);
        float* stats = stats_smem + 2 * stage * BQ;
        for (int i = threadIdx.x; i < BQ; i += THREADS) {
            const int q = tile * BQ + i;
            stats[i] = q < args.T ? args.lse[bh + q] * attn::kLog2e : INFINITY;  // P = 0 past T
            stats[BQ + i] = q < args.T ? args.delta[bh + q] : 0.0f;
        }
    };
    load_tile<HS, BKV, THREADS>(k_smem, q_base + args.C, C3, k0, args.T, args.hs, args.vec);
    load_tile<HS, BKV, THREADS>(v_smem, q_base + 2 * args.C, C3, k0, args.T, args.hs, args.vec);
    stream_first_tile(first, load_queries);

    // K and V rows of this warp as A operands: kept in registers, or reread from shared memory at
    // every tile where registers are short (kernels/attention_tiles.h)
    using KVRows = typename std::conditional<Tiles::kv_in_registers, RegisterRows<HS, 1>, SharedRows<HS>>::type;
    KVRows k_rows{}, v_rows{};
    if constexpr (!Tiles::kv_in_registers) {
        k_rows = SharedRows<HS>{k_smem, warp_row, lane};
        v_rows = SharedRows<HS>{v_smem, warp_row, lane};
    }
    float dk[1][HS / 8][4], dv[1][HS / 8][4];
    zero(dk);
    zero(dv);

    for (int i = first; i < last; i++) {
        prefetch_next_await_tile(i, last, load_queries);
        const int stage = i & 1;
        if constexpr (Tiles::kv_in_registers) {
            if (i == first) {
                k_rows.load(k_smem, warp_row, lane);
                v_rows.load(v_smem, warp_row, lane);
            }
        }
        const int q0 = i * BQ;
        const floatX* q_tile = qdo_smem + 2 * stage * BQ * LD;
        const floatX* do_tile = q_tile + BQ * LD;
        const float* lse_log2 = stats_smem + 2 * stage * BQ;
        const float* delta = lse_log2 + BQ;
        if (!attn::tile_all_masked(q0 + BQ - 1, warp_k0)) {
            float st[1][BQ / 8][4], dpt[1][BQ / 8][4];
            zero(st);
            zero(dpt);
            mma_rows_times_tile_t<HS, 1, BQ>(st, k_rows, q_tile, lane);   // S^T = K Q^T
            mma_rows_times_tile_t<HS, 1, BQ>(dpt, v_rows, do_tile, lane);  // dP^T = V dO^T
            const bool mask = attn::tile_needs_mask(q0, warp_k0 + Tiles::keys_per_warp - 1);
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = warp_k0 + g + 8 * (e >> 1), col = nt * 8 + 2 * t + (e & 1);
                    float p = attn::prob_from_lse(st[0][nt][e] * scale_log2, lse_log2[col]);
                    if (mask && !attn::key_visible(q0 + col, key)) p = 0.0f;
                    st[0][nt][e] = p;                                             // P^T
                    dpt[0][nt][e] = attn::softmax_grad(p, dpt[0][nt][e], delta[col]);  // dS^T / scale
                }
            mma_p_times_tile<HS, 1, BQ>(dv, st, do_tile, lane);  // dV += P^T dO
            mma_p_times_tile<HS, 1, BQ>(dk, dpt, q_tile, lane);  // dK += dS^T Q
        }
        __syncthreads();  // no warp still reads the stage tile i + 2 fills
    }

    const float scale = 1.0f / sqrtf((float)args.hs);
    const float one[1][2] = {{1.0f, 1.0f}}, scaled[1][2] = {{scale, scale}};
    floatX* dk_base = args.dqkv + (size_t)b * args.T * C3 + args.C + h * args.hs;
    // the warp's own K and V rows (no other warp reads them) stage its dK and dV
    store_rows<HS, 1>(dk_base, C3, warp_k0, args.T, args.hs, args.vec, k_smem + warp_row * LD, dk, scaled, lane);
    store_rows<HS, 1>(dk_base + args.C, C3, warp_k0, args.T, args.hs, args.vec, v_smem + warp_row * LD, dv, one, lane);
}

// ----------------------------------------------------------------------------
// backward, dQ. grid (query blocks, attention_grid's heads): dQ += dS K over the key tiles up to
// the block's last query, with S and dP recomputed (the price of no atomics)

template <class Tiles>
constexpr size_t flash_backward_q_smem() {  // Q | dO | 2 stages of K, V
    return (size_t)(2 * Tiles::query_rows + 4 * Tiles::key_tile) * kSmemLd<Tiles::HS> * sizeof(floatX);
}

template <class Tiles>
__global__ void __launch_bounds__(Tiles::warps * kWarp) flash_backward_q_kernel(FlashArgs args) {
    constexpr int HS = Tiles::HS, LD = kSmemLd<HS>, BQ = Tiles::query_rows, BK = Tiles::key_tile;
    constexpr int THREADS = Tiles::warps * kWarp;
    extern __shared__ __align__(128) char smem_raw[];
    floatX* q_smem = reinterpret_cast<floatX*>(smem_raw);
    floatX* do_smem = q_smem + BQ * LD;
    floatX* kv_smem = do_smem + BQ * LD;  // stage s: K at 2s, V at 2s + 1
    int b, h;
    if (!head_of_block(args.NH, args.B, &b, &h)) return;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4;
    const int t = lane % 4;
    const int warp_row = warp * Tiles::rows_per_warp, warp_q0 = q0 + warp_row;
    const int warp_q_last = warp_q0 + Tiles::rows_per_warp - 1;
    const size_t C3 = (size_t)3 * args.C, bh = ((size_t)b * args.NH + h) * args.T;
    const floatX* q_base = args.qkv + (size_t)b * args.T * C3 + h * args.hs;
    const float scale_log2 = attn::scale_log2(args.hs);
    const int tiles = attn::key_tiles_seen(q0, BQ, args.T, BK);

    auto load_kv = [&](int tile, int stage) { load_kv_tile<HS, BK, THREADS>(kv_smem, tile, stage, q_base, args); };
    load_tile<HS, BQ, THREADS>(q_smem, q_base, C3, q0, args.T, args.hs, args.vec);
    load_tile<HS, BQ, THREADS>(do_smem, args.dout + (size_t)b * args.T * args.C + h * args.hs, args.C, q0, args.T,
                               args.hs, args.vec);
    stream_first_tile(0, load_kv);

    // this lane's two rows: g and g + 8 of the warp's 16
    float lse_log2[2], delta[2];
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int q = warp_q0 + g + 8 * half;
        lse_log2[half] = q < args.T ? args.lse[bh + q] * attn::kLog2e : INFINITY;
        delta[half] = q < args.T ? args.delta[bh + q] : 0.0f;
    }
    RegisterRows<HS, 1> q_rows, do_rows;
    float dq[1][HS / 8][4];
    zero(dq);

    for (int j = 0; j < tiles; j++) {
        prefetch_next_await_tile(j, tiles, load_kv);
        if (j == 0) {
            q_rows.load(q_smem, warp_row, lane);
            do_rows.load(do_smem, warp_row, lane);
        }
        const int k0 = j * BK;
        const floatX* k_tile = kv_smem + 2 * (j & 1) * BK * LD;
        if (!attn::tile_all_masked(warp_q_last, k0)) {
            float s[1][BK / 8][4], dp[1][BK / 8][4];
            zero(s);
            zero(dp);
            mma_rows_times_tile_t<HS, 1, BK>(s, q_rows, k_tile, lane);              // S = Q K^T
            mma_rows_times_tile_t<HS, 1, BK>(dp, do_rows, k_tile + BK * LD, lane);  // dP = dO V^T
            const bool mask = attn::tile_needs_mask(warp_q0, k0 + BK - 1);
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int half = e >> 1, q = warp_q0 + g + 8 * half, key = k0 + nt * 8 + 2 * t + (e & 1);
                    float p = attn::prob_from_lse(s[0][nt][e] * scale_log2, lse_log2[half]);
                    if (mask && !attn::key_visible(q, key)) p = 0.0f;
                    dp[0][nt][e] = attn::softmax_grad(p, dp[0][nt][e], delta[half]);  // dS / scale
                }
            mma_p_times_tile<HS, 1, BK>(dq, dp, k_tile, lane);  // dQ += dS K
        }
        __syncthreads();  // no warp still reads the stage tile j + 2 fills
    }

    const float scale = 1.0f / sqrtf((float)args.hs), scaled[1][2] = {{scale, scale}};
    store_rows<HS, 1>(args.dqkv + (size_t)b * args.T * C3 + h * args.hs, C3, warp_q0, args.T, args.hs, args.vec,
                      q_smem + warp_row * LD, dq, scaled, lane);
}

// ----------------------------------------------------------------------------
// launchers

template <class Tiles, class Kernel>
inline void launch_flash(Kernel kernel, int blocks, size_t smem, const FlashArgs& args, const char* what) {
    if (smem > ctx().max_smem_optin)
        fatal(1, "attention %s: head size %d needs %zu bytes of shared memory a block, the GPU has %zu", what, args.hs,
              smem, ctx().max_smem_optin);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<attention_grid(blocks, args.B, args.NH), Tiles::warps * kWarp, smem, stream()>>>(args);
    check_launch();
}

template <int HS>
inline void flash_attention_forward_padded(const FlashArgs& args) {
    using F = typename attn::FlashTiles<HS>::Forward;
    launch_flash<F>(flash_forward_kernel<F>, ceil_div(args.T, F::query_rows), flash_forward_smem<F>(), args, "forward");
}
template <int HS>
inline void flash_attention_backward_padded(const FlashArgs& args) {
    using KV = typename attn::FlashTiles<HS>::BackwardKV;
    using Q = typename attn::FlashTiles<HS>::BackwardQ;
    launch_flash<KV>(flash_backward_kv_kernel<KV>, ceil_div(args.T, KV::key_rows), flash_backward_kv_smem<KV>(), args,
                     "backward dK dV");
    launch_flash<Q>(flash_backward_q_kernel<Q>, ceil_div(args.T, Q::query_rows), flash_backward_q_smem<Q>(), args,
                    "backward dQ");
}

// head sizes up to 64 run the 64 kernels, up to 128 the 128 ones, padded with zeros in shared
// memory; larger ones would not keep a warp's accumulators in registers
constexpr int kFlashMaxHeadSize = 128;
inline void check_flash_head_size(int hs) {
    if (hs > kFlashMaxHeadSize)
        fatal(2, "attention: head size C/NH = %d is over %d, the largest the bf16 CUDA kernels take (more heads, "
                 "or the fp32 build)",
              hs, kFlashMaxHeadSize);
}
inline void flash_attention_forward(const FlashArgs& args) {
    check_flash_head_size(args.hs);
    if (args.hs <= 64) flash_attention_forward_padded<64>(args);
    else flash_attention_forward_padded<128>(args);
}
inline void flash_attention_backward(const FlashArgs& args) {
    check_flash_head_size(args.hs);
    if (args.hs <= 64) flash_attention_backward_padded<64>(args);
    else flash_attention_backward_padded<128>(args);
}

}  // namespace gpu
