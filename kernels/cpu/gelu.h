// GELU, tanh approximation as in GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

inline void gelu_forward(float* out, const float* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
    }
}

// In place: dinout holds d(out) on entry and d(inp) on exit.
inline void gelu_backward(float* dinout, const float* inp, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = kGeluScale * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
        dinout[i] *= 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
    }
}

}  // namespace cpu
