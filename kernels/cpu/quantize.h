// Block-wise int8 quantization (kernels/quantize_blocks.h: the blocks, the row layout, why):
// rows of values to quantized rows and back, and the fp32 sum of several quantized rows, which a
// quantized reduce-scatter's receiver takes. The CUDA kernels (kernels/cuda/quantize.cuh) are
// tested against these, and these against a NumPy reference (test/test_quantize.py).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../quantize_blocks.h"

namespace cpu {

// the scale of a block of n values: max |x| / 127, NaN when one of them is not finite
inline float quant_scale(const float* x, uint32_t n) {
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        if (!std::isfinite(x[i])) return NAN;
        amax = std::fmax(amax, std::fabs(x[i]));
    }
    return amax / 127.0f;
}
// x as a multiple of scale, ties to even (0 where the scale is 0 or NaN)
inline int8_t quant_value(float x, float scale) {
    if (!(scale > 0.0f)) return 0;
    const float q = std::nearbyint(x / scale);
    return (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}

// `rows` rows of layout.values values each, end to end in x -> quantized rows end to end in out
inline void quantize_int8(uint8_t* out, const float* x, const QuantRows& layout, int rows) {
    const size_t stride = layout.row_stride();
#pragma omp parallel for collapse(2)
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < layout.blocks; b++) {
            const QuantBlock blk = layout.host[b];
            const float* src = x + (size_t)r * layout.values + blk.offset;
            uint8_t* row = out + (size_t)r * stride;
            const float scale = quant_scale(src, blk.n);
            memcpy(row + (size_t)b * sizeof(float), &scale, sizeof(float));
            int8_t* q = (int8_t*)(row + layout.scales_bytes() + blk.offset);
            for (uint32_t i = 0; i < blk.n; i++) q[i] = quant_value(src[i], scale);
        }
}

// block b of a quantized row, dequantized into out[0..n). Not inlined: its products reach the
// caller rounded to fp32, so a sum of them cannot be fused into FMAs (g++ fuses by default in
// C++), and adds what the GPU adds (kernels/cuda/quantize.cuh) and the NumPy reference
[[gnu::noinline]] inline void dequantize_block(float* out, const uint8_t* row, const QuantRows& layout, int b) {
    const QuantBlock blk = layout.host[b];
    float scale;
    memcpy(&scale, row + (size_t)b * sizeof(float), sizeof(float));
    const int8_t* q = (const int8_t*)(row + layout.scales_bytes() + blk.offset);
    for (uint32_t i = 0; i < blk.n; i++) out[i] = (float)q[i] * scale;
}

// quantized rows end to end in `in` -> `rows` rows of values end to end in x
inline void dequantize_int8(float* x, const uint8_t* in, const QuantRows& layout, int rows) {
    const size_t stride = layout.row_stride();
#pragma omp parallel for collapse(2)
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < layout.blocks; b++)
            dequantize_block(x + (size_t)r * layout.values + layout.host[b].offset, in + (size_t)r * stride, layout, b);
}

// out = the sum of the `rows` quantized rows in `in`, dequantized, added in fp32 in row order
inline void dequantize_sum_int8(float* out, const uint8_t* in, const QuantRows& layout, int rows) {
    const size_t stride = layout.row_stride();
#pragma omp parallel for
    for (int b = 0; b < layout.blocks; b++) {
        const QuantBlock blk = layout.host[b];
        float* sum = out + blk.offset;
        float values[kQuantBlock];
        for (uint32_t i = 0; i < blk.n; i++) sum[i] = 0.0f;
        for (int r = 0; r < rows; r++) {
            dequantize_block(values, in + (size_t)r * stride, layout, b);
            for (uint32_t i = 0; i < blk.n; i++) sum[i] += values[i];
        }
    }
}

}  // namespace cpu
