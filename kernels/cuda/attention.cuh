// Causal multi-head self-attention: qkv (B, T, 3C) = [q | k | v], heads of hs = C/NH channels.
// The T x T score matrix never exists in global memory: a thread block owns a tile of query rows
// (or key rows, in backward), streams the other side through shared memory a tile at a time and
// keeps a running max and sum of the softmax ("online softmax"). Only the log-sum-exp of each
// row is saved (B*NH*T floats); backward rebuilds the probabilities from it.
//
// The bf16 build runs the tensor-core kernels of flash_attention.cuh (head sizes up to 128); the
// candidate build runs those of flash_attention_hopper.cuh instead on an sm_90 GPU at head sizes
// 64 and 128. The fp32 build, the reference, runs the plain loops of attention_fp32.cuh (any
// head size). Backward is deterministic in all: the same bits on every run.
#pragma once
#include <string>

#include "attention_heads.cuh"
#include "common.cuh"
#ifdef ENABLE_FP32
#include "attention_fp32.cuh"
#else
#include "flash_attention.cuh"
#ifdef KERNELS_CANDIDATE
#include "flash_attention_hopper.cuh"
#endif
#endif

namespace gpu {

inline size_t attention_saved_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

// D[b,h,q] = dout . out over the head's channels: the softmax backward's row term (sum_k P dP),
// computed without P. LANES lanes a row (a power of two up to 32), each summing 16-byte chunks
// (vec) or single elements, then a fixed shuffle tree: the same bits every run. Also sets the
// first `counters` of zeroed_counters to 0 (the Hopper backward's dQ order; none elsewhere).
template <int LANES>
__global__ void attention_backward_delta_kernel(float* delta, const floatX* dout, const floatX* out, int B, int T,
                                                int C, int NH, int hs, bool vec, unsigned* zeroed_counters,
                                                size_t counters) {
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x, row = thread / LANES;  // (b, h, q)
    const int lane = threadIdx.x % LANES;
    if (thread < counters) zeroed_counters[thread] = 0;
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
                                            int NH, bool vec, unsigned* zeroed_counters, size_t counters) {
    constexpr int kBlock = 256;
    const size_t rows = (size_t)B * NH * T;  // at least `counters` threads (one a row, LANES >= 1)
    attention_backward_delta_kernel<LANES><<<ceil_div(rows, kBlock / LANES), kBlock, 0, stream()>>>(
        delta, dout, out, B, T, C, NH, C / NH, vec, zeroed_counters, counters);
    check_launch();
}
// as many lanes a row as it has 16-byte chunks (at least 8, at most 32); zeroed_counters: as
// the kernel's (at most B * NH * T)
inline void attention_backward_delta(float* delta, const floatX* dout, const floatX* out, int B, int T, int C,
                                     int NH, unsigned* zeroed_counters = nullptr, size_t counters = 0) {
    const int hs = C / NH, chunks = ceil_div(hs, x128::size);
    const bool vec = hs % x128::size == 0 && C % x128::size == 0 && aligned16(dout) && aligned16(out);
    if (vec && chunks <= 8) launch_attention_backward_delta<8>(delta, dout, out, B, T, C, NH, vec, zeroed_counters, counters);
    else if (vec && chunks <= 16) launch_attention_backward_delta<16>(delta, dout, out, B, T, C, NH, vec, zeroed_counters, counters);
    else launch_attention_backward_delta<32>(delta, dout, out, B, T, C, NH, vec, zeroed_counters, counters);
}

inline void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    if (B == 0 || T == 0) return;
#ifdef ENABLE_FP32
    plain_attention_forward(out, lse, qkv, B, T, C, NH);
#else
    FlashArgs a{qkv, out, lse, nullptr, nullptr, nullptr, B, T, C, NH, C / NH, false};
    a.vec = a.hs % 8 == 0 && C % 8 == 0 && aligned16(qkv) && aligned16(out);
#ifdef KERNELS_CANDIDATE
    if (hopper_attention_takes(a)) return hopper_attention_forward(a);
#endif
    flash_attention_forward(a);
#endif
}

#if defined(KERNELS_CANDIDATE) && !defined(ENABLE_FP32)
// the Hopper backward's scratch after D: dQ's accumulator (16-byte aligned for the bulk adds),
// then its counters
inline size_t hopper_dq_accumulator_offset(int B, int T, int NH) {
    return ((size_t)B * NH * T * sizeof(float) + 255) / 256 * 256;
}
inline size_t hopper_dq_order_offset(int B, int T, int NH, int hs) {
    return hopper_dq_accumulator_offset(B, T, NH) + hopper_dq_accumulator_floats(B, T, NH, hs) * sizeof(float);
}
#endif

// the scratch attention_backward asks for: D, one float a (b, h, q); in the candidate build, at
// the Hopper kernels' head sizes, their dQ accumulator and counters too (on any GPU: a plan
// made without one cannot know which kernels will run)
inline size_t attention_backward_scratch_bytes(int B, int T, int C, int NH) {
#if defined(KERNELS_CANDIDATE) && !defined(ENABLE_FP32)
    const int hs = C / NH;
    if (hopper_head_size(hs)) return hopper_dq_order_offset(B, T, NH, hs) + hopper_dq_counters(B, T, NH, hs) * sizeof(uint32_t);
#endif
    return (size_t)B * NH * T * sizeof(float);
}

// dqkv is overwritten; out is the forward's output (for D = rowsum(dout * out))
inline void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                               const float* lse, int B, int T, int C, int NH) {
    if (B == 0 || T == 0) return;
    char* work = (char*)scratch(attention_backward_scratch_bytes(B, T, C, NH));
    float* delta = (float*)work;
#ifdef ENABLE_FP32
    attention_backward_delta(delta, dout, out, B, T, C, NH);
    plain_attention_backward(dqkv, dout, qkv, lse, delta, B, T, C, NH);
#else
    FlashArgs a{qkv, nullptr, const_cast<float*>(lse), dout, delta, dqkv, B, T, C, NH, C / NH, false};
    a.vec = a.hs % 8 == 0 && C % 8 == 0 && aligned16(qkv) && aligned16(dout) && aligned16(dqkv);
#ifdef KERNELS_CANDIDATE
    if (hopper_attention_takes(a)) {
        const HopperDq dq{(float*)(work + hopper_dq_accumulator_offset(B, T, NH)),
                          (uint32_t*)(work + hopper_dq_order_offset(B, T, NH, a.hs))};
        attention_backward_delta(delta, dout, out, B, T, C, NH, dq.order, hopper_dq_counters(B, T, NH, a.hs));
        return hopper_attention_backward(a, dq);
    }
#endif
    attention_backward_delta(delta, dout, out, B, T, C, NH);
    flash_attention_backward(a);
#endif
}

// which kernels a run at these heads takes, for its setup line (buffers 16-byte aligned, as
// the trainer's are)
inline std::string attention_kernels_said(int C, int NH) {
#ifdef ENABLE_FP32
    (void)C, (void)NH;
    return "fp32 loops (attention_fp32.cuh)";
#else
    const int hs = C / NH;
#ifdef KERNELS_CANDIDATE
    if (hopper_head_size(hs) && C % 8 == 0 && hopper_attention_present_cached())
        return "sm_90a wgmma kernels, head size " + std::to_string(hs) + " (flash_attention_hopper.cuh)";
    const char* why = !hopper_head_size(hs) ? "head size not 64 or 128" : C % 8 != 0 ? "C not a multiple of 8"
                                                                                     : "no sm_90 GPU with this build's sm_90a image";
    return "sm_80 mma.sync kernels, head size " + std::to_string(hs) + " (flash_attention.cuh; " + why + ")";
#else
    return "sm_80 mma.sync kernels, head size " + std::to_string(hs) + " (flash_attention.cuh)";
#endif
#endif
}

}  // namespace gpu
