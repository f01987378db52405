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

// kept: what a failed write leaves intact (AtomicFile's)
inline void write_state(const std::string& path, const OptimizerState& s, const std::string& kept = "") {
    int32_t h[kHeaderInts] = {kStateMagic, kStateVersion, s.step, s.master.empty() ? 0 : 1};
    const uint64_t u64[] = {s.m.size(), s.sample_rng, s.loader.position, s.loader.window, s.loader.windows, s.loader.seed};
    memcpy(h + 4, u64, sizeof(u64));
    h[16] = s.loader.shuffled;
    AtomicFile f(path, kept);
    f.write(h, sizeof(h));
    for (const auto* x : {&s.m, &s.v, &s.master}) f.write(x->data(), x->size() * sizeof(float));
    f.write(s.loader.order.data(), s.loader.order.size() * sizeof(uint32_t));
    f.write(&s.loss_z, sizeof(s.loss_z));
    f.write(&s.grad_z, sizeof(s.grad_z));
    f.commit();
}

// The state of the checkpoint at `step` of model c. Every count is checked against the model and
// the file's size before anything is allocated, and m, v and the master weights must be finite
// (v not negative): one line naming the file and what was wrong.
inline OptimizerState read_state(const std::string& path, int step, const GPT2Config& c, bool want_master) {
    FILE* f = open_file(path, "rb");
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
    const size_t arrays = h[3] ? 3 : 2, array_bytes = arrays * count * sizeof(float), detectors = 2 * sizeof(OutlierDetector::State);
    const size_t size = file_size(f), fixed = kHeaderBytes + array_bytes + detectors;
    const uint64_t order = s.loader.shuffled ? s.loader.windows : 0;
    if (size < fixed || !fits_in(order, sizeof(uint32_t), size - fixed) || size != fixed + order * sizeof(uint32_t))
        fatal(1, "%s: optimizer state is %zu bytes, expected %.0f for %llu parameters%s and %llu windows in the order", path.c_str(), size,
              (double)fixed + (double)order * sizeof(uint32_t), (unsigned long long)count, h[3] ? " with master weights" : "",
              (unsigned long long)order);
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
    struct { const char* name; const std::vector<float>& values; bool nonnegative; } arrays_read[] = {
        {"Adam m", s.m, false}, {"Adam v", s.v, true}, {"master weight", s.master, false}};
    for (const auto& a : arrays_read) {
        const std::string bad = a.values.empty() ? "" : find_bad_value(a.values.data(), c, a.nonnegative);
        if (!bad.empty()) fatal(1, "%s: %s of %s; the state must hold finite values (v not negative): the file is damaged", path.c_str(), a.name, bad.c_str());
    }
    return s;
}
