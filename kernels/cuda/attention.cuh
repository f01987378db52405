// Causal multi-head self-attention: qkv (B, T, 3C) = [q | k | v], heads of hs = C/NH channels.
// The T x T score matrix never exists in global memory: a thread block owns a tile of query rows
// (or key rows, in backward), streams the other side through shared memory a tile at a time and
// keeps a running max and sum of the softmax ("online softmax"). Only the log-sum-exp of each
// row is saved (B*NH*T floats); backward rebuilds the probabilities from it.
//
// The bf16 build runs the tensor-core kernels of flash_attention.cuh (head sizes up to 128); the
// fp32 build, the reference, runs the plain loops of attention_fp32.cuh (any head size).
// Backward is deterministic in both: the same bits on every run.
#pragma once
#include "attention_heads.cuh"
#include "common.cuh"
#ifdef ENABLE_FP32
#include "attention_fp32.cuh"
#else
#include "flash_attention.cuh"
#endif

namespace gpu {

inline size_t attention_saved_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

// D[b,h,q] = dout . out over the head's channels: the softmax backward's row term (sum_k P dP),
// computed without P. LANES lanes a row (a power of two up to 32), each summing 16-byte chunks
// (vec) or single elements, then a fixed shuffle tree: the same bits every run.
template <int LANES>
__global__ void attention_backward_delta_kernel(float* delta, const floatX* dout, const floatX* out, int B, int T,
                                                int C, int NH, int hs, bool vec) {
    const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / LANES;  // (b, h, q)
    const int lane = threadIdx.x % LANES;
    const bool valid = row < (size_t)B * NH * T;  // every lane stays for the shuffles
    float sum = 0.0f;
    if (valid) {
        const int q = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
        const size_t off = ((size_t)b * T + q) * C + h * hs;
        if (vec) {
            for (int d = lane * x128::size; d < hs; d += LANES * x128::size) {
                const x128 g = load128(dout + off + d), o = load128(out + off + d);
                for (int k = 0; k < x128::size; k++) sum += (float)g[k] * (float)o[k];
            }
        } else {
            for (int d = lane; d < hs; d += LANES) sum += (float)dout[off + d] * (float)out[off + d];
        }
    }
    for (int o = LANES / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (valid && lane == 0) delta[row] = sum;
}

template <int LANES>
inline void launch_attention_backward_delta(float* delta, const floatX* dout, const floatX* out, int B, int T, int C,
                                            int NH, bool vec) {
    constexpr int kBlock = 256;
    const size_t rows = (size_t)B * NH * T;
    attention_backward_delta_kernel<LANES><<<ceil_div(rows, kBlock / LANES), kBlock, 0, stream()>>>(
        delta, dout, out, B, T, C, NH, C / NH, vec);
    check_launch();
}
// as many lanes a row as it has 16-byte chunks (at least 8, at most 32)
inline void attention_backward_delta(float* delta, const floatX* dout, const floatX* out, int B, int T, int C,
                                     int NH) {
    const int hs = C / NH, chunks = ceil_div(hs, x128::size);
    const bool vec = hs % x128::size == 0 && C % x128::size == 0 && aligned16(dout) && aligned16(out);
    if (vec && chunks <= 8) launch_attention_backward_delta<8>(delta, dout, out, B, T, C, NH, vec);
    else if (vec && chunks <= 16) launch_attention_backward_delta<16>(delta, dout, out, B, T, C, NH, vec);
    else launch_attention_backward_delta<32>(delta, dout, out, B, T, C, NH, vec);
}

inline void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    if (B == 0 || T == 0) return;
#ifdef ENABLE_FP32
    plain_attention_forward(out, lse, qkv, B, T, C, NH);
#else
    FlashArgs a{qkv, out, lse, nullptr, nullptr, nullptr, B, T, C, NH, C / NH, false};
    a.vec = a.hs % 8 == 0 && C % 8 == 0 && aligned16(qkv) && aligned16(out);
    flash_attention_forward(a);
#endif
}

// the scratch attention_backward asks for: D, one float a (b, h, q)
inline size_t attention_backward_scratch_bytes(int B, int T, int NH) { return (size_t)B * NH * T * sizeof(float); }

// dqkv is overwritten; out is the forward's output (for D = rowsum(dout * out))
inline void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                               const float* lse, int B, int T, int C, int NH) {
    if (B == 0 || T == 0) return;
    float* delta = (float*)scratch(attention_backward_scratch_bytes(B, T, NH));
    attention_backward_delta(delta, dout, out, B, T, C, NH);
#ifdef ENABLE_FP32
    plain_attention_backward(dqkv, dout, qkv, lse, delta, B, T, C, NH);
#else
    FlashArgs a{qkv, nullptr, const_cast<float*>(lse), dout, delta, dqkv, B, T, C, NH, C / NH, false};
    a.vec = a.hs % 8 == 0 && C % 8 == 0 && aligned16(qkv) && aligned16(dout) && aligned16(dqkv);
    flash_attention_backward(a);
#endif
}

}  // namespace gpu
