// Block-wise int8 quantization for the collectives (zero/: --quantize-weights, --quantize-grads):
// how a row of values is cut into blocks and laid out, shared by both backends' kernels
// (kernels/cpu/quantize.h says what they compute) and zero/.
//
// Each block travels as int8 values with one fp32 scale, the block's largest magnitude / 127;
// a value becomes the nearest multiple of the scale (ties to even), so dequantized it is off by
// at most half a scale, max|block| / 254. A block holding a NaN or an infinity gets a NaN scale
// and dequantizes to NaN: a non-finite gradient stays non-finite (train/nonfinite.h sees it).
//
// Block size: at most kQuantBlock = 256 consecutive values of one tensor (a tensor's piece ends
// a block). One tensor only, because one scale over a layernorm weight (about 1) and a matrix
// (about 0.02) would leave the matrix a handful of levels. 256 because the scale then adds 4
// bytes to 256 (a row takes 0.254 of its fp32 bytes, 0.508 of its bf16 ones, plus a scale per
// tensor piece), one outlier coarsens at most 255 neighbours, and on the GPU a block is one
// warp's work (32 lanes x 8 values, one shuffle reduction for its maximum).
//
// A quantized row: the scales (fp32, one per block, in order), then the int8 values in the
// row's order, padded to 4 bytes, so that rows laid end to end keep their scales aligned. Rows
// lie row_stride() bytes apart: end to end, or further where rows of several layouts share
// one buffer (zero/'s all-to-all across shard groups).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

constexpr uint32_t kQuantBlock = 256;

struct QuantBlock {
    uint64_t offset;  // of its first value in the row
    uint32_t n;       // values, 1..kQuantBlock
};

// the blocks of a row, as the kernels take them (in host and in backend memory)
struct QuantRows {
    const QuantBlock* host = nullptr;
    const QuantBlock* device = nullptr;
    int blocks = 0;
    size_t values = 0;  // per row: the blocks cover [0, values) in order
    size_t stride = 0;  // bytes from one quantized row to the next; 0: row_bytes()
    size_t scales_bytes() const { return (size_t)blocks * sizeof(float); }
    size_t row_bytes() const { return scales_bytes() + (values + 3) / 4 * 4; }
    size_t row_stride() const { return stride > 0 ? stride : row_bytes(); }
};

// the blocks of a row made of tensor pieces of these lengths, one after another
inline std::vector<QuantBlock> quant_blocks(const std::vector<size_t>& pieces) {
    std::vector<QuantBlock> blocks;
    uint64_t at = 0;
    for (size_t len : pieces) {
        for (size_t i = 0; i < len; i += kQuantBlock) {
            const uint32_t n = (uint32_t)(len - i < kQuantBlock ? len - i : kQuantBlock);
            blocks.push_back({at + i, n});
        }
        at += len;
    }
    return blocks;
}
