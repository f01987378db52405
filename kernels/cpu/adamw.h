// AdamW with decoupled weight decay (Loshchilov & Hutter), as in GPT-2/llm.c. grad_scale folds
// gradient clipping into the update so the gradients need no separate pass.
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

inline void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                         int t) {
    const float bc1 = 1.0f - powf(beta1, (float)t);
    const float bc2 = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}

// Sum of squares in double: the global norm adds up ~1e8 terms on large models.
inline double sum_squares(const float* x, size_t n) {
    double sum = 0.0;
    #pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

}  // namespace cpu
