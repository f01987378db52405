// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
#pragma once
#include <cstddef>

namespace cpu {

inline void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                            int B, int T, int C) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float* tok = wte + (size_t)tokens[b * T + t] * C;
            const float* pos = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
        }
    }
}

// Serial over (b,t): several positions may hold the same token, so the wte rows they add into
// collide. Keeping one fixed order makes the sum the same in every run.
inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens,
                             int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float* d = dout + ((size_t)b * T + t) * C;
            float* dtok = dwte + (size_t)tokens[b * T + t] * C;
            float* dpos = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) { dtok[c] += d[c]; dpos[c] += d[c]; }
        }
    }
}

}  // namespace cpu
