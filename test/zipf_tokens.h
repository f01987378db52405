// Tokens as real text draws them, roughly: a few very often, most rarely (Zipf's law), for the
// kernels whose speed or correctness depends on how often a token repeats (the embedding's
// backward). Shared by the CUDA kernel tests and the per-kernel benchmark.
#pragma once
#include <random>
#include <vector>

// n tokens below V drawn with P(k) proportional to 1 / (k + 1)
inline std::vector<int> zipf_tokens(size_t n, int V, uint32_t seed) {
    std::vector<double> weights(V);
    for (int k = 0; k < V; k++) weights[k] = 1.0 / (k + 1);
    std::discrete_distribution<int> dist(weights.begin(), weights.end());
    std::mt19937 rng(seed);
    std::vector<int> v(n);
    for (int& x : v) x = dist(rng);
    return v;
}
