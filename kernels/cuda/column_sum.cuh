// Deterministic column sums of an (N, C) matrix, added (+=) into C-vectors: the bias gradient of
// a linear layer, and the finish of layernorm's weight and bias gradients. Rows are cut
// into fixed chunks of kColumnSumRows; one kernel sums each chunk in a fixed order into fp32
// partials, a second adds the partials up chunk by chunk. No atomics, and the split depends only
// on N, so the bits are the same in every run.
#pragma once
#include "common.cuh"

namespace gpu {

constexpr int kColumnSumRows = 128;
constexpr int kColumnSumThreadsY = 8;

constexpr int kColumnFinishThreadsY = 32;

// grid (chunks, ceil(C / (32 * S))), block (32, 8), S = x128::size when VEC else 1: lane x sums the
// S columns at (blockIdx.y * 32 + x) * S over the chunk's rows y, y + 8, ... with one 16-byte load
// a row, then lane x of row-group 0 adds the 8 row-groups in order. Chunks in x, whose limit is
// 2^31-1, not 65535.
template <bool VEC>
__global__ void column_partials_kernel(float* partial, const floatX* dout, int N, int C) {
    constexpr int S = VEC ? x128::size : 1;
    __shared__ float sums[kColumnSumThreadsY][kWarp * S];
    const int c = (blockIdx.y * kWarp + threadIdx.x) * S, chunk = blockIdx.x;
    const int row_end = min(N, (chunk + 1) * kColumnSumRows);
    float acc[S] = {};
    if (c < C) {
        for (int i = chunk * kColumnSumRows + threadIdx.y; i < row_end; i += kColumnSumThreadsY) {
            const floatX* src = dout + (size_t)i * C + c;
            if (VEC) {
                x128 v = load128(src);
                for (int k = 0; k < S; k++) acc[k] += (float)v[k];
            } else {
                acc[0] += (float)src[0];
            }
        }
    }
    for (int k = 0; k < S; k++) sums[threadIdx.y][k * kWarp + threadIdx.x] = acc[k];  // lanes apart: no bank conflicts
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < kColumnSumThreadsY; y++)
        for (int k = 0; k < S; k++) acc[k] += sums[y][k * kWarp + threadIdx.x];
    for (int k = 0; k < S; k++) partial[(size_t)chunk * C + c + k] = acc[k];
}

// dbias[c] += sum over k of partial[k][c]; with dweight also dweight[c] += sum of partial[nchunks + k][c].
// grid ceil(C/32), block (32, 32): row-group y sums chunks y, y + 32, ..., then row-group 0 adds
// the 32 sums in order.
__global__ void column_finish_kernel(floatX* dbias, floatX* dweight, const float* partial, int nchunks, int C) {
    __shared__ float sb[kColumnFinishThreadsY][kWarp], sw[kColumnFinishThreadsY][kWarp];
    const int c = blockIdx.x * kWarp + threadIdx.x;
    float db = 0.0f, dw = 0.0f;
    if (c < C) {
        for (int k = threadIdx.y; k < nchunks; k += kColumnFinishThreadsY) {
            db += partial[(size_t)k * C + c];
            if (dweight != nullptr) dw += partial[(size_t)(nchunks + k) * C + c];
        }
    }
    sb[threadIdx.y][threadIdx.x] = db;
    sw[threadIdx.y][threadIdx.x] = dw;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < kColumnFinishThreadsY; y++) {
        db += sb[y][threadIdx.x];
        dw += sw[y][threadIdx.x];
    }
    dbias[c] = (floatX)((float)dbias[c] + db);
    if (dweight != nullptr) dweight[c] = (floatX)((float)dweight[c] + dw);
}

// adds the partial sums that partial holds (nchunks rows of C for dbias, then nchunks for dweight
// when it is given) into dbias and dweight
inline void column_finish_add(floatX* dbias, floatX* dweight, const float* partial, int nchunks, int C) {
    column_finish_kernel<<<ceil_div(C, kWarp), dim3(kWarp, kColumnFinishThreadsY), 0, stream()>>>(dbias, dweight, partial,
                                                                                                nchunks, C);
    check_launch();
}

// the scratch column_sums_add asks for: a partial C-vector a chunk
inline size_t column_sums_scratch_bytes(int N, int C) { return (size_t)ceil_div(N, kColumnSumRows) * C * sizeof(float); }

// dbias += column sums of dout
inline void column_sums_add(floatX* dbias, const floatX* dout, int N, int C) {
    if (N == 0 || C == 0) return;
    const int nchunks = ceil_div(N, kColumnSumRows);
    float* partial = (float*)scratch(column_sums_scratch_bytes(N, C));
    const bool vec = C % x128::size == 0 && aligned16(dout);
    dim3 block(kWarp, kColumnSumThreadsY);
    if (vec)
        column_partials_kernel<true><<<dim3(nchunks, ceil_div(C, kWarp * x128::size)), block, 0, stream()>>>(partial, dout, N, C);
    else
        column_partials_kernel<false><<<dim3(nchunks, ceil_div(C, kWarp)), block, 0, stream()>>>(partial, dout, N, C);
    check_launch();
    column_finish_add(dbias, nullptr, partial, nchunks, C);
}

}  // namespace gpu
