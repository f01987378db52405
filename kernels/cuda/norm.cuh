// Sum of squares for the global gradient norm: *acc += sum x^2. A fixed grid (not one sized by
// the GPU) with grid-stride loops writes one partial per block; a single block then adds them
// in order. Same n, same bits, on any GPU.
#pragma once
#include <algorithm>

#include "common.cuh"

namespace gpu {

constexpr int kNormBlocks = 512, kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads) sum_squares_partial_kernel(float* partial, const floatX* x, size_t n) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = (float)x[i];
        sum += v * v;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kNormThreads) sum_squares_finish_kernel(float* acc, const float* partial, int blocks) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *acc += sum;
}

inline void sum_squares_add(float* acc, const floatX* x, size_t n) {
    if (n == 0) return;
    // small tensors (biases, layernorms) need no 512 blocks
    const int blocks = (int)std::min<size_t>(kNormBlocks, (n + kNormThreads - 1) / kNormThreads);
    float* partial = (float*)scratch(kNormBlocks * sizeof(float));
    sum_squares_partial_kernel<<<blocks, kNormThreads, 0, stream()>>>(partial, x, n);
    check_launch();
    sum_squares_finish_kernel<<<1, kNormThreads, 0, stream()>>>(acc, partial, blocks);
    check_launch();
}

}  // namespace gpu
