// --fp8 e4m3: the four matmuls of each block (qkv, attention projection, fc, fc projection),
// forward and both backward GEMMs, take fp8 operands: inputs and weights e4m3, output gradients
// e5m2 (common/fp8.h). What both backends share about it, written once: which GEMMs qualify, how a
// tensor's scale follows from its amax, and the buffers the casts write (the model allocates
// them, so the memory plan counts them). docs/fp8.md says why the scaling is this one.
//
// Scaling is per tensor and current: each cast first takes the amax of the tensor it casts, then
// multiplies by scale = the largest power of two with amax * scale <= the format's largest value,
// and rounds (fp8_from_float). A power of two makes the scaling and its inverse exact, so the
// rounding is the only error, and the GEMM's dequantisation (1 / scale, cuBLASLt's A/B scale
// pointers) is exact too. Nothing carries over from one step to the next: same-seed runs and
// resumes need no state beyond what bf16 keeps.
//
// The amax is kept as the bits of the largest |x|: for non-negative floats the bits order as the
// values do, and a NaN's bits are above infinity's, so the maximum of the bits sees any non-finite
// value (fmaxf would drop a NaN). A cast whose amax is not finite has saturated an infinity or
// NaN away; it adds one to the workspace's count, and the trainer makes such a step non-finite.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../common/fp8.h"
#include "../common/host_device.h"

// |x|'s bits, and whether those of an amax are not finite
HOST_DEVICE inline uint32_t abs_bits(float x) { return float_bits(x) & 0x7fffffffu; }
HOST_DEVICE inline bool amax_nonfinite(uint32_t amax_bits) { return amax_bits >= 0x7f800000u; }

// The largest power of two 2^k with amax * 2^k <= the format's largest value, k in [-126, 126]
// (so that 1 / scale is a normal float too); 1 where the amax is 0 (any scale casts zeros to
// zeros) or not finite (the cast saturates and the step is dropped).
HOST_DEVICE inline float fp8_scale(uint32_t amax_bits, Fp8Format f) {
    if (amax_bits == 0 || amax_nonfinite(amax_bits)) return 1.0f;
    const uint32_t largest = float_bits(fp8_layout(f).largest);
    int k = 126;  // a subnormal amax: as large as the range allows
    if (amax_bits >= 0x00800000u) {
        k = (int)(largest >> 23) - (int)(amax_bits >> 23) - ((amax_bits & 0x7fffffu) > (largest & 0x7fffffu) ? 1 : 0);
        k = k < -126 ? -126 : k > 126 ? 126 : k;
    }
    return bits_float((uint32_t)(k + 127) << 23);
}
// 1 / fp8_scale, exactly: what multiplies a GEMM of scaled operands back
HOST_DEVICE inline float fp8_descale(uint32_t amax_bits, Fp8Format f) { return 1.0f / fp8_scale(amax_bits, f); }

// The fp8 GEMMs' shapes: every dimension a multiple of 16, which cuBLASLt's fp8 kernels ask of the
// leading dimensions (16 bytes); a matmul of another shape (a text sample's forward at B = 1 and
// a short T) runs as without --fp8, on both backends alike. N rows, C in, OC out.
constexpr int kFp8DimMultiple = 16;
inline bool fp8_gemm_shape(int N, int C, int OC) {
    return N % kFp8DimMultiple == 0 && C % kFp8DimMultiple == 0 && OC % kFp8DimMultiple == 0;
}

// What a cast leaves beside the bytes it writes, one per operand role: the amax of the tensor
// it cast and the dequantisation multiplier 1 / scale (cuBLASLt reads it from there)
struct Fp8Scale {
    uint32_t amax_bits;
    float descale;
};
enum Fp8Operand { kFp8Input, kFp8Weight, kFp8Gradient, kFp8Operands };
HOST_DEVICE constexpr Fp8Format fp8_format_of(Fp8Operand o) { return o == kFp8Gradient ? Fp8Format::E5M2 : Fp8Format::E4M3; }

// The buffers one block matmul's casts write, in backend memory, reused by every layer. Copy is
// the backend's fp8 copy of a value: its code on the GPU, the value it stands for (code / scale)
// on the CPU, whose fp32 GEMM then computes what the fp8 one does. Sizes for a model of width C
// at B x T (the widest operands: fc's output and its projection's input, 4C wide):
//   rows     an activation or output gradient as stored, B*T x 4C
//   rows_t   the same transposed, 4C x B*T (a backend whose GEMMs take only "TN" operands)
//   other    the backward's second activation operand (the input, for dweight), B*T x 4C,
//            transposed where the backend's GEMMs need it
//   weight   a weight, as stored (forward) or transposed where needed (backward), 4C x C
template <class Copy>
struct Fp8Workspace {
    Copy *rows = nullptr, *rows_t = nullptr, *other = nullptr, *weight = nullptr;
    Fp8Scale* scales = nullptr;          // kFp8Operands of them, by Fp8Operand
    unsigned* nonfinite_amaxes = nullptr;  // casts whose amax was not finite, added to until taken
};
