// LayerNorm over the last dimension (C), eps 1e-5 as in GPT-2; mean and rstd saved per row.
// Forward: one warp per row, the row is read three times (sum, variance, output) and stays in
// L1/L2 between passes. The fused variant first writes residual_out = a + b and normalises that
// stored (rounded) value, which is what backward will see.
// Backward: dinp += (the residual stream's gradient), one warp per row; dweight/dbias += via
// deterministic column sums (column_sum.cuh).
#pragma once
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

// dinp[i,:] += (dout*w - mean(dout*w) - norm * mean(dout*w*norm)) * rstd, one warp per row
__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                               const floatX* w, const float* mean, const float* rstd,
                                               int N, int C) {
    const int lane = threadIdx.x % kWarp;
    const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (row >= N) return;
    const size_t off = (size_t)row * C;
    const float m = mean[row], s = rstd[row];
    float dn_sum = 0.0f, dnn_sum = 0.0f;
    for (int c = lane; c < C; c += kWarp) {
        float dn = (float)dout[off + c] * (float)w[c];
        dn_sum += dn;
        dnn_sum += dn * ((float)inp[off + c] - m) * s;
    }
    const float dn_mean = warp_sum(dn_sum) / C, dnn_mean = warp_sum(dnn_sum) / C;
    for (int c = lane; c < C; c += kWarp) {
        float norm = ((float)inp[off + c] - m) * s;
        float d = ((float)dout[off + c] * (float)w[c] - dn_mean - norm * dnn_mean) * s;
        dinp[off + c] = (floatX)((float)dinp[off + c] + d);
    }
}

inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout,
                               const floatX* inp, const floatX* w, const float* mean, const float* rstd,
                               int N, int C) {
    if (N == 0) return;
    layernorm_backward_dinp_kernel<<<ceil_div(N, kLayernormBlock / kWarp), kLayernormBlock, 0, stream()>>>(
        dinp, dout, inp, w, mean, rstd, N, C);
    check_launch();
    column_sums_add(dbias, dweight, dout, inp, mean, rstd, N, C);
}

}  // namespace gpu
