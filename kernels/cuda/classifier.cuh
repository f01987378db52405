// Fused softmax + cross-entropy + its gradient, one block per row. logits (N, Vp) are replaced
// in place by dlogits = (softmax - onehot(target)) * dloss, so no second vocabulary-sized buffer
// exists; padding columns V..Vp-1 get zero. losses are fp32 per row. dloss == 0 (inference)
// keeps the logits.
// The candidate build holds each row in registers (bf16 rows up to 65536 wide): one 16-byte read
// and one 16-byte write of each logit, the padding columns only written; wider rows (the fp32
// build's 50304) take the kernel that reads the row twice.
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

#ifdef KERNELS_CANDIDATE
constexpr int kClassifierRowBlock = 1024;
constexpr float kLog2e = 1.4426950408889634f;

// One block a row, each thread CHUNKS groups of x128::size logits (group i of thread t starts at
// column (i * blockDim.x + t) * x128::size), kept in registers from the read to the write. The
// group that V cuts is read element by element up to V; padding is never read.
template <int CHUNKS>
__global__ void __launch_bounds__(kClassifierRowBlock)
    classifier_row_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp) {
    constexpr int S = x128::size;
    floatX* row = logits + (size_t)blockIdx.x * Vp;
    const int target = targets[blockIdx.x];
    __shared__ float target_logit;
    x128 v[CHUNKS];
    float mx = -INFINITY;
    for (int i = 0; i < CHUNKS; i++) {
        const int j = (i * blockDim.x + threadIdx.x) * S;
        if (j + S <= V) {
            v[i] = load128(row + j);
        } else {
            for (int k = 0; k < S; k++) v[i][k] = j + k < V ? row[j + k] : (floatX)-INFINITY;
        }
        for (int k = 0; k < S; k++) mx = fmaxf(mx, (float)v[i][k]);
        if (target >= j && target < j + S) target_logit = (float)v[i][target - j];
    }
    const float row_max = block_max(mx);  // its __syncthreads also publish target_logit
    const float scaled_max = row_max * kLog2e;
    float sum = 0.0f;
    for (int i = 0; i < CHUNKS; i++)
        for (int k = 0; k < S; k++) sum += exp2f(fmaf((float)v[i][k], kLog2e, -scaled_max));  // -inf: 0
    sum = block_sum(sum);
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + row_max - target_logit;
    if (dloss == 0.0f) return;
    const float scale = dloss / sum;
    for (int i = 0; i < CHUNKS; i++) {
        const int j = (i * blockDim.x + threadIdx.x) * S;
        if (j >= Vp) break;
        x128 d;
        for (int k = 0; k < S; k++) {
            const float p = exp2f(fmaf((float)v[i][k], kLog2e, -scaled_max)) * scale;
            d[k] = (floatX)(j + k < V ? p - (j + k == target ? dloss : 0.0f) : 0.0f);
        }
        store128(row + j, d);
    }
}

// the row kernel for rows of at most CHUNKS * kClassifierRowBlock * x128::size logits; false
// when CHUNKS is too small for this Vp (and no larger CHUNKS is instantiated)
template <int CHUNKS>
inline bool classifier_row_launch(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    if ((size_t)Vp > (size_t)CHUNKS * kClassifierRowBlock * x128::size) {
        if constexpr (CHUNKS < 8) return classifier_row_launch<CHUNKS * 2>(logits, losses, targets, dloss, N, V, Vp);
        else return false;
    }
    classifier_row_kernel<CHUNKS><<<N, kClassifierRowBlock, 0, stream()>>>(logits, losses, targets, dloss, V, Vp);
    check_launch();
    return true;
}

inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    if (N == 0) return;
    if (Vp % x128::size == 0 && aligned16(logits) && classifier_row_launch<1>(logits, losses, targets, dloss, N, V, Vp))
        return;
    fused_classifier_kernel<<<N, kClassifierBlock, 0, stream()>>>(logits, losses, targets, dloss, V, Vp);
    check_launch();
}
#else
inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    if (N == 0) return;
    fused_classifier_kernel<<<N, kClassifierBlock, 0, stream()>>>(logits, losses, targets, dloss, V, Vp);
    check_launch();
}

#endif

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
