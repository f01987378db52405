// GELU, tanh approximation as in GPT-2: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// The backward runs in place on the gradient buffer, like the CPU reference.
#pragma once
#include "common.cuh"

namespace gpu {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__device__ inline float gelu_fwd(float x) {
    return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}
__device__ inline float gelu_grad(float x) {
    float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// BACKWARD false: out = gelu(inp); true: out (= d(out) on entry) *= gelu'(inp)
template <bool BACKWARD, bool VEC>
__global__ void gelu_kernel(floatX* out, const floatX* inp, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (VEC) {
        for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < n;
             i += stride * x128::size) {
            x128 x = load128(inp + i), o;
            x128 d = BACKWARD ? load128(out + i) : x;
            for (int k = 0; k < x128::size; k++)
                o[k] = (floatX)(BACKWARD ? (float)d[k] * gelu_grad((float)x[k]) : gelu_fwd((float)x[k]));
            store128(out + i, o);
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            float x = (float)inp[i];
            out[i] = (floatX)(BACKWARD ? (float)out[i] * gelu_grad(x) : gelu_fwd(x));
        }
    }
}

template <bool BACKWARD>
inline void gelu_launch(floatX* out, const floatX* inp, size_t n) {
    if (n == 0) return;
    const int block = 256;
    if (aligned16(out) && aligned16(inp) && n % x128::size == 0)
        gelu_kernel<BACKWARD, true><<<elementwise_blocks(n / x128::size, block), block, 0, stream()>>>(out, inp, n);
    else
        gelu_kernel<BACKWARD, false><<<elementwise_blocks(n, block), block, 0, stream()>>>(out, inp, n);
    check_launch();
}

inline void gelu_forward(floatX* out, const floatX* inp, size_t n) { gelu_launch<false>(out, inp, n); }
inline void gelu_backward(floatX* dinout, const floatX* inp, size_t n) { gelu_launch<true>(dinout, inp, n); }

}  // namespace gpu
