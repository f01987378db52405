// LayerNorm over the last dimension (C), eps 1e-5 as in GPT-2; mean and rstd saved per row.
// Forward: one warp per row, the row is read three times (sum, variance, output) and stays in
// L1/L2 between passes. The fused variant first writes residual_out = a + b and normalises that
// stored (rounded) value, which is what backward will see.
// Backward: dinp += (the residual stream's gradient), one warp per row, in one pass over memory:
// each warp reads its row of dout and inp twice (sums, then output), the second time from cache
// (L1, or L2 where the shared memory below leaves L1 small). dweight/dbias += from per-warp sums
// in shared memory, added up per block in warp order, then over blocks in block order
// (column_sum.cuh): no float atomics, the same bits every run.
#pragma once
#include <algorithm>

#include "column_sum.cuh"
#include "common.cuh"

namespace gpu {

constexpr int kLayernormBlock = 256;  // 8 rows per block

// RESIDUAL: x = residual_out = a + b; else x = a. VEC: 128-bit loads (C % x128::size == 0, aligned)
template <bool RESIDUAL, bool VEC>
__global__ void layernorm_forward_kernel(floatX* residual_out, floatX* out, float* mean, float* rstd,
                                         const floatX* a, const floatX* b, const floatX* w,
                                         const floatX* bias, int N, int C) {
    const int lane = threadIdx.x % kWarp;
    const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const int S = VEC ? x128::size : 1;
    const floatX* x = RESIDUAL ? residual_out + off : a + off;
    float sum = 0.0f;
    for (int c = lane * S; c < C; c += kWarp * S) {
        if (VEC) {
            x128 v;
            if (RESIDUAL) {
                x128 va = load128(a + off + c), vb = load128(b + off + c);
                for (int k = 0; k < S; k++) v[k] = (floatX)((float)va[k] + (float)vb[k]);
                store128(residual_out + off + c, v);
            } else {
                v = load128(x + c);
            }
            for (int k = 0; k < S; k++) sum += (float)v[k];
        } else {
            floatX v = RESIDUAL ? (floatX)((float)a[off + c] + (float)b[off + c]) : x[c];
            if (RESIDUAL) residual_out[off + c] = v;
            sum += (float)v;
        }
    }
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * S; c < C; c += kWarp * S) {
        if (VEC) {
            x128 v = load128(x + c);
            for (int k = 0; k < S; k++) var += ((float)v[k] - m) * ((float)v[k] - m);
        } else {
            float d = (float)x[c] - m;
            var += d * d;
        }
    }
    const float s = rsqrtf(warp_sum(var) / C + 1e-5f);
    for (int c = lane * S; c < C; c += kWarp * S) {
        if (VEC) {
            x128 v = load128(x + c), vw = load128(w + c), vb = load128(bias + c), o;
            for (int k = 0; k < S; k++) o[k] = (floatX)(((float)v[k] - m) * s * (float)vw[k] + (float)vb[k]);
            store128(out + off + c, o);
        } else {
            out[off + c] = (floatX)(((float)x[c] - m) * s * (float)w[c] + (float)bias[c]);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <bool RESIDUAL>
inline void layernorm_forward_launch(floatX* residual_out, floatX* out, float* mean, float* rstd, const floatX* a,
                                     const floatX* b, const floatX* w, const floatX* bias, int N, int C) {
    if (N == 0) return;
    const int grid = ceil_div(N, kLayernormBlock / kWarp);
    bool vec = C % x128::size == 0 && aligned16(out) && aligned16(a) && aligned16(w) && aligned16(bias) &&
               (!RESIDUAL || (aligned16(b) && aligned16(residual_out)));
    if (vec)
        layernorm_forward_kernel<RESIDUAL, true><<<grid, kLayernormBlock, 0, stream()>>>(residual_out, out, mean, rstd, a, b, w, bias, N, C);
    else
        layernorm_forward_kernel<RESIDUAL, false><<<grid, kLayernormBlock, 0, stream()>>>(residual_out, out, mean, rstd, a, b, w, bias, N, C);
    check_launch();
}

inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w,
                              const floatX* b, int N, int C) {
    layernorm_forward_launch<false>(nullptr, out, mean, rstd, inp, nullptr, w, b, N, C);
}

inline void residual_layernorm_forward(floatX* residual_out, floatX* out, float* mean, float* rstd, const floatX* a,
                                       const floatX* b, const floatX* w, const floatX* bias, int N, int C) {
    layernorm_forward_launch<true>(residual_out, out, mean, rstd, a, b, w, bias, N, C);
}

// Rows per warp in one block; with the warps per block (from C) this fixes which rows each
// partial sum holds, so the bits depend on N and C only.
constexpr int kLayernormBackwardRowsPerWarp = 16;
// shared memory for the per-warp dweight/dbias sums, 2 * C floats a warp: up to 8 warps within
// the 48 KiB a block gets without opting in (C = 768: 8 warps, C = 1600: 3)
constexpr size_t kLayernormBackwardSmem = 48 << 10;

inline int layernorm_backward_warps(int C) {
    const size_t per_warp = 2 * sizeof(float) * (size_t)C;
    return (int)std::max<size_t>(1, std::min<size_t>(8, kLayernormBackwardSmem / per_warp));
}

// One block a chunk of rows, one warp a row at a time. dinp[i,:] += (dout*w - mean(dout*w) -
// norm * mean(dout*w*norm)) * rstd with norm = (inp - mean) * rstd; each warp adds dout and
// dout * norm into its own shared-memory sums (element k of lane group g at [k][g], so a warp's
// accesses hit 32 banks), and at the end the block writes the sum over its warps, in warp order,
// to partial[block] (dbias) and partial[gridDim.x + block] (dweight). VEC: 16-byte accesses
// (C % x128::size == 0 and aligned tensors).
template <bool VEC>
__global__ void layernorm_backward_kernel(floatX* dinp, float* partial, const floatX* dout, const floatX* inp,
                                          const floatX* w, const float* mean, const float* rstd, int N, int C) {
    constexpr int S = VEC ? x128::size : 1;
    extern __shared__ float warp_sums[];  // per warp: dbias sums [C], then dweight sums [C]
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
    const int groups = C / S;  // lane groups of S columns: column g * S + k sits at [k * groups + g]
    float* db_sum = warp_sums + (size_t)warp * 2 * C;
    float* dw_sum = db_sum + C;
    for (int i = lane; i < 2 * C; i += kWarp) db_sum[i] = 0.0f;
    __syncwarp();
    const int rows = warps * kLayernormBackwardRowsPerWarp, row_end = min(N, (int)blockIdx.x * rows + rows);
    for (int row = blockIdx.x * rows + warp; row < row_end; row += warps) {
        const size_t off = (size_t)row * C;
        const float m = mean[row], s = rstd[row];
        float dn_sum = 0.0f, dnn_sum = 0.0f;
        for (int g = lane; g < groups; g += kWarp) {
            const int c = g * S;
            float d[S], x[S], wc[S];
            if (VEC) {
                x128 vd = load128(dout + off + c), vx = load128(inp + off + c), vw = load128(w + c);
                for (int k = 0; k < S; k++) d[k] = (float)vd[k], x[k] = (float)vx[k], wc[k] = (float)vw[k];
            } else {
                d[0] = (float)dout[off + c], x[0] = (float)inp[off + c], wc[0] = (float)w[c];
            }
            for (int k = 0; k < S; k++) {
                const float dn = d[k] * wc[k];
                dn_sum += dn;
                dnn_sum += dn * (x[k] - m) * s;
            }
        }
        const float dn_mean = warp_sum(dn_sum) / C, dnn_mean = warp_sum(dnn_sum) / C;
        for (int g = lane; g < groups; g += kWarp) {
            const int c = g * S;
            float d[S], x[S], wc[S], di[S];
            if (VEC) {
                x128 vd = load128(dout + off + c), vx = load128(inp + off + c), vw = load128(w + c);
                x128 vi = load128(dinp + off + c);
                for (int k = 0; k < S; k++)
                    d[k] = (float)vd[k], x[k] = (float)vx[k], wc[k] = (float)vw[k], di[k] = (float)vi[k];
            } else {
                d[0] = (float)dout[off + c], x[0] = (float)inp[off + c], wc[0] = (float)w[c], di[0] = (float)dinp[off + c];
            }
            x128 out;
            for (int k = 0; k < S; k++) {
                const float norm = (x[k] - m) * s;
                out[k] = (floatX)(di[k] + (d[k] * wc[k] - dn_mean - norm * dnn_mean) * s);
                db_sum[k * groups + g] += d[k];
                dw_sum[k * groups + g] += d[k] * norm;
            }
            if (VEC) store128(dinp + off + c, out);
            else dinp[off + c] = out[0];
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const int at = (c % S) * groups + c / S;
        float db = 0.0f, dw = 0.0f;
        for (int v = 0; v < warps; v++) {
            db += warp_sums[(size_t)v * 2 * C + at];
            dw += warp_sums[(size_t)v * 2 * C + C + at];
        }
        partial[(size_t)blockIdx.x * C + c] = db;
        partial[(size_t)(gridDim.x + blockIdx.x) * C + c] = dw;
    }
}

inline int layernorm_backward_blocks(int N, int C) {
    return ceil_div(N, (size_t)layernorm_backward_warps(C) * kLayernormBackwardRowsPerWarp);
}
// the scratch layernorm_backward asks for: a block's dbias and dweight partial sums
inline size_t layernorm_backward_scratch_bytes(int N, int C) {
    return (size_t)2 * layernorm_backward_blocks(N, C) * C * sizeof(float);
}

inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                               const floatX* inp, const floatX* w, const float* mean, const float* rstd,
                               int N, int C) {
    if (N == 0 || C == 0) return;
    const int warps = layernorm_backward_warps(C);
    const int blocks = layernorm_backward_blocks(N, C);
    const size_t smem = (size_t)warps * 2 * C * sizeof(float);
    if (smem + 1024 > ctx().max_smem_optin)
        fatal(1, "layernorm backward: C=%d needs %zu bytes of shared memory, the GPU gives a block %zu", C, smem,
              ctx().max_smem_optin);
    float* partial = (float*)scratch(layernorm_backward_scratch_bytes(N, C));
    const bool vec = C % x128::size == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
    auto kernel = vec ? layernorm_backward_kernel<true> : layernorm_backward_kernel<false>;
    static size_t opted_in[2] = {48 << 10, 48 << 10};  // beyond the default 48 KiB it must be asked for
    if (smem > opted_in[vec]) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        opted_in[vec] = smem;
    }
    kernel<<<blocks, warps * kWarp, smem, stream()>>>(dinp, partial, dout, inp, w, mean, rstd, N, C);
    check_launch();
    column_finish_add(dbias, dweight, partial, blocks, C);
}

}  // namespace gpu
