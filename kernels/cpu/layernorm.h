// LayerNorm over the last dimension (C), eps 1e-5 as in GPT-2. mean and rstd are saved per row
// so the backward pass does not recompute the statistics.
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C) {
    const float eps = 1e-5f;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) { float d = x[c] - m; var += d * d; }
        float s = 1.0f / sqrtf(var / C + eps);
        float* o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

// dinp is accumulated into (+=): it is the residual stream's gradient. dweight/dbias are summed
// over rows in a fixed order per column, so the result does not depend on the thread count.
inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const float* d = dout + (size_t)i * C;
        const float* x = inp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        // mean of dnorm and of dnorm*norm, where dnorm = dout * weight
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float dn = d[c] * weight[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * (x[c] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float* dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            dx[c] += (d[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f, db = 0.0f;
        for (int i = 0; i < N; i++) {
            float dv = dout[(size_t)i * C + c];
            dw += dv * (inp[(size_t)i * C + c] - mean[i]) * rstd[i];
            db += dv;
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
}

}  // namespace cpu
