// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
//
// Backward without float atomics, so every run gives the same bits: the positions are sorted
// by token id (CUB's radix sort is stable and deterministic), and each run of equal tokens is
// summed in a fixed order before it is added to its wte row: the sorted positions are cut into
// fixed segments, one block each, so a long run (real text repeats a few tokens very often) is
// summed by many blocks, and a run's pieces are added in segment order. dwpe[t] sums over b in
// order, one thread per (t, c).
#pragma once
#include <algorithm>
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

constexpr int kEncoderSegment = 64;    // sorted positions a block of the segment kernel sums
constexpr int kEncoderPieceGroups = 8;  // thread rows that share a long run's pieces

// grid (segments, channel blocks), one thread per S channels (S = x128::size when VEC, else 1).
// Block s sums dout's rows, in sorted order, for each run of equal tokens within positions
// [s * G, (s + 1) * G). A run that starts and ends there is added to its wte row at once; a piece
// of a run that crosses the segment's edge goes to pieces[s][0] (the segment's first run, begun
// before it) or pieces[s][1] (its last, continuing after it), for encoder_backward_runs_kernel.
template <bool VEC>
__global__ void encoder_backward_segments_kernel(floatX* dwte, float* pieces, const floatX* dout,
                                                 const int* sorted_tokens, const int* sorted_pos, int BT, int C) {
    constexpr int S = VEC ? x128::size : 1;
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * S;
    if (c >= C) return;
    const int begin = blockIdx.x * kEncoderSegment, end = min(BT, begin + kEncoderSegment);
    float acc[S] = {};
    int run_start = begin;
    for (int i = begin; i < end; i++) {
        const int tok = sorted_tokens[i];
        const floatX* src = dout + (size_t)sorted_pos[i] * C + c;
        if (VEC) {
            x128 v = load128(src);
            for (int k = 0; k < S; k++) acc[k] += (float)v[k];
        } else {
            acc[0] += (float)src[0];
        }
        const bool run_ends = i + 1 == BT || sorted_tokens[i + 1] != tok;
        if (!run_ends && i + 1 < end) continue;
        const bool begun_before = run_start == begin && begin > 0 && sorted_tokens[begin - 1] == tok;
        if (run_ends && !begun_before) {
            floatX* d = dwte + (size_t)tok * C + c;
            if (VEC) {
                x128 o = load128(d);
                for (int k = 0; k < S; k++) o[k] = (floatX)((float)o[k] + acc[k]);
                store128(d, o);
            } else {
                d[0] = (floatX)((float)d[0] + acc[0]);
            }
        } else {
            float* p = pieces + ((size_t)blockIdx.x * 2 + (begun_before ? 0 : 1)) * C + c;
            for (int k = 0; k < S; k++) p[k] = acc[k];
        }
        for (int k = 0; k < S; k++) acc[k] = 0.0f;
        run_start = i + 1;
    }
}

// grid (segments, ceil(C / 32)), block (32, kEncoderPieceGroups). Block s owns the run that
// starts in segment s and continues past it: it adds the run's pieces (segment s's last, then the
// first of each later segment the run reaches) to the token's wte row, thread row y summing
// pieces y, y + 8, ..., and row 0 adding the rows' sums in order.
__global__ void encoder_backward_runs_kernel(floatX* dwte, const float* pieces, const int* sorted_tokens, int BT, int C) {
    const int seg = blockIdx.x, begin = seg * kEncoderSegment, end = begin + kEncoderSegment;
    if (end >= BT) return;
    const int tok = sorted_tokens[end - 1];
    if (sorted_tokens[end] != tok) return;                                                  // ends here
    if (begin > 0 && sorted_tokens[begin] == tok && sorted_tokens[begin - 1] == tok) return;  // begun before
    // the last segment the run reaches: segments start with tok up to there (binary search)
    int lo = seg + 1, hi = (BT - 1) / kEncoderSegment;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (sorted_tokens[mid * kEncoderSegment] == tok) lo = mid;
        else hi = mid - 1;
    }
    const int npieces = lo - seg + 1;
    const int c = blockIdx.y * kWarp + threadIdx.x;
    __shared__ float sums[kEncoderPieceGroups][kWarp];
    float acc = 0.0f;
    if (c < C)
        for (int p = threadIdx.y; p < npieces; p += kEncoderPieceGroups)
            acc += pieces[((size_t)(seg + p) * 2 + (p == 0 ? 1 : 0)) * C + c];
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < kEncoderPieceGroups; y++) acc += sums[y][threadIdx.x];
    floatX* d = dwte + (size_t)tok * C + c;
    *d = (floatX)((float)*d + acc);
}

__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += (float)dout[(size_t)b * T * C + idx];
    dwpe[idx] = (floatX)((float)dwpe[idx] + sum);
}

inline void encoder_backward_wte(floatX* dwte, float* pieces, const floatX* dout, const int* sorted_tokens,
                                 const int* sorted_pos, int BT, int C) {
    const int segments = ceil_div(BT, kEncoderSegment);
    if (C % x128::size == 0 && aligned16(dwte) && aligned16(dout)) {
        const int groups = C / x128::size, block = std::min(groups, 128);
        encoder_backward_segments_kernel<true><<<dim3(segments, ceil_div(groups, block)), block, 0, stream()>>>(
            dwte, pieces, dout, sorted_tokens, sorted_pos, BT, C);
    } else {
        const int block = std::min(C, 128);
        encoder_backward_segments_kernel<false><<<dim3(segments, ceil_div(C, block)), block, 0, stream()>>>(
            dwte, pieces, dout, sorted_tokens, sorted_pos, BT, C);
    }
    check_launch();
    encoder_backward_runs_kernel<<<dim3(segments, ceil_div(C, kWarp)), dim3(kWarp, kEncoderPieceGroups), 0, stream()>>>(
        dwte, pieces, sorted_tokens, BT, C);
    check_launch();
}
// bytes of encoder_backward_wte's pieces: two C-vectors of floats a segment
inline size_t encoder_backward_pieces_bytes(int BT, int C) {
    return (size_t)ceil_div(BT, kEncoderSegment) * 2 * C * sizeof(float);
}

// The PTX version CUB's kernels run as: the GPU's (what cub::PtxVersion says), or, asked where
// no GPU is visible (a memory plan made on another machine), the newest this binary carries.
inline int sort_ptx_version() {
    static int ptx = 0;
    if (ptx == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
            CUDA_CHECK(cub::PtxVersion(ptx));
        } else {
            (void)cudaGetLastError();  // clear the sticky error
            for (int arch : {__CUDA_ARCH_LIST__}) ptx = std::max(ptx, arch);
        }
    }
    return ptx;
}

// CUB's stable radix sort of n (key, value) pairs by the keys' bits 0..30 (token ids are
// non-negative ints), tuned as for PTX version `ptx`, as cub::DeviceRadixSort::SortPairs does it.
// With temp == nullptr it only sets temp_bytes, touching no GPU.
inline cudaError_t sort_pairs(void* temp, size_t& temp_bytes, const int* keys_in, int* keys_out, const int* values_in,
                              int* values_out, int n, int ptx, cudaStream_t s) {
    using Sort = cub::DispatchRadixSort<cub::SortOrder::Ascending, int, int, cub::detail::choose_offset_t<int>>;
    cub::DoubleBuffer<int> keys(const_cast<int*>(keys_in), keys_out), values(const_cast<int*>(values_in), values_out);
    Sort sort(temp, temp_bytes, keys, values, n, 0, 31, false, s, ptx);
    return Sort::max_policy_t::Invoke(ptx, sort);
}

// encoder_backward's scratch, in this order: positions, sorted tokens, sorted positions (3 BT
// ints, padded), CUB's temporary storage (padded), then the wte backward's pieces of long runs
struct EncoderScratch {
    size_t ints_bytes, temp_bytes = 0, temp_padded, pieces_bytes;
    EncoderScratch(int BT, int C) {
        ints_bytes = ((size_t)3 * BT + 63) / 64 * 64 * sizeof(int);
        CUDA_CHECK(sort_pairs(nullptr, temp_bytes, nullptr, nullptr, nullptr, nullptr, BT, sort_ptx_version(), nullptr));
        temp_padded = (temp_bytes + 255) / 256 * 256;
        pieces_bytes = encoder_backward_pieces_bytes(BT, C);
    }
    size_t bytes() const { return ints_bytes + temp_padded + pieces_bytes; }
};
// the scratch encoder_backward asks for
inline size_t encoder_backward_scratch_bytes(int B, int T, int C) { return B * T == 0 ? 0 : EncoderScratch(B * T, C).bytes(); }

inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* tokens,
                             int B, int T, int C) {
    const int BT = B * T;
    if (BT == 0 || C == 0) return;
    EncoderScratch layout(BT, C);
    int* pos = (int*)scratch(layout.bytes());
    int* sorted_tokens = pos + BT;
    int* sorted_pos = pos + 2 * BT;
    void* temp = (char*)pos + layout.ints_bytes;
    float* pieces = (float*)((char*)temp + layout.temp_padded);
    iota_kernel<<<ceil_div(BT, 256), 256, 0, stream()>>>(pos, BT);
    check_launch();
    CUDA_CHECK(sort_pairs(temp, layout.temp_bytes, tokens, sorted_tokens, pos, sorted_pos, BT, sort_ptx_version(), stream()));
    check_launch();  // one count for CUB's few kernels
    encoder_backward_wte(dwte, pieces, dout, sorted_tokens, sorted_pos, BT, C);
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256, 0, stream()>>>(dwpe, dout, B, T, C);
    check_launch();
}

}  // namespace gpu
