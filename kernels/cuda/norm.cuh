// Sum of squares of a rank's gradient shard, for the global gradient norm, in one launch over
// the whole shard (the table of kernels/shard_table.h). A fixed grid (not one sized by the GPU)
// with grid-stride loops leaves one partial per block; the last block to finish adds them in
// block order. Same table, same bits, on any GPU.
#pragma once
#include <algorithm>

#include "../shard_table.h"
#include "common.cuh"

namespace gpu {

constexpr int kNormBlocks = 512, kNormThreads = 256;

// *out = sum of squares; partial holds gridDim.x floats, *done is 0 (and is left 0)
__global__ void __launch_bounds__(kNormThreads) grad_norm_squared_kernel(float* out, float* partial, unsigned* done,
                                                                         const floatX* grads, const ShardTensor* table,
                                                                         int count, size_t total) {
    float sum = 0.0f;
    int j = -1;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const ShardTensor& t = entry_of(table, count, e, &j);
        const float x = (float)grads[t.grad_offset + e - t.start];
        sum += x * x;
    }
    sum = block_sum(sum);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
        __threadfence();  // the partial is visible to whichever block finishes last
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    float total_sum = 0.0f;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) total_sum += __ldcg(partial + i);
    total_sum = block_sum(total_sum);
    if (threadIdx.x == 0) {
        *out = total_sum;
        *done = 0;
    }
}

// the scratch grad_norm_squared asks for: one partial sum a block
inline size_t grad_norm_scratch_bytes() { return kNormBlocks * sizeof(float); }

inline void grad_norm_squared(float* out, const floatX* grads, const ShardTable& table) {
    // small shards need no 512 blocks
    const size_t wanted = (table.elements + kNormThreads - 1) / kNormThreads;
    const int blocks = (int)std::min<size_t>(kNormBlocks, std::max<size_t>(1, wanted));
    float* partial = (float*)scratch(grad_norm_scratch_bytes());
    grad_norm_squared_kernel<<<blocks, kNormThreads, 0, stream()>>>(out, partial, ctx().norm_done, grads, table.device,
                                                                    table.count, table.elements);
    check_launch();
}

}  // namespace gpu
