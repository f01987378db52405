// AdamW with decoupled weight decay (Loshchilov & Hutter), as in GPT-2/llm.c, over a rank's shard
// as kernels/shard_table.h maps it. The CPU backend's update, and the host update of
// ZeRO-Offload (zero/offload.h), where parameters and gradients may be bf16 (uint16_t bits): then
// the fp32 master weights are updated and the parameters get them rounded stochastically, keyed
// as the GPU's kernel keys them, so host and GPU round every parameter alike. grad_scale folds
// gradient clipping into the update so the gradients need no separate pass.
//
// Every element is independent, so the work is cut evenly across OpenMP threads whatever the
// tensor sizes, and each tensor's run is one SIMD loop (32-bit integer hashing included). The
// result does not depend on the thread count.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../adamw_step.h"
#include "../shard_table.h"

namespace cpu {

inline float param_to_float(float x) { return x; }
inline float param_to_float(uint16_t bf16) { return bf16_bits_to_float(bf16); }
inline void store_param(float* out, float x, uint32_t) { *out = x; }
inline void store_param(uint16_t* out, float x, uint32_t random) {
    uint32_t u;
    memcpy(&u, &x, 4);
    *out = bf16_round_stochastic(u, random);
}

// elements [a, b) of entry e
template <class P>
inline void adamw_entry(P* params, float* master, const P* grads, float* m, float* v, const ShardTensor& e, size_t a,
                        size_t b, const AdamWStep& s, float bc1, float bc2) {
    P* param = params + e.param_offset;
    const P* grad = grads + e.grad_offset;
    float *mm = m + e.state_offset, *vv = v + e.state_offset, *mw = master ? master + e.state_offset : nullptr;
    const float wd = e.decay ? s.weight_decay : 0.0f;
    // the random bits' index, rounding_index(e, i), hashed in 32-bit halves: cut where its
    // high half changes (never, below 2^32 parameters)
    while (a < b) {
        const uint64_t first = rounding_index(e, a);
        const size_t end = std::min<uint64_t>(b, a + ((first | 0xffffffffull) - first) + 1);
        const uint32_t high = hash_u32(s.seed ^ (uint32_t)(first >> 32)), low0 = (uint32_t)first - (uint32_t)a;
#pragma omp simd
        for (size_t i = a; i < end; i++) {
            const float g = param_to_float(grad[i]) * s.grad_scale;  // read before param[i] is written: they may alias
            const float p = adamw_element(mw ? mw[i] : param_to_float(param[i]), g, mm[i], vv[i], s.lr, s.beta1, s.beta2, bc1, bc2, s.eps, wd);
            if (mw) mw[i] = p;
            store_param(param + i, p, random_u32_from(high, low0 + (uint32_t)i));
        }
        a = end;
    }
}

// One step over the `count` entries at `table` (consecutive entries of a shard table). master:
// fp32 weights to update (then params get them rounded), or nullptr to update params directly.
// params and grads may be one buffer when each element's offsets agree.
template <class P>
void adamw_update(P* params, float* master, const P* grads, float* m, float* v, const ShardTensor* table, int count,
                  const AdamWStep& s) {
    if (count == 0) return;
    const size_t base = table[0].start, total = table[count - 1].start + table[count - 1].n - base;
    const float bc1 = 1.0f - powf(s.beta1, (float)s.t), bc2 = 1.0f - powf(s.beta2, (float)s.t);
#pragma omp parallel
    {
        // this thread's run of elements, cut at multiples of 64 so the vector loops stay aligned
        const size_t threads = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
        const size_t per = (total / threads + 63) / 64 * 64;
        const size_t lo = std::min(total, me * per), hi = me + 1 == threads ? total : std::min(total, lo + per);
        for (int j = 0; j < count && lo < hi; j++) {
            const ShardTensor& e = table[j];
            const size_t from = e.start - base, to = from + e.n;
            if (to <= lo || from >= hi) continue;
            adamw_entry(params, master, grads, m, v, e, std::max(lo, from) - from, std::min(hi, to) - from, s, bc1, bc2);
        }
    }
}

// Sum of squares in double: the global norm adds up ~1e8 terms on large models.
inline double sum_squares(const float* x, size_t n) {
    double sum = 0.0;
    #pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return sum;
}

}  // namespace cpu
