// Shared by the C++ tests: the trainer itself (without its main), a one-rank communicator, and
// small helpers to read the PyTorch debug state and to write token shards.
#pragma once
#define TESTING
#include "train_gpt.cu"
#include "zero/comm_single.h"
#include "tolerance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

inline SingleComm& single_comm() {
    static SingleComm comm(CpuBackend::copy);
    return comm;
}

// The debug state written by scripts/gpt2_reference.py (format described there).
struct DebugState {
    int B, T, steps, V, Vp, accum;  // B rows in x and y: accum micro-batches of B / accum
    size_t num_params;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    std::vector<int> x, y;
    std::vector<float> logits, grads, losses, norms, params_after;
    float loss;

    explicit DebugState(const std::string& path) {
        FILE* f = open_file(path, "rb");
        int32_t h[256];
        float hyper[8];
        read_exact(h, sizeof(h), f, path, "header");
        if (h[0] != 20240327 || h[1] != 3) fatal(1, "%s: not a version 3 debug state", path.c_str());
        B = h[2], T = h[3], steps = h[4], V = h[5], Vp = h[6], num_params = (size_t)h[7], accum = h[8];
        if (accum < 1 || B % accum != 0) fatal(1, "%s: %d rows do not split into %d micro-batches", path.c_str(), B, accum);
        read_exact(hyper, sizeof(hyper), f, path, "hyperparameters");
        lr = hyper[0], beta1 = hyper[1], beta2 = hyper[2], eps = hyper[3], weight_decay = hyper[4], grad_clip = hyper[5];
        auto read = [&](auto& v, size_t n) {
            v.resize(n);
            read_exact(v.data(), n * sizeof(v[0]), f, path, "data");
        };
        read(x, (size_t)B * T);
        read(y, (size_t)B * T);
        read(logits, (size_t)B * T * V);
        read_exact(&loss, 4, f, path, "loss");
        read(grads, num_params);
        read(losses, (size_t)steps);
        read(norms, (size_t)steps);
        read(params_after, num_params);
        fclose(f);
    }
};

inline void write_bytes(const std::string& path, const void* data, size_t n) {
    FILE* f = open_file(path, "wb");
    write_exact(data, n, f, path);
    fclose(f);
}

inline std::vector<char> read_bytes(const std::string& path) {
    FILE* f = open_file(path, "rb");
    std::vector<char> b(file_size(f));
    read_exact(b.data(), b.size(), f, path, "all");
    fclose(f);
    return b;
}

inline void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
    int32_t h[256] = {kShardMagic, kShardVersion, (int32_t)tokens.size()};
    FILE* f = open_file(path, "wb");
    fwrite(h, sizeof(h), 1, f);
    fwrite(tokens.data(), 2, tokens.size(), f);
    fclose(f);
}

// tokens drawn uniformly below vocab, from a fixed seed
inline std::vector<uint16_t> random_tokens(size_t n, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint16_t> t(n);
    for (auto& x : t) x = (uint16_t)(rng() % vocab);
    return t;
}

// ----------------------------------------------------------------------------
// checks shared by the CPU tests and the CUDA tests (test/test_kernels_cuda.cu)

// What the model computes for the debug state's batch, on any backend, as fp32 on the host:
// loss and logits, every gradient (flat layout), and the losses, norms and parameters of
// `steps` AdamW steps with the state's hyperparameters.
struct ModelRun {
    float loss;
    std::vector<float> logits, grads, losses, norms, params;
};

// the gradients zero holds at stage 0 (the full buffer), in the flat layout
template <class Backend>
std::vector<float> gradients_to_host(Zero<Backend>& zero) {
    std::vector<float> out(zero.plan().total());
    for (int g = 0; g < zero.plan().num_groups(); g++) {
        auto grads = zero.grads(g);
        const auto& tensors = zero.plan().group(g).tensors;
        for (size_t i = 0; i < tensors.size(); i++)
            Backend::download_fp32(out.data() + tensors[i].slice.offset, grads[i], tensors[i].slice.n);
    }
    return out;
}

template <class Backend>
ModelRun run_debug_state(const DebugState& s, const GPT2Config& c, const std::vector<float>& init) {
    SingleComm comm(Backend::copy);
    Zero<Backend> zero(0, param_groups(c), comm);
    zero.load(init.data());
    GPT2<Backend> model(c, s.B, s.T, 0, zero);
    LossSum<Backend> loss;
    ModelRun run;
    model.forward(s.x.data(), s.y.data(), s.B, s.T, 0.0f);
    loss.add_batch_mean(model.device_losses(), s.B * s.T);
    run.loss = (float)loss.take();
    run.logits.resize((size_t)s.B * s.T * s.V);
    for (int row = 0; row < s.B * s.T; row++) model.logits_at(row, run.logits.data() + (size_t)row * s.V);

    zero.zero_grads();
    model.forward(s.x.data(), s.y.data(), s.B, s.T, 1.0f / (s.B * s.T));
    model.backward(s.B, s.T);
    run.grads = gradients_to_host(zero);

    zero.load(init.data());  // the steps start from the same parameters
    for (int step = 0; step < s.steps; step++) {
        zero.zero_grads();
        model.forward(s.x.data(), s.y.data(), s.B, s.T, 1.0f / (s.B * s.T));
        loss.add_batch_mean(model.device_losses(), s.B * s.T);
        run.losses.push_back((float)loss.take());
        model.backward(s.B, s.T);
        const float norm = zero.grad_norm();
        zero.update(AdamWStep{s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, clip_scale(norm, s.grad_clip), step + 1, 1234u + step});
        run.norms.push_back(norm);
    }
    run.params.resize(zero.plan().total());
    zero.save(run.params.data());
    return run;
}

// a small model (vocabulary 64) trained for 5 steps on `data`, quietly, with nothing written
inline TrainConfig tiny_config(const std::string& data, long seed) {
    TrainConfig cfg;
    cfg.train_data = data;
    cfg.init = "L=2,NH=2,C=32,V=64,maxT=32";
    cfg.output_dir = "";
    cfg.B = 2;
    cfg.T = 16;
    cfg.max_steps = 5;
    cfg.val_every = 0;
    cfg.sample_every = 0;
    cfg.weight_decay = 0.1f;
    cfg.quiet = 1;
    cfg.seed = seed;
    return cfg;
}

// Trains cfg (tiny_config(data, seed), or one made from it); returns the step records and the
// final parameters. For determinism checks.
template <class Backend>
std::pair<std::vector<StepRecord>, std::vector<float>> train_tiny(const TrainConfig& cfg, Communicator& comm) {
    std::vector<float> params;
    auto records = train<Backend>(cfg, comm, [&](int step, Zero<Backend>& z) {
        if (step == cfg.max_steps - 1) {
            params.resize(z.plan().total());
            z.save(params.data());
        }
    });
    return {records, params};
}
template <class Backend>
std::pair<std::vector<StepRecord>, std::vector<float>> train_tiny(const std::string& data, long seed, Communicator& comm) {
    return train_tiny<Backend>(tiny_config(data, seed), comm);
}

inline std::string temp_dir() {
    char tmpl[] = "/tmp/train_gpt_test_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) fatal(1, "mkdtemp failed");
    return tmpl;
}
