// Deterministic column sums of an (N, C) matrix, added (+=) into C-vectors: the bias gradient of
// a linear layer, and layernorm's weight and bias gradients. Rows are cut into fixed chunks of
// kColumnSumRows; one kernel sums each chunk in a fixed order into fp32 partials, a second adds
// the partials up chunk by chunk. No atomics, and the split depends only on N, so the bits are
// the same in every run.
#pragma once
#include "common.cuh"

namespace gpu {

constexpr int kColumnSumRows = 128;
constexpr int kColumnSumThreadsY = 8;

// grid (chunks, ceil(C/32)), block (32, 8): chunks in x, whose limit is 2^31-1, not 65535. WEIGHTED: also sums dout * (inp - mean) * rstd
template <bool WEIGHTED>
__global__ void column_partials_kernel(float* partial, const floatX* dout, const floatX* inp,
                                       const float* mean, const float* rstd, int N, int C) {
    __shared__ float sb[kColumnSumThreadsY][kWarp], sw[kColumnSumThreadsY][kWarp];
    const int c = blockIdx.y * kWarp + threadIdx.x, chunk = blockIdx.x, nchunks = gridDim.x;
    const int row_end = min(N, (chunk + 1) * kColumnSumRows);
    float db = 0.0f, dw = 0.0f;
    if (c < C) {
        for (int i = chunk * kColumnSumRows + threadIdx.y; i < row_end; i += kColumnSumThreadsY) {
            float d = (float)dout[(size_t)i * C + c];
            db += d;
            if (WEIGHTED) dw += d * ((float)inp[(size_t)i * C + c] - mean[i]) * rstd[i];
        }
    }
    sb[threadIdx.y][threadIdx.x] = db;
    sw[threadIdx.y][threadIdx.x] = dw;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < kColumnSumThreadsY; y++) {
        db += sb[y][threadIdx.x];
        dw += sw[y][threadIdx.x];
    }
    partial[(size_t)chunk * C + c] = db;
    if (WEIGHTED) partial[(size_t)(nchunks + chunk) * C + c] = dw;
}

__global__ void column_finish_kernel(floatX* dbias, floatX* dweight, const float* partial, int nchunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float db = 0.0f, dw = 0.0f;
    for (int k = 0; k < nchunks; k++) db += partial[(size_t)k * C + c];
    dbias[c] = (floatX)((float)dbias[c] + db);
    if (dweight == nullptr) return;
    for (int k = 0; k < nchunks; k++) dw += partial[(size_t)(nchunks + k) * C + c];
    dweight[c] = (floatX)((float)dweight[c] + dw);
}

// dbias += column sums of dout; with dweight, also dweight += column sums of
// dout * (inp - mean) * rstd (layernorm)
inline void column_sums_add(floatX* dbias, floatX* dweight, const floatX* dout, const floatX* inp,
                            const float* mean, const float* rstd, int N, int C) {
    if (N == 0 || C == 0) return;
    const int nchunks = ceil_div(N, kColumnSumRows);
    float* partial = (float*)scratch((size_t)2 * nchunks * C * sizeof(float));
    dim3 grid(nchunks, ceil_div(C, kWarp)), block(kWarp, kColumnSumThreadsY);
    if (dweight) column_partials_kernel<true><<<grid, block, 0, stream()>>>(partial, dout, inp, mean, rstd, N, C);
    else column_partials_kernel<false><<<grid, block, 0, stream()>>>(partial, dout, inp, mean, rstd, N, C);
    check_launch();
    column_finish_kernel<<<ceil_div(C, 256), 256, 0, stream()>>>(dbias, dweight, partial, nchunks, C);
    check_launch();
}

}  // namespace gpu
