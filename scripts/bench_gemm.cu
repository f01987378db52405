// The GEMMs of one training step, each timed with the algorithm the trainer uses (cuBLASLt's
// first heuristic choice, the same for a shape at every layer and every run) beside every other
// algorithm the heuristic offers for it: TFLOP/s, and the ms a step would save with the fastest.
// It tells whether choosing algorithms by timing (which no longer gives the same bits on every
// machine and run) would pay: its ratios, not its totals (each GEMM alone, on random operands). Shapes and epilogues as the model calls them: d12 B=64 and d48
// B=16 at T=1024, one micro-batch a step (so BGRADB writes the bias gradients), bf16 build.
// Built by kernels/cuda.mk (scripts/bench_gemm), run by scripts/bench_gpu.sh.
//   bench_gemm [candidates]   (default 16: algorithms asked of the heuristic per GEMM)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "scripts/bench_cuda.cuh"

namespace {

struct Model {
    const char* name;
    int B, C, L;
};
constexpr int kT = 1024, kVp = 50304;

// one GEMM of the step: gemm_lt's arguments, and how often a step calls it
struct GemmCall {
    std::string name;
    gpu::GemmKey key;
    float beta;
    int calls;
};

// the calls of matmul_forward / matmul_gelu_forward / matmul_backward(_gelu) for a linear layer
// C -> OC over N rows (kernels/cuda/matmul.cuh), epilogues as the bf16 build chooses them
void add_linear(std::vector<GemmCall>& out, const char* layer, int N, int C, int OC, bool bias, bool gelu_after,
                bool gelu_before, int calls) {
    const cublasLtEpilogue_t fwd = gelu_after ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const cublasLtEpilogue_t dinp = gelu_before ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
    const cublasLtEpilogue_t dw = bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    out.push_back({std::string(layer) + " forward", {OC, N, C, C, C, OC, true, false, fwd, 16}, 0.0f, calls});
    out.push_back({std::string(layer) + " dinp", {C, N, OC, C, OC, C, false, false, dinp, 16}, 0.0f, calls});
    out.push_back({std::string(layer) + " dweight", {C, OC, N, C, OC, C, false, true, dw, 16}, 1.0f, calls});
}

std::vector<GemmCall> step_gemms(const Model& m) {
    const int N = m.B * kT, C = m.C;
    std::vector<GemmCall> g;
    add_linear(g, "qkv", N, C, 3 * C, true, false, false, m.L);
    add_linear(g, "attention projection", N, C, C, true, false, false, m.L);
    add_linear(g, "fc", N, C, 4 * C, true, true, false, m.L);
    add_linear(g, "fc projection", N, 4 * C, C, true, false, true, m.L);
    add_linear(g, "classifier", N, C, kVp, false, false, false, 1);
    return g;
}

const char* epilogue_name(cublasLtEpilogue_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
        default: return "none";
    }
}

// ms of one call with each algorithm the heuristic offers (the first: the trainer's), or a
// negative value for one that fails to run
std::vector<float> time_algorithms(const GemmCall& call, int candidates) {
    const gpu::GemmKey& k = call.key;
    gpu::GemmPlan plan;
    std::vector<cublasLtMatmulHeuristicResult_t> heur(candidates);
    heur.resize(gpu::make_gemm_descriptors(k, plan, candidates, heur.data()));
    // stored sizes: A is (k, m) when transposed else (m, k), B likewise, D (m, n)
    gpu::floatX* a = random_device((size_t)k.m * k.k, 1);
    gpu::floatX* b = random_device((size_t)k.k * k.n, 2);
    gpu::floatX* d = random_device((size_t)k.m * k.n, 3);
    gpu::floatX* bias = random_device((size_t)std::max(k.m, k.n), 4);
    gpu::floatX* aux = k.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || k.epilogue == CUBLASLT_EPILOGUE_DGELU
                           ? random_device((size_t)k.m * k.n, 5) : nullptr;
    if (k.epilogue != CUBLASLT_EPILOGUE_DEFAULT && k.epilogue != CUBLASLT_EPILOGUE_DGELU)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (aux != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    gpu::Context& c = gpu::ctx();
    const float alpha = 1.0f;
    std::vector<float> ms;
    for (const cublasLtMatmulHeuristicResult_t& h : heur) {
        auto run = [&] {
            return cublasLtMatmul(c.lt, plan.desc, &alpha, a, plan.la, b, plan.lb, &call.beta, d, plan.ld, d, plan.ld,
                                  &h.algo, c.lt_workspace, c.lt_workspace_size, c.stream);
        };
        if (h.state != CUBLAS_STATUS_SUCCESS || run() != CUBLAS_STATUS_SUCCESS) {
            ms.push_back(-1.0f);
            continue;
        }
        ms.push_back(median_ms([&] { CUBLAS_CHECK(run()); }, 10));
    }
    for (void* p : {(void*)a, (void*)b, (void*)d, (void*)bias, (void*)aux})
        if (p != nullptr) CudaBackend::release(p);
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan.desc));
    for (cublasLtMatrixLayout_t l : {plan.la, plan.lb, plan.ld}) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l));
    return ms;
}

void bench_model(const Model& m, int candidates) {
    double used_step = 0.0, fastest_step = 0.0, flop_step = 0.0;
    for (const GemmCall& call : step_gemms(m)) {
        const std::vector<float> ms = time_algorithms(call, candidates);
        if (ms.empty() || ms[0] < 0) {
            printf("gemm %s %s: no algorithm\n", m.name, call.name.c_str());
            continue;
        }
        int best = 0;
        for (int i = 1; i < (int)ms.size(); i++)
            if (ms[i] >= 0 && ms[i] < ms[best]) best = i;
        const gpu::GemmKey& k = call.key;
        const double flop = 2.0 * k.m * k.n * k.k;
        printf("gemm %s %-28s m=%5d n=%5d k=%5d %-13s x%-2d  trainer's %.3f ms (%3.0f TFLOP/s)  fastest of %2zu: #%d %.3f ms (%3.0f)\n",
               m.name, call.name.c_str(), k.m, k.n, k.k, epilogue_name(k.epilogue), call.calls, ms[0], tflops(flop, ms[0]),
               ms.size(), best, ms[best], tflops(flop, ms[best]));
        used_step += ms[0] * call.calls;
        fastest_step += ms[best] * call.calls;
        flop_step += flop * call.calls;
    }
    printf("gemm %s B=%d T=%d: the step's GEMMs take %.2f ms (%.0f TFLOP/s) with the trainer's algorithms, %.2f ms with the "
           "fastest of each\n", m.name, m.B, kT, used_step, tflops(flop_step, (float)used_step), fastest_step);
}

}  // namespace

int main(int argc, char** argv) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("skipped: no GPU\n");
        return 0;
    }
    const int candidates = argc > 1 ? atoi(argv[1]) : 16;
    if (candidates < 1 || candidates > 64) fatal(2, "bench_gemm: candidates must be 1 to 64, not %s", argv[1]);
    for (const Model& m : {Model{"d12", 64, 768, 12}, Model{"d48", 16, 1600, 48}}) bench_model(m, candidates);
    return 0;
}
