// Per-kernel GPU benchmark at the d12 step's shapes (B=64, T=1024, C=768, V=50257 padded to 50304,
// 12 layers, -r 1): every kernel of the step other than attention and the matmuls' GEMMs, each
// timed alone with CUDA events (the median of kRepeats calls, each on the next of enough copies
// of its inputs that together they are larger than L2, so every call reads from memory), beside
// the bytes it must move at least and the GB/s that makes; then its calls per step and the ms
// they add up to. The fused GEMM epilogues of the bf16 build (GELU, DGELU, BGRADB) have no
// kernel of their own: they are timed as the GEMM with the epilogue less the plain GEMM.
// The encoder backward runs on uniform tokens, on Zipf-distributed ones (as real text repeats
// a few tokens) and, given an llm.c token shard as the first argument, on its first B*T tokens.
// Without a GPU it prints "skipped: no GPU" and exits 0.
//
//   bench_kernels_cuda [tokens.bin]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "data/dataloader.h"  // validate_shard
#include "kernels/cuda_backend.cuh"
#include "test/zipf_tokens.h"

namespace {

using G = CudaBackend;
using X = G::floatX;

constexpr int kB = 64, kT = 1024, kC = 768, kV = 50257, kVp = 50304, kL = 12;
constexpr size_t kBT = (size_t)kB * kT;
constexpr int kRepeats = 21;

// device buffer of n elements, filled with values in [-1, 1) (or left zero)
template <class T>
T* device_random(size_t n, uint32_t seed, bool fill = true) {
    T* p = (T*)G::alloc(n * sizeof(T));
    if (!fill) return p;
    std::vector<float> h(n);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : h) x = dist(rng);
    if constexpr (std::is_same<T, float>::value) G::from_host(p, h.data(), n * sizeof(float));
    else G::upload_fp32(p, h.data(), n);
    return p;
}

double l2_bytes() {
    int bytes = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, gpu::ctx().device));
    return bytes;
}

// copies of a kernel's inputs: enough that together they exceed three times L2
int copies_for(double bytes_per_call) {
    const double l2 = 3.0 * l2_bytes();
    return (int)std::min(64.0, std::max(1.0, std::ceil(l2 / bytes_per_call)));
}

// median time of launch(copy) over kRepeats calls, copy cycling through [0, copies)
float median_ms(int copies, const std::function<void(int)>& launch) {
    launch(0);  // plans, scratch and first-touch costs out of the way
    G::synchronize();
    std::vector<cudaEvent_t> ev(2 * kRepeats);
    for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreate(&e));
    for (int r = 0; r < kRepeats; r++) {
        CUDA_CHECK(cudaEventRecord(ev[2 * r], gpu::stream()));
        launch((r + 1) % copies);
        CUDA_CHECK(cudaEventRecord(ev[2 * r + 1], gpu::stream()));
    }
    G::synchronize();
    std::vector<float> ms(kRepeats);
    for (int r = 0; r < kRepeats; r++) CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[2 * r], ev[2 * r + 1]));
    for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventDestroy(e));
    std::sort(ms.begin(), ms.end());
    return ms[kRepeats / 2];
}

double g_step_ms = 0.0;

// one table row: per call, then per step
void report(const char* name, double bytes, float ms, int calls_per_step) {
    const double step_ms = (double)ms * calls_per_step;
    g_step_ms += step_ms;
    printf("%-44s %9.3f ms %10.1f MB %8.0f GB/s %5d x %8.2f ms/step\n", name, ms, bytes / 1e6,
           ms > 0 ? bytes / (ms * 1e6) : 0.0, calls_per_step, step_ms);
}

// inputs for kernels that read `reads` tensors and write `writes` of n floatX each, in `copies` sets
struct Sets {
    std::vector<X*> p;
    int copies;
    Sets(int tensors, size_t n, int copies_, uint32_t seed) : copies(copies_) {
        for (int i = 0; i < tensors * copies; i++) p.push_back(device_random<X>(n, seed + i));
    }
    ~Sets() {
        for (X* x : p) G::release(x);
    }
    X* at(int copy, int tensor) const { return p[(size_t)tensor * copies + copy]; }
};

// the first n tokens of an llm.c token shard
std::vector<int> shard_tokens(const std::string& path, size_t n) {
    const size_t count = validate_shard(path);
    if (count < n) fatal(1, "%s: %zu tokens, the benchmark needs %zu", path.c_str(), count, n);
    FILE* f = open_file(path, "rb");
    std::vector<uint16_t> raw(n);
    fseek(f, 256 * sizeof(int32_t), SEEK_SET);
    read_exact(raw.data(), n * sizeof(uint16_t), f, path, "tokens");
    fclose(f);
    return std::vector<int>(raw.begin(), raw.end());
}

void bench_encoder_backward(const char* name, const std::vector<int>& tokens, int calls_per_step) {
    const size_t n = kBT * kC;
    const double bytes = 2.0 * n * sizeof(X) + kBT * 3 * sizeof(int);  // dout read for wte and wpe, sort
    const int copies = copies_for(bytes);
    Sets dout(1, n, copies, 300);
    int* tok = (int*)G::alloc(kBT * sizeof(int));
    G::from_host(tok, tokens.data(), kBT * sizeof(int));
    X* dwte = device_random<X>((size_t)kVp * kC, 301, false);
    X* dwpe = device_random<X>((size_t)kT * kC, 302, false);
    std::vector<int> sorted = tokens;
    std::sort(sorted.begin(), sorted.end());
    size_t longest = 0;
    for (size_t i = 0, j; i < sorted.size(); i = j) {
        for (j = i; j < sorted.size() && sorted[j] == sorted[i]; j++) {}
        longest = std::max(longest, j - i);
    }
    const float ms = median_ms(copies, [&](int c) { G::encoder_backward(dwte, dwpe, dout.at(c, 0), tok, kB, kT, kC); });
    char label[96];
    snprintf(label, sizeof(label), "encoder_backward (%s, longest run %zu)", name, longest);
    report(label, bytes, ms, calls_per_step);
    G::release(tok);
    G::release(dwte);
    G::release(dwpe);
}

}  // namespace

int main(int argc, char** argv) {
    if (!G::available()) {
        printf("skipped: no GPU\n");
        return 0;
    }
    G::init(0);
#ifdef KERNELS_CANDIDATE
    const char* build = "KERNELS=candidate";
#else
    const char* build = "KERNELS=default";
#endif
    printf("per-kernel times, d12 step shapes (B=%d T=%d C=%d Vp=%d, %d layers, -r 1), %s, %s, L2 %.0f MB\n", kB, kT, kC,
           kVp, kL, build, sizeof(X) == 2 ? "bf16" : "fp32", l2_bytes() / 1e6);
    printf("%-44s %12s %13s %13s %7s %16s\n", "kernel", "per call", "bytes", "", "calls", "per step");
    const size_t n = kBT * kC, n4 = 4 * n;
    const double x = sizeof(X);

    {  // encoder forward
        const double bytes = 3.0 * n * x;
        X* wte = device_random<X>((size_t)kVp * kC, 1);
        X* wpe = device_random<X>((size_t)kT * kC, 2);
        std::vector<int> h = zipf_tokens(kBT, kV, 3);
        int* tok = (int*)G::alloc(kBT * sizeof(int));
        G::from_host(tok, h.data(), kBT * sizeof(int));
        const int copies = copies_for(bytes);
        Sets out(1, n, copies, 4);
        report("encoder_forward", bytes, median_ms(copies, [&](int c) { G::encoder_forward(out.at(c, 0), tok, wte, wpe, kB, kT, kC); }), 1);
        G::release(wte);
        G::release(wpe);
        G::release(tok);
    }
    float* mean = device_random<float>(kBT, 5);
    float* rstd = device_random<float>(kBT, 6);
    X* w = device_random<X>(kC, 7);
    X* b = device_random<X>(kC, 8);
    {  // layernorm forward: the first layer's ln1 (the others, and the final one, come with a residual add)
        const double bytes = 2.0 * n * x;
        const int copies = copies_for(bytes);
        Sets s(2, n, copies, 10);
        report("layernorm_forward", bytes,
               median_ms(copies, [&](int c) { G::layernorm_forward(s.at(c, 1), mean, rstd, s.at(c, 0), w, b, kBT, kC); }), 1);
    }
    {  // residual + layernorm forward: ln2, and each block's residual with the layernorm after it
        const double bytes = 4.0 * n * x;
        const int copies = copies_for(bytes);
        Sets s(4, n, copies, 20);
        report("residual_layernorm_forward", bytes, median_ms(copies, [&](int c) {
                   G::residual_layernorm_forward(s.at(c, 2), s.at(c, 3), mean, rstd, s.at(c, 0), s.at(c, 1), w, b, kBT, kC);
               }), 2 * kL);
    }
    {  // GELU: the backward's recomputation (-r 1), and forward and backward where the GEMM does not take them
#ifndef ENABLE_FP32
        const int separate = 0;
#else
        const int separate = kL;
#endif
        const double bytes = 2.0 * n4 * x;
        const int copies = copies_for(bytes);
        Sets s(2, n4, copies, 40);
        report("gelu_forward", bytes, median_ms(copies, [&](int c) { G::gelu_forward(s.at(c, 1), s.at(c, 0), n4); }),
               kL + separate);
        report("gelu_backward", 3.0 * n4 * x,
               median_ms(copies, [&](int c) { G::gelu_backward(s.at(c, 1), s.at(c, 0), n4); }), separate);
    }
    {  // layernorm backward: ln1, ln2 per layer and the final one
        const double bytes = 4.0 * n * x;
        const int copies = copies_for(bytes);
        Sets s(3, n, copies, 50);
        X* dw = device_random<X>(kC, 51, false);
        X* db = device_random<X>(kC, 52, false);
        report("layernorm_backward", bytes, median_ms(copies, [&](int c) {
                   G::layernorm_backward(s.at(c, 2), dw, db, s.at(c, 0), s.at(c, 1), w, mean, rstd, kBT, kC);
               }), 2 * kL + 1);
        G::release(dw);
        G::release(db);
    }
    {  // classifier: softmax, loss and dlogits in place
        const double bytes = 2.0 * kBT * kVp * x;
        X* logits = device_random<X>(kBT * kVp, 60);
        float* losses = (float*)G::alloc(kBT * sizeof(float));
        std::vector<int> h = zipf_tokens(kBT, kV, 61);
        int* targets = (int*)G::alloc(kBT * sizeof(int));
        G::from_host(targets, h.data(), kBT * sizeof(int));
        report("fused_classifier", bytes, median_ms(1, [&](int) {
                   G::fused_classifier(logits, losses, targets, 1.0f / kBT, kBT, kV, kVp);
               }), 1);
        double* acc = (double*)G::alloc(sizeof(double));
        report("mean_loss_add", kBT * 4.0, median_ms(1, [&](int) { G::mean_loss_add(acc, losses, kBT); }), 1);
        G::release(acc);
        G::release(logits);
        G::release(losses);
        G::release(targets);
    }
    {  // bias gradients: the column sums of qkv's, the attention projection's, fc's and its projection's dout
        for (int oc : {3 * kC, kC, 4 * kC}) {
            const double bytes = (double)kBT * oc * x;
            const int copies = copies_for(bytes);
            Sets s(1, kBT * oc, copies, 70);
            X* db = device_random<X>(oc, 71, false);
            auto launch = [&](int c) { gpu::column_sums_add(db, s.at(c, 0), kBT, oc); };
#if defined(ENABLE_FP32)
            const int calls = oc == kC ? 2 * kL : kL;
#elif defined(KERNELS_CANDIDATE)
            const int calls = oc == 4 * kC ? 0 : oc == kC ? 2 * kL : kL;  // fc's from DGELU_BGRAD (timed below)
#else
            const int calls = 0;  // one micro-batch a step: BGRADB in the dweight GEMM (timed below)
#endif
            char label[64];
            snprintf(label, sizeof(label), "bias column sums (OC=%d)", oc);
            report(label, bytes, median_ms(copies, launch), calls);
            G::release(db);
        }
    }
    {  // encoder backward on three token distributions; the uniform one counts toward the step
        std::mt19937 rng(80);
        std::vector<int> uniform(kBT);
        for (int& t : uniform) t = (int)(rng() % kV);
        bench_encoder_backward("uniform", uniform, 1);
        bench_encoder_backward("Zipf", zipf_tokens(kBT, kV, 81), 0);
        if (argc > 1) bench_encoder_backward(argv[1], shard_tokens(argv[1], kBT), 0);
    }
    {  // optimizer: AdamW over d12's parameters (bf16 parameters and gradients, fp32 master, m, v), norm
        const size_t P = 124475904;
        X* params = device_random<X>(P, 90);
        X* grads = device_random<X>(P, 91);
        float* m = device_random<float>(P, 92, false);
        float* v = device_random<float>(P, 93, false);
        float* master = G::params_narrower_than_fp32 ? device_random<float>(P, 94) : nullptr;
        ShardTensor entry{0, P, 0, 0, 0, 0, 1};
        ShardTensor* dev = (ShardTensor*)G::alloc(sizeof(entry));
        G::from_host(dev, &entry, sizeof(entry));
        ShardTable table{&entry, dev, 1, P};
        const double adam_bytes = P * (2 * x + (G::params_narrower_than_fp32 ? 8.0 : 0.0) + 16.0);
        report("adamw_update", adam_bytes, median_ms(1, [&](int) {
                   G::adamw_update(params, master, grads, m, v, table, AdamWStep{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, 7});
               }), 1);
        float* out = (float*)G::alloc(sizeof(float));
        report("grad_norm_squared", P * x, median_ms(1, [&](int) { G::grad_norm_squared(out, grads, table); }), 1);
        for (void* p : {(void*)params, (void*)grads, (void*)m, (void*)v, (void*)master, (void*)dev, (void*)out})
            if (p) G::release(p);
    }
    {  // the fc layer's GEMMs with and without their epilogues: what the fused GELU, DGELU and BGRADB
       // (the candidate build: DGELU_BGRAD, fc's bias gradient) add
        X* inp = device_random<X>(n, 100);
        X* pre = device_random<X>(n4, 101);
        X* act = device_random<X>(n4, 102);
        X* wfc = device_random<X>((size_t)4 * kC * kC, 103);
        X* bfc = device_random<X>(4 * kC, 104);
        X* dout = device_random<X>(n, 105);
        X* dinp = device_random<X>(n4, 106, false);
        X* dw = device_random<X>((size_t)4 * kC * kC, 107, false);
        X* db = device_random<X>(kC, 108, false);
        X* fc_db = device_random<X>(4 * kC, 109, false);
        const float plain_fwd = median_ms(1, [&](int) { G::matmul_forward(pre, inp, wfc, bfc, kBT, kC, 4 * kC); });
        const float fused_fwd = median_ms(1, [&](int) { G::matmul_gelu_forward(act, pre, inp, wfc, bfc, kBT, kC, 4 * kC); });
        const float plain_bwd = median_ms(1, [&](int) { G::matmul_backward(dinp, dw, nullptr, dout, act, wfc, kBT, 4 * kC, kC, false); });
#ifdef KERNELS_CANDIDATE
        // the projection's own bias gradient is a column sum there, counted above
        const char* fused_bwd_label = "DGELU + DGELU_BGRAD epilogues (fc projection)";
        const float fused_bwd = median_ms(1, [&](int) {
            gpu::matmul_gelu_backward(dinp, dw, nullptr, dout, act, pre, wfc, kBT, 4 * kC, kC, true, fc_db);
        });
#else
        const char* fused_bwd_label = "DGELU + BGRADB epilogues (fc projection)";
        const float fused_bwd = median_ms(1, [&](int) {
            gpu::matmul_gelu_backward(dinp, dw, db, dout, act, pre, wfc, kBT, 4 * kC, kC, true, nullptr);
        });
#endif
        printf("fc GEMM forward %.3f ms, with GELU (matmul_gelu_forward) %.3f ms; fc projection backward GEMMs %.3f ms, "
               "with GELU' and a bias gradient (matmul_gelu_backward) %.3f ms\n",
               plain_fwd, fused_fwd, plain_bwd, fused_bwd);
#ifndef ENABLE_FP32
        // the epilogues' cost, as the step pays it (the separate kernels' rows above count 0 here)
        report("GELU epilogue (fc forward)", 0.0, fused_fwd - plain_fwd, kL);
        report(fused_bwd_label, 0.0, fused_bwd - plain_bwd, kL);
#else
        (void)fused_bwd_label;
#endif
        for (X* p : {inp, pre, act, wfc, bfc, dout, dinp, dw, db, fc_db}) G::release(p);
    }
    printf("total per step (other than attention and the GEMMs): %.2f ms\n", g_step_ms);
    return 0;
}
