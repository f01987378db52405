// Shared by the C++ tests: the trainer itself (without its main), a one-rank communicator, and
// small helpers to read the PyTorch debug state and to write token shards.
#pragma once
#define TESTING
#include "train_gpt.cu"
#include "zero/comm_single.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

inline SingleComm& single_comm() {
    static SingleComm comm(CpuBackend::copy);
    return comm;
}

// The debug state written by scripts/gpt2_reference.py (format described there).
struct DebugState {
    int B, T, steps, V, Vp;
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
        B = h[2], T = h[3], steps = h[4], V = h[5], Vp = h[6], num_params = (size_t)h[7];
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

// Largest |a-b| / (atol + rtol*|b|); at most 1 means every element is within tolerance.
inline double tolerance_ratio(const float* a, const float* b, size_t n, double rtol, double atol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) worst = std::max(worst, std::fabs((double)a[i] - b[i]) / (atol + rtol * std::fabs((double)b[i])));
    return worst;
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

inline std::string temp_dir() {
    char tmpl[] = "/tmp/train_gpt_test_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) fatal(1, "mkdtemp failed");
    return tmpl;
}
