// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
//
// Backward without float atomics, so every run gives the same bits: the positions are sorted
// by token id (CUB's radix sort is stable and deterministic), and each run of equal tokens is
// summed by one thread block in increasing position order before it is added to its wte row.
// dwpe[t] sums over b in order, one thread per (t, c).
#pragma once
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

namespace gpu {

__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte,
                                       const floatX* wpe, int BT, int T, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * C) return;
    const int bt = (int)(idx / C), c = (int)(idx % C), t = bt % T;
    out[idx] = (floatX)((float)wte[(size_t)tokens[bt] * C + c] + (float)wpe[(size_t)t * C + c]);
}

// 128-bit version: C a multiple of x128::size and aligned tensors
__global__ void encoder_forward_kernel128(floatX* out, const int* tokens, const floatX* wte,
                                          const floatX* wpe, int BT, int T, int C) {
    const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= (size_t)BT * C) return;
    const int bt = (int)(idx / C), c = (int)(idx % C), t = bt % T;
    x128 a = load128(wte + (size_t)tokens[bt] * C + c), b = load128(wpe + (size_t)t * C + c), o;
    for (int k = 0; k < x128::size; k++) o[k] = (floatX)((float)a[k] + (float)b[k]);
    store128(out + idx, o);
}

inline void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                            int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) return;
    const int block = 256;
    if (C % x128::size == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe))
        encoder_forward_kernel128<<<ceil_div(n / x128::size, block), block, 0, stream()>>>(out, tokens, wte, wpe, B * T, T, C);
    else
        encoder_forward_kernel<<<ceil_div(n, block), block, 0, stream()>>>(out, tokens, wte, wpe, B * T, T, C);
    check_launch();
}

__global__ void iota_kernel(int* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = i;
}

// grid (BT, channel blocks). Block i does work only when sorted position i starts a run of
// equal tokens; it then owns that token's wte row (for its channels), so no two blocks write
// the same element.
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* sorted_tokens,
                                            const int* sorted_pos, int BT, int C) {
    const int i = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    const int tok = sorted_tokens[i];
    if (c >= C || (i > 0 && sorted_tokens[i - 1] == tok)) return;
    float sum = 0.0f;
    for (int j = i; j < BT && sorted_tokens[j] == tok; j++) sum += (float)dout[(size_t)sorted_pos[j] * C + c];
    floatX* d = dwte + (size_t)tok * C + c;
    *d = (floatX)((float)*d + sum);
}

__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += (float)dout[(size_t)b * T * C + idx];
    dwpe[idx] = (floatX)((float)dwpe[idx] + sum);
}

inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* tokens,
                             int B, int T, int C) {
    const int BT = B * T;
    if (BT == 0 || C == 0) return;
    // scratch: positions, sorted tokens, sorted positions, then CUB's temporary storage
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const int*)nullptr, (int*)nullptr,
                                               (const int*)nullptr, (int*)nullptr, BT, 0, 31, stream()));
    const size_t ints = ((size_t)3 * BT + 63) / 64 * 64;
    int* pos = (int*)scratch(ints * sizeof(int) + temp_bytes);
    int* sorted_tokens = pos + BT;
    int* sorted_pos = pos + 2 * BT;
    void* temp = pos + ints;
    iota_kernel<<<ceil_div(BT, 256), 256, 0, stream()>>>(pos, BT);
    check_launch();
    // token ids are non-negative ints: bits 0..30 order them
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tokens, pos, sorted_pos, BT,
                                               0, 31, stream()));
    check_launch();  // one count for CUB's few kernels
    const int block = C < 256 ? (C + 31) / 32 * 32 : 256;
    encoder_backward_wte_kernel<<<dim3(BT, ceil_div(C, block)), block, 0, stream()>>>(dwte, dout, sorted_tokens,
                                                                                    sorted_pos, BT, C);
    check_launch();
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256, 0, stream()>>>(dwpe, dout, B, T, C);
    check_launch();
}

}  // namespace gpu
