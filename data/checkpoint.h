// The files of a checkpoint, in llm.c's formats: the model (model_N.bin: its shape and its
// parameters) and the state beside it (state_N.bin: what -y 1 needs besides the parameters to
// continue bit for bit). The model file's parameter order is llm.c's, which is also the order of
// the flat parameter buffer the trainer and zero/ work on (model/shape.h's ParamLayout).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/bf16.h"
#include "../common/io.h"
#include "../model/shape.h"
#include "../train/outlier_detector.h"
#include "dataloader.h"

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
    if (h[2] <= 0 || h[3] <= 0 || h[4] <= 0 || h[5] <= 0 || h[6] <= 0 || h[6] % h[5] != 0 || h[7] < h[3])
        fatal(1, "%s: inconsistent checkpoint header (maxT=%d V=%d L=%d NH=%d C=%d Vp=%d)", path.c_str(), h[2], h[3], h[4], h[5], h[6], h[7]);
    const size_t elem = h[1] == kCheckpointFp32 ? 4 : 2, expected = kHeaderBytes + ParamLayout(*c).total * elem;
    if (file_size(f) != expected)
        fatal(1, "%s: checkpoint is %zu bytes, expected %zu for this header", path.c_str(), file_size(f), expected);
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

inline std::vector<float> load_checkpoint(const std::string& path, GPT2Config* c) {
    FILE* f = open_file(path, "rb");
    const size_t elem = read_checkpoint_header(f, path, c);
    const size_t total = ParamLayout(*c).total;
    std::vector<float> params(total);
    if (elem == 4) {
        read_exact(params.data(), total * 4, f, path, "parameters");
    } else {
        std::vector<uint16_t> raw(total);
        read_exact(raw.data(), total * 2, f, path, "parameters");
        for (size_t i = 0; i < raw.size(); i++) params[i] = bf16_bits_to_float(raw[i]);
    }
    fclose(f);
    return params;
}

inline void write_checkpoint(const std::string& path, const GPT2Config& c, const std::vector<float>& params, int version) {
    int32_t h[kHeaderInts] = {kCheckpointMagic, version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size};
    AtomicFile f(path);
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

// ----------------------------------------------------------------------------
// state_N.bin: int32 header[256]: magic 20240527, version 3 (llm.c's version 1 keeps one file
// per rank; this one is unsharded, so a run may resume with another ZeRO stage or world size),
// completed steps, 1 if master weights follow, then as uint64 from int 4 on: the parameter
// count, the sampling generator's state, and the training loader's position (windows read by
// all ranks), window size, windows per epoch and shuffle seed; int 16: 1 if shuffled. Then fp32
// m, v and, if present, the fp32 master weights (where llm.c keeps them too: a bf16 model file
// holds only the rounded parameters), each in the checkpoint's parameter order; if shuffled,
// the current epoch's window order (uint32 per window); then the loss and gradient-norm outlier
// detectors (OutlierDetector::State each).
constexpr int kStateMagic = 20240527;
constexpr int kStateVersion = 3;
constexpr FileFormat kStateFormat{"optimizer state", "the state header", kStateMagic, kStateVersion};

struct OptimizerState {
    int step = 0;
    uint64_t sample_rng = 0;
    std::vector<float> m, v, master;  // master empty when the run keeps none
    LoaderState loader;
    OutlierDetector::State loss_z{}, grad_z{};
};

inline void write_state(const std::string& path, const OptimizerState& s) {
    int32_t h[kHeaderInts] = {kStateMagic, kStateVersion, s.step, s.master.empty() ? 0 : 1};
    const uint64_t u64[] = {s.m.size(), s.sample_rng, s.loader.position, s.loader.window, s.loader.windows, s.loader.seed};
    memcpy(h + 4, u64, sizeof(u64));
    h[16] = s.loader.shuffled;
    AtomicFile f(path);
    f.write(h, sizeof(h));
    for (const auto* x : {&s.m, &s.v, &s.master}) f.write(x->data(), x->size() * sizeof(float));
    f.write(s.loader.order.data(), s.loader.order.size() * sizeof(uint32_t));
    f.write(&s.loss_z, sizeof(s.loss_z));
    f.write(&s.grad_z, sizeof(s.grad_z));
    f.commit();
}

inline OptimizerState read_state(const std::string& path, size_t num_params, bool want_master) {
    FILE* f = open_file(path, "rb");
    const FileHeader h = read_header(f, path, kStateFormat);
    OptimizerState s;
    uint64_t u64[6];
    memcpy(u64, h.field + 4, sizeof(u64));
    const uint64_t count = u64[0];
    s.step = h[2];
    s.sample_rng = u64[1];
    s.loader.position = u64[2], s.loader.window = u64[3], s.loader.windows = u64[4], s.loader.seed = u64[5];
    s.loader.shuffled = h[16];
    if (count != num_params) fatal(1, "%s: state for %llu parameters, the model has %zu", path.c_str(), (unsigned long long)count, num_params);
    const size_t arrays = h[3] ? 3 : 2, order = s.loader.shuffled ? s.loader.windows : 0;
    const size_t expected = kHeaderBytes + arrays * count * sizeof(float) + order * sizeof(uint32_t) + 2 * sizeof(OutlierDetector::State);
    if (file_size(f) != expected) fatal(1, "%s: optimizer state is %zu bytes, expected %zu", path.c_str(), file_size(f), expected);
    for (auto* x : {&s.m, &s.v}) {
        x->resize(count);
        read_exact(x->data(), count * sizeof(float), f, path, "optimizer state");
    }
    if (h[3] && want_master) {
        s.master.resize(count);
        read_exact(s.master.data(), count * sizeof(float), f, path, "master weights");
    } else if (h[3]) {
        fseek(f, (long)(count * sizeof(float)), SEEK_CUR);
    }
    s.loader.order.resize(order);
    read_exact(s.loader.order.data(), order * sizeof(uint32_t), f, path, "the window order");
    read_exact(&s.loss_z, sizeof(s.loss_z), f, path, "the outlier detectors");
    read_exact(&s.grad_z, sizeof(s.grad_z), f, path, "the outlier detectors");
    fclose(f);
    return s;
}
