// Block-wise int8 quantization (kernels/quantize_blocks.h: blocks, row layout, why; the CPU
// kernels in kernels/cpu/quantize.h are the reference these are tested against, bit for bit).
// A warp takes one block of one row: each lane 8 values strided by 32 (coalesced), the block's
// maximum in one shuffle reduction. The arithmetic is the CPU's: IEEE division, rintf (ties to
// even), fp32 products and an fp32 sum in row order, so both give the same bytes and values.
#pragma once
#include "../quantize_blocks.h"
#include "common.cuh"

namespace gpu {

constexpr int kQuantWarps = 8;  // warps (blocks of values) per thread block
constexpr int kQuantPerLane = kQuantBlock / kWarp;
static_assert(kQuantBlock % kWarp == 0, "a block of values is whole lanes' work");

// the warp's block of values for this thread block and blockIdx.y's row; false: none left
__device__ inline bool quant_block_of_warp(const QuantBlock* blocks, int count, QuantBlock* out) {
    const int b = blockIdx.x * kQuantWarps + threadIdx.x / kWarp;
    if (b >= count) return false;
    *out = blocks[b];
    return true;
}

template <class T>
__global__ void quantize_int8_kernel(uint8_t* out, const T* x, const QuantBlock* blocks, int count, size_t values,
                                     size_t row_stride) {
    QuantBlock blk;
    if (!quant_block_of_warp(blocks, count, &blk)) return;
    const int lane = threadIdx.x % kWarp, b = blockIdx.x * kQuantWarps + threadIdx.x / kWarp;
    const T* src = x + blockIdx.y * values + blk.offset;
    float v[kQuantPerLane], amax = 0.0f;
    bool finite = true;
    for (int k = 0; k < kQuantPerLane; k++) {
        const uint32_t i = lane + k * kWarp;
        v[k] = i < blk.n ? (float)src[i] : 0.0f;
        finite &= isfinite(v[k]);
        amax = fmaxf(amax, fabsf(v[k]));
    }
    amax = warp_max(amax);
    const float scale = __all_sync(0xffffffffu, finite) ? amax / 127.0f : __int_as_float(0x7fc00000);  // NaN
    uint8_t* row = out + blockIdx.y * row_stride;
    if (lane == 0) reinterpret_cast<float*>(row)[b] = scale;
    int8_t* q = reinterpret_cast<int8_t*>(row + (size_t)count * sizeof(float) + blk.offset);
    for (int k = 0; k < kQuantPerLane; k++) {
        const uint32_t i = lane + k * kWarp;
        if (i >= blk.n) break;
        const float r = scale > 0.0f ? rintf(v[k] / scale) : 0.0f;
        q[i] = (int8_t)fminf(fmaxf(r, -127.0f), 127.0f);
    }
}

// SUM: out gets the fp32 sum of every row's dequantized values (rows in order); else each row is
// dequantized into its own row of out
template <bool SUM, class T>
__global__ void dequantize_int8_kernel(T* out, const uint8_t* in, const QuantBlock* blocks, int count, size_t values,
                                       size_t row_stride, int rows) {
    QuantBlock blk;
    if (!quant_block_of_warp(blocks, count, &blk)) return;
    const int lane = threadIdx.x % kWarp, b = blockIdx.x * kQuantWarps + threadIdx.x / kWarp;
    float sum[kQuantPerLane] = {};
    for (int r = SUM ? 0 : (int)blockIdx.y; r < (SUM ? rows : (int)blockIdx.y + 1); r++) {
        const uint8_t* row = in + r * row_stride;
        const float scale = reinterpret_cast<const float*>(row)[b];
        const int8_t* q = reinterpret_cast<const int8_t*>(row + (size_t)count * sizeof(float) + blk.offset);
        for (int k = 0; k < kQuantPerLane; k++) {
            const uint32_t i = lane + k * kWarp;
            if (i < blk.n) sum[k] = __fadd_rn(sum[k], __fmul_rn((float)q[i], scale));  // no FMA: the CPU's rounding
        }
    }
    T* dst = out + (SUM ? 0 : blockIdx.y * values) + blk.offset;
    for (int k = 0; k < kQuantPerLane; k++) {
        const uint32_t i = lane + k * kWarp;
        if (i < blk.n) dst[i] = (T)sum[k];
    }
}

inline dim3 quant_grid(const QuantRows& layout, int rows) { return dim3(ceil_div(layout.blocks, kQuantWarps), rows); }

// `rows` rows of layout.values values, end to end in x -> quantized rows end to end in out
template <class T>
inline void quantize_int8(uint8_t* out, const T* x, const QuantRows& layout, int rows) {
    if (layout.blocks == 0 || rows == 0) return;
    quantize_int8_kernel<<<quant_grid(layout, rows), kQuantWarps * kWarp, 0, stream()>>>(out, x, layout.device, layout.blocks,
                                                                                         layout.values, layout.row_stride());
    check_launch();
}
// quantized rows end to end in `in` -> `rows` rows of values end to end in x
template <class T>
inline void dequantize_int8(T* x, const uint8_t* in, const QuantRows& layout, int rows) {
    if (layout.blocks == 0 || rows == 0) return;
    dequantize_int8_kernel<false><<<quant_grid(layout, rows), kQuantWarps * kWarp, 0, stream()>>>(
        x, in, layout.device, layout.blocks, layout.values, layout.row_stride(), rows);
    check_launch();
}
// out = the sum of the `rows` quantized rows in `in`, dequantized, added in fp32 in row order
template <class T>
inline void dequantize_sum_int8(T* out, const uint8_t* in, const QuantRows& layout, int rows) {
    if (layout.blocks == 0) return;
    dequantize_int8_kernel<true><<<quant_grid(layout, 1), kQuantWarps * kWarp, 0, stream()>>>(
        out, in, layout.device, layout.blocks, layout.values, layout.row_stride(), rows);
    check_launch();
}

}  // namespace gpu
