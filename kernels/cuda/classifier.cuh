// Fused softmax + cross-entropy + its gradient, one block per row. logits (N, Vp) are replaced
// in place by dlogits = (softmax - onehot(target)) * dloss, so no second vocabulary-sized buffer
// exists; padding columns V..Vp-1 get zero. losses are fp32 per row. dloss == 0 (inference)
// keeps the logits.
#pragma once
#include "common.cuh"

namespace gpu {

constexpr int kClassifierBlock = 512;

__global__ void __launch_bounds__(kClassifierBlock)
    fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    floatX* row = logits + (size_t)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    // online max/sum per thread, merged across the block
    float mx = -INFINITY, sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = (float)row[j];
        if (x > mx) {
            sum = sum * expf(mx - x) + 1.0f;
            mx = x;
        } else {
            sum += expf(x - mx);
        }
    }
    const float row_max = block_max(mx);
    sum = block_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - row_max));
    const float target_logit = (float)row[target];  // read before anyone overwrites the row
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + row_max - target_logit;
    if (dloss == 0.0f) return;
    __syncthreads();  // every thread has read row[target]
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float d = 0.0f;
        if (j < V) d = (expf((float)row[j] - row_max) * inv - (j == target ? 1.0f : 0.0f)) * dloss;
        row[j] = (floatX)d;
    }
}

inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    if (N == 0) return;
    fused_classifier_kernel<<<N, kClassifierBlock, 0, stream()>>>(logits, losses, targets, dloss, V, Vp);
    check_launch();
}

// *acc += the mean of losses[0..N) rounded to float, as the CPU's mean_loss_add: one block
// adds in a fixed order, so the loss stays on the device until the step reads it once
__global__ void __launch_bounds__(1024) mean_loss_add_kernel(double* acc, const float* losses, int N) {
    __shared__ double partial[1024];
    double sum = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) sum += losses[i];
    partial[threadIdx.x] = sum;
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        __syncthreads();
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    }
    if (threadIdx.x == 0) *acc += (float)(partial[0] / N);
}

inline void mean_loss_add(double* acc, const float* losses, int N) {
    mean_loss_add_kernel<<<1, 1024, 0, stream()>>>(acc, losses, N);
    check_launch();
}

}  // namespace gpu
