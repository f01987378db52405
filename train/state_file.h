// The state file of a checkpoint (state_N.bin, ours, beside llm.c's model_N.bin): what -y 1
// needs besides the parameters to continue bit for bit, from the optimizer, the loader, the
// sampler and the outlier detectors.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/io.h"
#include "../data/dataloader.h"
#include "../model/shape.h"
#include "outlier_detector.h"

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

// the state file's arrays, in their order: m, v, then the master weights where it has them
constexpr const char* kStateArrayNames[] = {"Adam m", "Adam v", "master weight"};
// where array `index` of a state file for `count` parameters begins, and (index = the number of
// arrays) where its tail begins
inline size_t state_array_offset(int index, uint64_t count) { return kHeaderBytes + (size_t)index * count * sizeof(float); }

// the header of state s for `count` parameters, with or without master weights
inline FileHeader state_header(const OptimizerState& s, uint64_t count, bool master) {
    FileHeader h{};
    int32_t first[] = {kStateMagic, kStateVersion, s.step, master ? 1 : 0};
    memcpy(h.field, first, sizeof(first));
    const uint64_t u64[] = {count, s.sample_rng, s.loader.position, s.loader.window, s.loader.windows, s.loader.seed};
    memcpy(h.field + 4, u64, sizeof(u64));
    h.field[16] = s.loader.shuffled;
    return h;
}
// what follows the arrays: the loader's window order, the outlier detectors
inline std::vector<char> state_tail(const OptimizerState& s) {
    const size_t order = s.loader.order.size() * sizeof(uint32_t);
    std::vector<char> tail(order + 2 * sizeof(OutlierDetector::State));
    memcpy(tail.data(), s.loader.order.data(), order);
    memcpy(tail.data() + order, &s.loss_z, sizeof(s.loss_z));
    memcpy(tail.data() + order + sizeof(s.loss_z), &s.grad_z, sizeof(s.grad_z));
    return tail;
}

// The whole state in one file, from one process (a checkpoint's ranks write theirs at offsets,
// train/sharded_checkpoint.h). kept: what a failed write leaves intact (AtomicFile's)
inline void write_state(const std::string& path, const OptimizerState& s, const std::string& kept = "") {
    const FileHeader h = state_header(s, s.m.size(), !s.master.empty());
    const std::vector<char> tail = state_tail(s);
    AtomicFile f(path, kept);
    f.write(h.field, sizeof(h.field));
    for (const auto* x : {&s.m, &s.v, &s.master}) f.write(x->data(), x->size() * sizeof(float));
    f.write(tail.data(), tail.size());
    f.commit();
}

// Values [first, first + n) of the state's array `index`: finite (v not negative), else one line
// naming the file and the value, and exit 1.
inline void check_state_values(const std::string& path, int index, const float* x, size_t first, size_t n, const GPT2Config& c) {
    const std::string bad = find_bad_value(x, first, n, c, index == 1);
    if (!bad.empty())
        fatal(1, "%s: %s of %s; the state must hold finite values (v not negative): the file is damaged", path.c_str(), kStateArrayNames[index], bad.c_str());
}

// All of the state file f at `step` of model c but its arrays (the header, checked against the
// model and the file's size before anything is allocated, and the tail); *has_master: whether
// it holds master weights. One line naming the file and what was wrong.
inline OptimizerState read_state_except_arrays(FILE* f, const std::string& path, int step, const GPT2Config& c, bool* has_master) {
    const FileHeader h = read_header(f, path, kStateFormat);
    OptimizerState s;
    uint64_t u64[6];
    memcpy(u64, h.field + 4, sizeof(u64));
    const uint64_t count = u64[0], num_params = ParamLayout(c).total;
    s.step = h[2];
    s.sample_rng = u64[1];
    s.loader.position = u64[2], s.loader.window = u64[3], s.loader.windows = u64[4], s.loader.seed = u64[5];
    s.loader.shuffled = h[16];
    if (s.step != step) fatal(1, "%s: state of step %d, expected %d (the step its checkpoint is named by)", path.c_str(), s.step, step);
    if ((h[3] != 0 && h[3] != 1) || (h[16] != 0 && h[16] != 1))
        fatal(1, "%s: state header flags: master weights %d, shuffled %d (expected 0 or 1 each)", path.c_str(), h[3], h[16]);
    if (count != num_params) fatal(1, "%s: state for %llu parameters, the model has %llu", path.c_str(), (unsigned long long)count, (unsigned long long)num_params);
    // count is the model's, so the arrays' bytes cannot overflow; the window order's count is the file's
    const int arrays = h[3] ? 3 : 2;
    const size_t detectors = 2 * sizeof(OutlierDetector::State);
    const size_t size = file_size(f), fixed = state_array_offset(arrays, count) + detectors;
    const uint64_t order = s.loader.shuffled ? s.loader.windows : 0;
    if (size < fixed || !fits_in(order, sizeof(uint32_t), size - fixed) || size != fixed + order * sizeof(uint32_t))
        fatal(1, "%s: optimizer state is %zu bytes, expected %.0f for %llu parameters%s and %llu windows in the order", path.c_str(), size,
              (double)fixed + (double)order * sizeof(uint32_t), (unsigned long long)count, h[3] ? " with master weights" : "",
              (unsigned long long)order);
    if (fseeko(f, (off_t)state_array_offset(arrays, count), SEEK_SET) != 0)
        fatal(1, "%s: cannot seek to the window order: %s", path.c_str(), strerror(errno));
    s.loader.order.resize(order);
    read_exact(s.loader.order.data(), order * sizeof(uint32_t), f, path, "the window order");
    read_exact(&s.loss_z, sizeof(s.loss_z), f, path, "the outlier detectors");
    read_exact(&s.grad_z, sizeof(s.grad_z), f, path, "the outlier detectors");
    *has_master = h[3] == 1;
    return s;
}

// The whole state of the checkpoint at `step` of model c, m, v and the master weights (if the
// file has them and `want_master`) finite (v not negative).
inline OptimizerState read_state(const std::string& path, int step, const GPT2Config& c, bool want_master) {
    FILE* f = open_file(path, "rb");
    bool has_master = false;
    OptimizerState s = read_state_except_arrays(f, path, step, c, &has_master);
    const size_t count = ParamLayout(c).total;
    std::vector<float>* arrays[] = {&s.m, &s.v, &s.master};
    for (int i = 0; i < (has_master && want_master ? 3 : 2); i++) {
        if (fseeko(f, (off_t)state_array_offset(i, count), SEEK_SET) != 0)
            fatal(1, "%s: cannot seek to %s: %s", path.c_str(), kStateArrayNames[i], strerror(errno));
        arrays[i]->resize(count);
        read_exact(arrays[i]->data(), count * sizeof(float), f, path, "optimizer state");
        check_state_values(path, i, arrays[i]->data(), 0, count, c);
    }
    fclose(f);
    return s;
}
