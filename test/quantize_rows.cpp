// The CPU backend's block-wise int8 quantization (kernels/cpu/quantize.h) run on rows of values
// from a file, for test/test_quantize.py, which checks it against its NumPy reference.
//   quantize_rows IN OUT
// IN: int32 rows, int32 pieces, the pieces' lengths (int32, the tensor pieces a row is made of),
//     then rows x values float32. OUT: the quantized rows (kernels/quantize_blocks.h's layout),
//     the rows dequantized (float32), and the dequantized rows' sum (float32).
#include <cstdio>
#include <vector>

#include "common/io.h"
#include "kernels/cpu/quantize.h"

int main(int argc, char** argv) {
    if (argc != 3) fatal(2, "usage: quantize_rows IN OUT");
    FILE* in = open_file(argv[1], "rb");
    int32_t rows = 0, count = 0;
    read_exact(&rows, 4, in, argv[1], "rows");
    read_exact(&count, 4, in, argv[1], "pieces");
    std::vector<int32_t> lengths(count);
    read_exact(lengths.data(), 4 * (size_t)count, in, argv[1], "piece lengths");
    std::vector<size_t> pieces(lengths.begin(), lengths.end());
    const std::vector<QuantBlock> blocks = quant_blocks(pieces);
    QuantRows layout;
    layout.host = blocks.data();
    layout.blocks = (int)blocks.size();
    for (size_t len : pieces) layout.values += len;
    std::vector<float> x((size_t)rows * layout.values), back(x.size()), sum(layout.values);
    read_exact(x.data(), x.size() * 4, in, argv[1], "values");
    fclose(in);
    std::vector<uint8_t> quantized((size_t)rows * layout.row_bytes());
    cpu::quantize_int8(quantized.data(), x.data(), layout, rows);
    cpu::dequantize_int8(back.data(), quantized.data(), layout, rows);
    cpu::dequantize_sum_int8(sum.data(), quantized.data(), layout, rows);
    FILE* out = open_file(argv[2], "wb");
    write_exact(quantized.data(), quantized.size(), out, argv[2]);
    write_exact(back.data(), back.size() * 4, out, argv[2]);
    write_exact(sum.data(), sum.size() * 4, out, argv[2]);
    fclose(out);
    return 0;
}
