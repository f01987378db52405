// fp8, the two 8-bit float formats of the tensor cores since sm_89 (OCP's FP8, as NVIDIA's cvt
// and cuBLASLt's CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 read them), as bytes on the host and in the
// kernels:
//   e4m3  sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinity; S.1111.111 is NaN.
//         Largest 448 (S.1111.110), smallest normal 2^-6, smallest subnormal 2^-9.
//   e5m2  sign, 5 exponent bits (bias 15), 2 mantissa bits, as IEEE: S.11111.00 is infinity,
//         S.11111.xx (xx != 0) NaN. Largest 57344, smallest normal 2^-14, subnormal 2^-16.
// fp8_from_float rounds to nearest, ties to the even code, and saturates: a value whose rounding
// would pass the largest finite one, infinities included, becomes +-largest (cvt's .satfinite).
// NaN becomes 0x7F (a NaN in both formats; its sign is dropped, as cvt drops it). Values that
// round to zero keep their sign (-0 is 0x80). Saturation hides an overflow, so whoever casts
// looks at the tensor's amax first (kernels/fp8_scaling.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.h"

enum class Fp8Format { E4M3, E5M2 };

struct Fp8Layout {
    int mantissa_bits, bias;
    uint8_t largest_code;  // the largest finite value's code, sign clear
    float largest;
};
HOST_DEVICE constexpr Fp8Layout fp8_layout(Fp8Format f) {
    return f == Fp8Format::E4M3 ? Fp8Layout{3, 7, 0x7E, 448.0f} : Fp8Layout{2, 15, 0x7B, 57344.0f};
}

HOST_DEVICE inline uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
HOST_DEVICE inline float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

// the rounding above, in integer steps on the fp32 bits (the host's, and the GPU's before sm_89)
HOST_DEVICE inline uint8_t fp8_from_float_by_bits(float x, Fp8Format f) {
    const Fp8Layout l = fp8_layout(f);
    const uint32_t u = float_bits(x), a = u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((u >> 31) << 7);
    if (a > 0x7f800000u) return 0x7F;
    const int min_normal_exp = 1 - l.bias;  // as a power of two
    if (a >= (uint32_t)(min_normal_exp + 127) << 23) {
        // keep the top mantissa bits, rounding the rest to nearest even; a carry moves into the
        // exponent, as it should. Infinity lands past the largest code and saturates.
        const int drop = 23 - l.mantissa_bits;
        const uint32_t rounded = (a + (1u << (drop - 1)) - 1u + ((a >> drop) & 1u)) >> drop;
        const uint32_t code = rounded - ((uint32_t)(127 - l.bias) << l.mantissa_bits);
        return (uint8_t)((code > l.largest_code ? l.largest_code : code) | sign);
    }
    // subnormal: multiples of 2^(min_normal_exp - mantissa_bits); scaling by a power of two up is
    // exact, rintf rounds to nearest even (a result of 2^mantissa_bits is the smallest normal's code)
    const float steps = rintf(bits_float(a) * ldexpf(1.0f, l.mantissa_bits - min_normal_exp));
    return (uint8_t)((uint8_t)steps | sign);
}

// the cast: the hardware's cvt on sm_89 and later, the bits above elsewhere (the GPU test holds
// the two to the same bytes)
HOST_DEVICE inline uint8_t fp8_from_float(float x, Fp8Format f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short pair;
    if (f == Fp8Format::E4M3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
    else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
    return (uint8_t)pair;  // the low byte holds the second operand's
#else
    return fp8_from_float_by_bits(x, f);
#endif
}

// the value of a code (NaN for e4m3's 0x7F/0xFF and e5m2's NaNs, +-infinity for e5m2's 0x7C/0xFC)
HOST_DEVICE inline float fp8_to_float(uint8_t code, Fp8Format f) {
    const Fp8Layout l = fp8_layout(f);
    const uint32_t sign = (uint32_t)(code >> 7) << 31, magnitude = code & 0x7fu;
    const uint32_t exponent = magnitude >> l.mantissa_bits, mantissa = magnitude & ((1u << l.mantissa_bits) - 1u);
    if (f == Fp8Format::E4M3 && magnitude == 0x7fu) return bits_float(0x7fc00000u);
    if (f == Fp8Format::E5M2 && exponent == 31) return bits_float(sign | (mantissa == 0 ? 0x7f800000u : 0x7fc00000u));
    if (exponent == 0)  // subnormal: mantissa steps of 2^(1 - bias - mantissa_bits), exact in fp32
        return bits_float(sign | float_bits((float)mantissa * ldexpf(1.0f, 1 - l.bias - l.mantissa_bits)));
    return bits_float(sign | (exponent - l.bias + 127) << 23 | mantissa << (23 - l.mantissa_bits));
}
