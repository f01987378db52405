// AdamW with decoupled weight decay, as the CPU reference. The bf16 build keeps fp32 master
// weights: the update is done on master, and param gets master rounded stochastically with
// random bits from (seed, index), so a run is reproducible from its seed. The fp32 build has no
// master copy (master == nullptr) and updates param directly. grad_scale folds gradient clipping
// into the update.
#pragma once
#include <cmath>

#include "common.cuh"

namespace gpu {

__global__ void adamw_kernel(floatX* param, float* master, const floatX* grad, float* m, float* v, size_t n,
                             float lr, float beta1, float beta2, float bc1, float bc2, float eps, float wd,
                             float grad_scale, uint32_t seed) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = (float)grad[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = master ? master[i] : (float)param[i];
        p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
        if (master) master[i] = p;
        store_rounded(param + i, p, seed, i);
    }
}

inline void adamw_update(floatX* param, float* master, const floatX* grad, float* m, float* v, size_t n, float lr,
                         float beta1, float beta2, float eps, float wd, float grad_scale, int t, uint32_t seed) {
    if (n == 0) return;
    const float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    const int block = 256;
    adamw_kernel<<<elementwise_blocks(n, block), block, 0, stream()>>>(param, master, grad, m, v, n, lr, beta1, beta2,
                                                                      bc1, bc2, eps, wd, grad_scale, seed);
    check_launch();
}

}  // namespace gpu
