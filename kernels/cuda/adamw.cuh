// AdamW with decoupled weight decay, as the CPU reference, in one launch over a rank's whole
// shard (kernels/shard_table.h says how the table maps it). The bf16 build keeps fp32 master
// weights: the update is done on master, and param gets master rounded stochastically with
// random bits from (seed, the element's index in the model), so a run is reproducible from its
// seed at any ZeRO stage. The fp32 build has no master copy (master == nullptr) and updates param
// directly. The step's constants are kernels/adamw_step.h's; grad_scale folds gradient clipping
// into the update.
#pragma once
#include <cmath>

#include "../adamw_step.h"
#include "../shard_table.h"
#include "common.cuh"

namespace gpu {

__global__ void adamw_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v,
                             const ShardTensor* table, int count, size_t total, float lr, float beta1, float beta2,
                             float bc1, float bc2, float eps, float wd, float grad_scale, uint32_t seed) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    int j = -1;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const ShardTensor& t = entry_of(table, count, e, &j);
        const size_t i = e - t.start, s = t.state_offset + i;
        floatX* param = params + t.param_offset + i;
        const float g = (float)grads[t.grad_offset + i] * grad_scale;
        float mi = m[s], vi = v[s];
        const float p = adamw_element(master ? master[s] : (float)*param, g, mi, vi, lr, beta1, beta2, bc1, bc2, eps, t.decay ? wd : 0.0f);
        m[s] = mi;
        v[s] = vi;
        if (master) master[s] = p;
        store_rounded(param, p, seed, rounding_index(t, i));
    }
}

inline void adamw_update(floatX* params, float* master, const floatX* grads, float* m, float* v,
                         const ShardTable& table, const AdamWStep& s) {
    if (table.elements == 0) return;
    const float bc1 = 1.0f - powf(s.beta1, (float)s.t), bc2 = 1.0f - powf(s.beta2, (float)s.t);
    const int block = 256;
    adamw_kernel<<<elementwise_blocks(table.elements, block), block, 0, stream()>>>(
        params, master, grads, m, v, table.device, table.count, table.elements, s.lr, s.beta1, s.beta2, bc1, bc2, s.eps,
        s.weight_decay, s.grad_scale, s.seed);
    check_launch();
}

}  // namespace gpu
