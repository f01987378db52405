// Residual add (out = a + b) and gradient accumulation (dst += src). The backward of an add is
// the identity, so the model keeps one residual gradient buffer and needs no backward kernel.
#pragma once
#include "common.cuh"

namespace gpu {

// VEC: 128-bit path, taken when every pointer is 16-byte aligned and n is a multiple of x128::size
template <bool VEC>
__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (VEC) {
        for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < n;
             i += stride * x128::size) {
            x128 va = load128(a + i), vb = load128(b + i), vo;
            for (int k = 0; k < x128::size; k++) vo[k] = (floatX)((float)va[k] + (float)vb[k]);
            store128(out + i, vo);
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            out[i] = (floatX)((float)a[i] + (float)b[i]);
    }
}

inline void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n) {
    if (n == 0) return;
    const int block = 256;
    if (aligned16(out) && aligned16(a) && aligned16(b) && n % x128::size == 0) {
        residual_forward_kernel<true><<<elementwise_blocks(n / x128::size, block), block, 0, stream()>>>(out, a, b, n);
    } else {
        residual_forward_kernel<false><<<elementwise_blocks(n, block), block, 0, stream()>>>(out, a, b, n);
    }
    check_launch();
}

inline void accumulate(floatX* dst, const floatX* src, size_t n) { residual_forward(dst, dst, src, n); }

}  // namespace gpu
