// Fused softmax + cross-entropy + its gradient, one block per row. logits (N, Vp) are replaced
// in place by dlogits = (softmax - onehot(target)) * dloss, so no second vocabulary-sized buffer
// exists; padding columns V..Vp-1 get zero. losses are fp32 per row. dloss == 0 (inference)
// keeps the logits.
// In bf16 each row is held in shared memory (GPT-2's 50304 logits: 100 KB, two rows an SM): one
// 16-byte read and one 16-byte write of each logit, the padding columns only written. A row wider
// than a block's shared memory, and the fp32 build (the reference), take the kernel that reads the
// row twice.
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

constexpr int kClassifierRowBlock = 1024;
constexpr float kLog2e = 1.4426950408889634f;

// One block a row, whose real logits go to shared memory with 16-byte loads (the group of
// x128::size that V cuts element by element; padding is never read); max, sum and dlogits read
// them there, and dlogits leave with 16-byte stores. Vp % x128::size == 0, logits aligned.
__global__ void __launch_bounds__(kClassifierRowBlock, 2)
    classifier_row_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    constexpr int S = x128::size;
    extern __shared__ int4 row_shared[];  // int4: 16-byte aligned
    floatX* cached = (floatX*)row_shared;
    floatX* row = logits + (size_t)blockIdx.x * Vp;
    const int target = targets[blockIdx.x], groups = Vp / S;
    float mx = -INFINITY;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        const int j = g * S;
        x128 v;
        if (j + S <= V) {
            v = load128(row + j);
        } else {
            for (int k = 0; k < S; k++) v[k] = j + k < V ? row[j + k] : (floatX)-INFINITY;
        }
        store128(cached + j, v);
        for (int k = 0; k < S; k++) mx = fmaxf(mx, (float)v[k]);
    }
    const float row_max = block_max(mx);  // its __syncthreads also publish the cached row
    const float scaled_max = row_max * kLog2e;
    float sum = 0.0f;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        const x128 v = load128(cached + g * S);
        for (int k = 0; k < S; k++) sum += exp2f(fmaf((float)v[k], kLog2e, -scaled_max));  // padding: exp(-inf) = 0
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + row_max - (float)cached[target];
    if (dloss == 0.0f) return;
    const float scale = dloss / sum;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        const int j = g * S;
        const x128 v = load128(cached + j);
        x128 d;
        for (int k = 0; k < S; k++) {
            const float p = exp2f(fmaf((float)v[k], kLog2e, -scaled_max)) * scale;
            d[k] = (floatX)(j + k < V ? p - (j + k == target ? dloss : 0.0f) : 0.0f);
        }
        store128(row + j, d);
    }
}

inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    if (N == 0) return;
    const size_t smem = (size_t)Vp * sizeof(floatX);
    // room left for block_max's and block_sum's static shared memory
    if (sizeof(floatX) == 2 && Vp % x128::size == 0 && aligned16(logits) && smem + 1024 <= ctx().max_smem_optin) {
        static size_t opted_in = 48 << 10;  // a row beyond the default 48 KiB must be asked for
        if (smem > opted_in) {
            CUDA_CHECK(cudaFuncSetAttribute(classifier_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            opted_in = smem;
        }
        classifier_row_kernel<<<N, kClassifierRowBlock, smem, stream()>>>(logits, losses, targets, dloss, V, Vp);
    } else {
        fused_classifier_kernel<<<N, kClassifierBlock, 0, stream()>>>(logits, losses, targets, dloss, V, Vp);
    }
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
