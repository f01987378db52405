// Causal multi-head self-attention. qkv is (B, T, 3C) holding [q | k | v]; heads split C into
// NH slices of hs = C/NH. The CPU backend keeps the softmax probabilities att (B, NH, T, T) for
// the backward pass; only entries t2 <= t are written or read.
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>

namespace cpu {

inline size_t attention_saved_floats(int B, int T, int NH) { return (size_t)B * NH * T * T; }

inline void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                              int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t C3 = (size_t)3 * C;
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float* p = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    p[t2] = dot * scale;
                    if (p[t2] > maxval) maxval = p[t2];
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) { p[t2] = expf(p[t2] - maxval); sum += p[t2]; }
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    p[t2] /= sum;
                    const float* v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += p[t2] * v[i];
                }
            }
        }
    }
}

// dqkv is overwritten. Parallel over (b, h): every write of one (b, h) stays in its own slices.
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                               int B, int T, int C, int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t C3 = (size_t)3 * C;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++)
                for (int i = 0; i < 3; i++) {
                    float* d = dqkv + ((size_t)b * T + t) * C3 + i * C + h * hs;
                    for (int j = 0; j < hs; j++) d[j] = 0.0f;
                }
            std::vector<float> datt(T);
            for (int t = 0; t < T; t++) {
                const float* p = att + (((size_t)b * NH + h) * T + t) * T;
                const float* d = dout + ((size_t)b * T + t) * C + h * hs;
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float* dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                // out = sum_t2 p[t2] v[t2]: gradients to p and to v
                float pdatt = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    float* dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) { s += d[i] * v[i]; dv[i] += p[t2] * d[i]; }
                    datt[t2] = s;
                    pdatt += p[t2] * s;
                }
                // softmax backward, then through the scaled dot product q.k
                for (int t2 = 0; t2 <= t; t2++) {
                    float dpre = p[t2] * (datt[t2] - pdatt) * scale;
                    const float* k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    float* dk = dqkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) { dq[i] += dpre * k[i]; dk[i] += dpre * q[i]; }
                }
            }
        }
    }
}

}  // namespace cpu
