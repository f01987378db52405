// The model file of a checkpoint, in llm.c's format (model_N.bin: the model's shape and its
// parameters; the state beside it, state_N.bin, is train/state_file.h's). Its parameter order is
// llm.c's, which is also the order of the flat parameter buffer the trainer and zero/ work on
// (model/shape.h's ParamLayout).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/bf16.h"
#include "../common/io.h"
#include "../model/shape.h"

// ----------------------------------------------------------------------------
// model_N.bin: int32 header[256]: magic 20240326, version, maxT, V, L, NH, C, Vp; then the
// parameters in ParamLayout's order, fp32 (version 3) or bf16 (version 5). llm.c's fp32 build
// writes 3 and its bf16 build 5, and each reads only its own; here both are read, and each build
// writes what llm.c's build of the same precision writes.

constexpr int kCheckpointMagic = 20240326;
constexpr int kCheckpointFp32 = 3, kCheckpointBf16 = 5;
constexpr FileFormat kCheckpointFormat{"checkpoint", "the checkpoint header", kCheckpointMagic, 0};  // 3 or 5

// the version for parameters of param_bytes bytes each (fp32: 4, bf16: 2)
constexpr int checkpoint_version(size_t param_bytes) { return param_bytes == 2 ? kCheckpointBf16 : kCheckpointFp32; }

// the header of an open checkpoint -> *c, checked against itself and the file's size; returns
// the bytes per parameter (4 or 2)
inline size_t read_checkpoint_header(FILE* f, const std::string& path, GPT2Config* c) {
    const FileHeader h = read_header(f, path, kCheckpointFormat);
    if (h[1] != kCheckpointFp32 && h[1] != kCheckpointBf16)
        fatal(1, "%s: unsupported checkpoint version %d (expected 3 for fp32 or 5 for bf16)", path.c_str(), h[1]);
    c->max_seq_len = h[2];
    c->vocab_size = h[3];
    c->num_layers = h[4];
    c->num_heads = h[5];
    c->channels = h[6];
    c->padded_vocab_size = h[7];
    bool in_range = h[7] > 0 && h[7] <= kMaxPaddedVocab;
    for (int i = 2; i <= 6; i++) in_range = in_range && h[i] > 0 && h[i] <= kMaxDimension;
    if (!in_range || h[6] % h[5] != 0 || h[7] < h[3])
        fatal(1, "%s: inconsistent checkpoint header (maxT=%d V=%d L=%d NH=%d C=%d Vp=%d; expected each in 1..%d, Vp in V..%d, NH dividing C)",
              path.c_str(), h[2], h[3], h[4], h[5], h[6], h[7], kMaxDimension, kMaxPaddedVocab);
    // within those ranges the count cannot overflow; the file's size bounds it before any allocation
    const size_t elem = h[1] == kCheckpointFp32 ? 4 : 2, params = ParamLayout(*c).total, size = file_size(f);
    if (size < kHeaderBytes || !fits_in(params, elem, size - kHeaderBytes) || size != kHeaderBytes + params * elem)
        fatal(1, "%s: checkpoint is %zu bytes, expected %.0f for this header (%zu parameters of %zu bytes)", path.c_str(), size,
              (double)kHeaderBytes + (double)params * elem, params, elem);
    return elem;
}

// the model's shape alone, without reading its parameters
inline GPT2Config checkpoint_config(const std::string& path) {
    FILE* f = open_file(path, "rb");
    GPT2Config c;
    read_checkpoint_header(f, path, &c);
    fclose(f);
    return c;
}

// Parameters [first, first + n) of the open checkpoint f, of `elem` bytes each
// (read_checkpoint_header's) -> fp32 in out, which must be finite. `path` names the file in the
// error (a rank reading its part says which it is).
inline void read_params(FILE* f, const std::string& path, const GPT2Config& c, size_t elem, size_t first, size_t n, float* out) {
    pread_exact(fileno(f), out, n * elem, kHeaderBytes + first * elem, path, "parameters");
    if (elem == 2) {  // widened in place from the end, where no bf16 value is overwritten before it is read
        const uint16_t* raw = (const uint16_t*)out;
        for (size_t i = n; i-- > 0;) out[i] = bf16_bits_to_float(raw[i]);
    }
    const std::string bad = find_bad_value(out, first, n, c, false);
    if (!bad.empty()) fatal(1, "%s: parameter %s; a model file must hold finite values (it comes from a run that diverged, or is damaged)", path.c_str(), bad.c_str());
}

inline std::vector<float> load_checkpoint(const std::string& path, GPT2Config* c) {
    FILE* f = open_file(path, "rb");
    const size_t elem = read_checkpoint_header(f, path, c);
    std::vector<float> params(ParamLayout(*c).total);
    read_params(f, path, *c, elem, 0, params.size(), params.data());
    fclose(f);
    return params;
}

// kept: what a failed write leaves intact (AtomicFile's)
inline void write_checkpoint(const std::string& path, const GPT2Config& c, const std::vector<float>& params, int version,
                             const std::string& kept = "") {
    int32_t h[kHeaderInts] = {kCheckpointMagic, version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size};
    AtomicFile f(path, kept);
    f.write(h, sizeof(h));
    if (version == kCheckpointFp32) {
        f.write(params.data(), params.size() * sizeof(float));
    } else {
        std::vector<uint16_t> bf16(params.size());
        for (size_t i = 0; i < params.size(); i++) bf16[i] = float_to_bf16_bits(params[i]);
        f.write(bf16.data(), bf16.size() * sizeof(uint16_t));
    }
    f.commit();
}
