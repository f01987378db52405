// The fp8 casts on the CPU (kernels/fp8_scaling.h says what they compute): a tensor's amax, and
// the values its fp8 copy stands for, which an fp32 GEMM then multiplies as the fp8 one would.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../fp8_scaling.h"

namespace cpu {

// the bits of the largest |x| of n values (a NaN's above all others)
inline uint32_t amax_bits(const float* x, size_t n) {
    uint32_t amax = 0;
    #pragma omp parallel for reduction(max : amax)
    for (size_t i = 0; i < n; i++) amax = std::max(amax, abs_bits(x[i]));
    return amax;
}

// out = what x's fp8 copy in format f stands for: each value scaled by the tensor's scale,
// rounded to f, and scaled back (exact). The amax and 1 / scale go to *noted; a non-finite amax
// adds one to *nonfinite_amaxes.
inline void fp8_round_trip(float* out, const float* x, size_t n, Fp8Format f, Fp8Scale* noted, unsigned* nonfinite_amaxes) {
    noted->amax_bits = amax_bits(x, n);
    noted->descale = fp8_descale(noted->amax_bits, f);
    *nonfinite_amaxes += amax_nonfinite(noted->amax_bits) ? 1 : 0;
    const float scale = fp8_scale(noted->amax_bits, f), descale = noted->descale;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = fp8_to_float(fp8_from_float(x[i] * scale, f), f) * descale;
}

}  // namespace cpu
