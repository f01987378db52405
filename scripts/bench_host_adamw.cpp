// The host AdamW of ZeRO-Offload (kernels/cpu/adamw.h) on this machine: parameters per second,
// and the bandwidth that is, against what this machine copies. Per parameter the update moves 28
// bytes: reads the bf16 gradient (2) and fp32 master, m, v (12), writes them back (12) and the
// bf16 parameter (2). The copy bandwidth is memcpy on every thread, counted as bytes read plus
// bytes written, like the update. Beside it, the plain loop the kernel replaces: one thread,
// one element at a time with the 64-bit hash, as one would first write it.
//   scripts/bench_host_adamw [parameters (default 2^26)] [repeats (default 7)]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../kernels/cpu/adamw.h"

namespace {

// median wall time of f() over `repeats` calls, after one call that touches the memory
template <class F>
double median_seconds(int repeats, F f) {
    f();
    std::vector<double> t;
    for (int r = 0; r < repeats; r++) {
        const auto start = std::chrono::steady_clock::now();
        f();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

void plain_adamw(uint16_t* params, float* master, const uint16_t* grads, float* m, float* v, size_t n, uint64_t flat,
                 const AdamWStep& s) {
    const float bc1 = 1.0f - powf(s.beta1, (float)s.t), bc2 = 1.0f - powf(s.beta2, (float)s.t);
    for (size_t i = 0; i < n; i++) {
        const float g = cpu::param_to_float(grads[i]) * s.grad_scale;
        m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
        master[i] -= s.lr * ((m[i] / bc1) / (sqrtf(v[i] / bc2) + s.eps) + s.weight_decay * master[i]);
        uint32_t bits;
        memcpy(&bits, &master[i], 4);
        params[i] = bf16_round_stochastic(bits, random_u32(s.seed, flat + i));
    }
}

}  // namespace

int main(int argc, char** argv) {
    const size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : (size_t)1 << 26;
    const int repeats = argc > 2 ? atoi(argv[2]) : 7;
    std::vector<float> master(n, 0.5f), m(n, 0.01f), v(n, 1e-4f);
    std::vector<uint16_t> staging(n, 0x3c00);  // gradients in, parameters out
    const std::vector<ShardTensor> table = {{0, n, 0, 0, 0, 0, 1}};
    const AdamWStep step{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10, 42};

    std::vector<char> from(n * 28 / 2), to(from.size());  // as many bytes as the update moves
    const double copy = median_seconds(repeats, [&] {
#pragma omp parallel
        {
            const size_t per = from.size() / omp_get_num_threads(), at = per * omp_get_thread_num();
            memcpy(to.data() + at, from.data() + at, per);
        }
    });
    const double kernel = median_seconds(repeats, [&] {
        cpu::adamw_update(staging.data(), master.data(), staging.data(), m.data(), v.data(), table.data(), 1, step);
    });
    const double plain = median_seconds(std::max(1, repeats / 3), [&] {
        plain_adamw(staging.data(), master.data(), staging.data(), m.data(), v.data(), n, 0, step);
    });
    const double bytes = 28.0 * n, copy_bw = 2.0 * from.size() / copy;
    printf("host AdamW, %zu bf16 parameters, %d thread(s), median of %d:\n", n, omp_get_max_threads(), repeats);
    printf("  copy bandwidth (memcpy, read + write): %.2f GB/s\n", copy_bw / 1e9);
    printf("  kernel (kernels/cpu/adamw.h): %.1f ms, %.3g parameters/s, %.2f GB/s = %.0f%% of copy bandwidth\n",
           kernel * 1e3, n / kernel, bytes / kernel / 1e9, 100.0 * bytes / kernel / copy_bw);
    printf("  plain loop (one thread, scalar): %.1f ms, %.3g parameters/s, %.2f GB/s = %.0f%% of copy bandwidth; kernel %.1fx faster\n",
           plain * 1e3, n / plain, bytes / plain / 1e9, 100.0 * bytes / plain / copy_bw, plain / kernel);
    return 0;
}
