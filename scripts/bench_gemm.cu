// The GEMMs of one training step, each timed with the algorithm the trainer uses (cuBLASLt's
// first heuristic choice, the same for a shape at every layer and every run) beside every other
// algorithm the heuristic offers for it: TFLOP/s, and the ms a step would save with the fastest.
// Its ratios count, not its totals (each GEMM alone, on random operands). --write FILE keeps the
// fastest of each as a table for train_gpt --gemm-algos (kernels/gemm_choices.h): timing inside a
// run could choose differently each run, a table chooses alike in every run that reads it.
// Shapes and epilogues as the model calls them, this build's (bf16; KERNELS=candidate takes fc's
// bias gradient from the DGELU GEMM and the others from column sums, not BGRADB): d12 B=64 and d48
// B=16 at T=1024, or the -e/-b/-t given, one micro-batch a step (BGRADB writes the bias
// gradients); --accumulate adds the GEMMs of the later micro-steps of a step (-d: the bias
// gradients are added, not written).
// Built by kernels/cuda.mk (scripts/bench_gemm), run by scripts/bench_gpu.sh.
//   bench_gemm [-e MODEL -b B [-t T]] [--accumulate] [--write FILE]
//   (MODEL as train_gpt -e takes it; kGemmAlgorithmsAsked algorithms asked of the heuristic a GEMM)
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/shape.h"
#include "scripts/bench_cuda.cuh"

#ifdef ENABLE_FP32
#error "bench_gemm times the bf16 build's GEMMs and epilogues; its tables are for that build"
#endif

namespace {

struct Model {
    std::string name;
    int B, T, C, L, Vp;
};

// one GEMM of the step: gemm_lt's arguments, and how often a micro-step calls it
struct GemmCall {
    std::string name;
    gpu::GemmKey key;
    float beta;
    int calls;
    bool later = false;  // a later micro-step's (--accumulate), not counted in the step's total
};

// gemm_lt's keys for a linear layer C -> OC over N rows, as kernels/cuda/matmul.cuh makes them:
// the forward, dinp and dweight GEMMs
gpu::GemmKey forward_key(int N, int C, int OC, cublasLtEpilogue_t e) { return {OC, N, C, C, C, OC, true, false, e, 16}; }
gpu::GemmKey dinp_key(int N, int C, int OC, cublasLtEpilogue_t e) { return {C, N, OC, C, OC, C, false, false, e, 16}; }
gpu::GemmKey dweight_key(int N, int C, int OC, cublasLtEpilogue_t e) { return {C, OC, N, C, OC, C, false, true, e, 16}; }

// the calls of matmul_forward / matmul_gelu_forward / matmul_backward(_gelu) for a linear layer
// C -> OC over N rows (kernels/cuda/matmul.cuh), epilogues as the bf16 build chooses them
void add_linear(std::vector<GemmCall>& out, const char* layer, int N, int C, int OC, bool bias, bool gelu_after,
                bool gelu_before, int calls, bool accumulate) {
#ifdef KERNELS_CANDIDATE
    const bool candidate = true;
#else
    const bool candidate = false;
#endif
    const cublasLtEpilogue_t fwd = gelu_after ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    // the candidate build's fc bias gradient comes from the fc projection's DGELU GEMM
    const cublasLtEpilogue_t dinp = !gelu_before ? CUBLASLT_EPILOGUE_DEFAULT : candidate ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    // the candidate build's bias gradients come from DGELU_BGRAD and the column sums, never BGRADB
    const cublasLtEpilogue_t dw = bias && !candidate ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    out.push_back({std::string(layer) + " forward", forward_key(N, C, OC, fwd), 0.0f, calls});
    out.push_back({std::string(layer) + " dinp", dinp_key(N, C, OC, dinp), 0.0f, calls});
    out.push_back({std::string(layer) + " dweight", dweight_key(N, C, OC, dw), 1.0f, calls});
    if (!accumulate) return;
    // later micro-steps: the bias gradients hold sums already, so no epilogue writes one
    if (dinp == CUBLASLT_EPILOGUE_DGELU_BGRAD)
        out.push_back({std::string(layer) + " dinp, later", dinp_key(N, C, OC, CUBLASLT_EPILOGUE_DGELU), 0.0f, calls, true});
    if (dw == CUBLASLT_EPILOGUE_BGRADB)
        out.push_back({std::string(layer) + " dweight, later", dweight_key(N, C, OC, CUBLASLT_EPILOGUE_DEFAULT), 1.0f, calls, true});
}

std::vector<GemmCall> step_gemms(const Model& m, bool accumulate) {
    const int N = m.B * m.T, C = m.C;
    std::vector<GemmCall> g;
    add_linear(g, "qkv", N, C, 3 * C, true, false, false, m.L, accumulate);
    add_linear(g, "attention projection", N, C, C, true, false, false, m.L, accumulate);
    add_linear(g, "fc", N, C, 4 * C, true, true, false, m.L, accumulate);
    add_linear(g, "fc projection", N, 4 * C, C, true, false, true, m.L, accumulate);
    add_linear(g, "classifier", N, C, m.Vp, false, false, false, 1, accumulate);
    return g;
}

// One algorithm of a GEMM and its time (negative: it failed to run)
struct Timed {
    std::string text;  // its configuration, as a --gemm-algos table names it
    float ms;
};

// Each algorithm the heuristic offers for the call, timed: first the one the trainer runs without
// a table (the heuristic's first, asked for one), then those of the kGemmAlgorithmsAsked it offers
// when asked for more (where a table's algorithm is taken from), each configuration once.
// `algorithms` 1: the trainer's alone.
std::vector<Timed> time_algorithms(const GemmCall& call, int algorithms) {
    const gpu::GemmKey& k = call.key;
    gpu::GemmPlan plan, first_plan;
    cublasLtMatmulHeuristicResult_t first;
    const int first_found = gpu::make_gemm_descriptors(k, first_plan, 1, &first);
    gpu::destroy_gemm_descriptors(first_plan);
    std::vector<cublasLtMatmulHeuristicResult_t> heur(algorithms);
    heur.resize(gpu::make_gemm_descriptors(k, plan, algorithms, heur.data()));
    if (first_found > 0) heur.insert(heur.begin(), first);
    // stored sizes: A is (k, m) when transposed else (m, k), B likewise, D (m, n)
    gpu::floatX* a = random_device((size_t)k.m * k.k, 1);
    gpu::floatX* b = random_device((size_t)k.k * k.n, 2);
    gpu::floatX* d = random_device((size_t)k.m * k.n, 3);
    gpu::floatX* bias = random_device((size_t)std::max(k.m, k.n), 4);
    gpu::floatX* aux = gpu::epilogue_has_aux(k.epilogue) ? random_device((size_t)k.m * k.n, 5) : nullptr;
    if (k.epilogue != CUBLASLT_EPILOGUE_DEFAULT && k.epilogue != CUBLASLT_EPILOGUE_DGELU)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (aux != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    gpu::Context& c = gpu::ctx();
    const float alpha = 1.0f;
    std::vector<Timed> timed;
    for (const cublasLtMatmulHeuristicResult_t& h : heur) {
        if (h.state != CUBLAS_STATUS_SUCCESS) continue;
        const std::string text = gpu::gemm_algorithm_text(h.algo);
        bool seen = false;
        for (const Timed& t : timed) seen = seen || t.text == text;
        if (seen) continue;
        auto run = [&] {
            return cublasLtMatmul(c.lt, plan.desc, &alpha, a, plan.la, b, plan.lb, &call.beta, d, plan.ld, d, plan.ld,
                                  &h.algo, c.lt_workspace, c.lt_workspace_size, c.stream);
        };
        timed.push_back({text, run() == CUBLAS_STATUS_SUCCESS ? median_ms([&] { CUBLAS_CHECK(run()); }, 10) : -1.0f});
    }
    for (void* p : {(void*)a, (void*)b, (void*)d, (void*)bias, (void*)aux})
        if (p != nullptr) CudaBackend::release(p);
    gpu::destroy_gemm_descriptors(plan);
    return timed;
}

// Where each bias gradient of the step is best taken, each GEMM with the heuristic's first
// algorithm, as the trainer runs it: BGRADB in the dweight GEMM (the default build's, while the
// gradient holds zeros; cuBLASLt reads dout again in a kernel of its own) against the plain
// dweight GEMM and the trainer's column sums (column_sums_add, as at later micro-steps); and, for
// fc, the candidate build's DGELU_BGRAD in the fc projection's dinp GEMM against its DGELU.
void compare_bias_gradients(const Model& m) {
    const int N = m.B * m.T, C = m.C, H = 4 * m.C;
    const char* name = m.name.c_str();
    auto first_ms = [](const gpu::GemmKey& key, float beta) {
        const std::vector<Timed> timed = time_algorithms({"", key, beta, 1}, 1);
        return timed.empty() ? -1.0f : timed[0].ms;
    };
    struct Biased {
        const char* layer;
        int in, out;
    };
    for (const Biased& l : {Biased{"qkv", C, 3 * C}, Biased{"attention projection", C, C}, Biased{"fc", C, H}, Biased{"fc projection", H, C}}) {
        const float bgradb = first_ms(dweight_key(N, l.in, l.out, CUBLASLT_EPILOGUE_BGRADB), 1.0f);
        const float plain = first_ms(dweight_key(N, l.in, l.out, CUBLASLT_EPILOGUE_DEFAULT), 1.0f);
        gpu::floatX* dout = random_device((size_t)N * l.out, 6);
        gpu::floatX* dbias = random_device(l.out, 7);
        const float sums = median_ms([&] { gpu::column_sums_add(dbias, dout, N, l.out); }, 10);
        for (gpu::floatX* p : {dout, dbias}) CudaBackend::release(p);
        printf("gemm %s %s bias gradient, a step: BGRADB dweight %.3f ms; plain dweight %.3f + column sums %.3f = %.3f ms\n", name,
               l.layer, bgradb * m.L, plain * m.L, sums * m.L, (plain + sums) * m.L);
    }
    // the fc projection (H -> C)'s dinp GEMM
    const float dgelu = first_ms(dinp_key(N, H, C, CUBLASLT_EPILOGUE_DGELU), 0.0f);
    const float dgelu_bgrad = first_ms(dinp_key(N, H, C, CUBLASLT_EPILOGUE_DGELU_BGRAD), 0.0f);
    if (dgelu_bgrad < 0 || dgelu < 0) {
        printf("gemm %s fc bias gradient from the DGELU GEMM: cuBLASLt has no algorithm for DGELU_BGRAD or DGELU\n", name);
        return;
    }
    printf("gemm %s fc bias gradient from the DGELU GEMM (candidate build), a step: DGELU_BGRAD %.3f ms against DGELU %.3f ms "
           "(then fc's dweight as plain above)\n", name, dgelu_bgrad * m.L, dgelu * m.L);
}

// A table's algorithm for a shape must beat the heuristic's first by this much: a gain inside the
// timing's noise would move a run off cuBLASLt's choice for nothing.
constexpr float kTableMinGain = 0.02f;

// Times each GEMM of m's step; where one of the offered algorithms beats the trainer's by
// kTableMinGain, *table gets it for that shape.
void bench_model(const Model& m, bool accumulate, GemmChoices* table) {
    double used_step = 0.0, fastest_step = 0.0, flop_step = 0.0;
    for (const GemmCall& call : step_gemms(m, accumulate)) {
        const char* name = m.name.c_str();
        const std::vector<Timed> timed = time_algorithms(call, kGemmAlgorithmsAsked);
        if (timed.empty() || timed[0].ms < 0) {
            printf("gemm %s %s: no algorithm\n", name, call.name.c_str());
            continue;
        }
        int best = 0;
        for (int i = 1; i < (int)timed.size(); i++)
            if (timed[i].ms >= 0 && timed[i].ms < timed[best].ms) best = i;
        const float used = timed[0].ms, fastest = timed[best].ms;
        if (fastest < (1.0f - kTableMinGain) * used) table->algorithm[gpu::gemm_shape_text(call.key)] = timed[best].text;
        const gpu::GemmKey& k = call.key;
        const double flop = 2.0 * k.m * k.n * k.k;
        printf("gemm %s %-28s m=%5d n=%5d k=%5d %-13s x%-2d  trainer's %.3f ms (%3.0f TFLOP/s)  fastest of %2zu: #%d %.3f ms (%3.0f)\n",
               name, call.name.c_str(), k.m, k.n, k.k, gpu::gemm_epilogue_name(k.epilogue), call.calls, used, tflops(flop, used),
               timed.size(), best, fastest, tflops(flop, fastest));
        if (call.later) continue;
        used_step += used * call.calls;
        fastest_step += fastest * call.calls;
        flop_step += flop * call.calls;
    }
    printf("gemm %s B=%d T=%d: the step's GEMMs take %.2f ms (%.0f TFLOP/s) with the trainer's algorithms, %.2f ms with the "
           "fastest of each\n", m.name.c_str(), m.B, m.T, used_step, tflops(flop_step, (float)used_step), fastest_step);
    compare_bias_gradients(m);
}

[[noreturn]] void usage(const std::string& why) {
    fatal(2, "bench_gemm: %s; usage: bench_gemm [-e MODEL -b B [-t T]] [--accumulate] [--write FILE]", why.c_str());
}

}  // namespace

int main(int argc, char** argv) {
    int B = 0, T = 1024;
    std::string desc, write;
    bool accumulate = false;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--accumulate") {
            accumulate = true;
            continue;
        }
        if (i + 1 >= argc) usage(a + " without a value");
        const std::string v = argv[++i];
        if (a == "-e") desc = v;
        else if (a == "-b" || a == "-t") {
            long x = 0;
            if (!parse_whole_number(v, 1, INT_MAX, &x)) usage(a + ": expected a whole number from 1, not '" + v + "'");
            (a == "-b" ? B : T) = (int)x;
        }
        else if (a == "--write") write = v;
        else usage("unknown flag " + a);
    }
    std::vector<Model> models = {{"d12", 64, 1024, 768, 12, 50304}, {"d48", 16, 1024, 1600, 48, 50304}};
    if (!desc.empty() || B != 0 || T != 1024) {
        GPT2Config mc;
        if (desc.empty() || !config_from_descriptor(desc, &mc)) usage("-e: expected a model descriptor as train_gpt -e takes (dX, gpt3:cX, L=,NH=,C=), not '" + desc + "'");
        if (B < 1 || T < 1 || T > mc.max_seq_len) usage("-b and -t: expected B >= 1 and T from 1 to " + std::to_string(mc.max_seq_len));
        models = {{desc, B, T, mc.channels, mc.num_layers, mc.padded_vocab_size}};
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("skipped: no GPU\n");
        return 0;
    }
    const gpu::Context& c = gpu::ctx();
    GemmChoices table{c.device_name, c.num_sms, (long)cublasLtGetVersion(), (long)c.lt_workspace_size, gpu::gemm_precision(), {}};
    for (const Model& m : models) bench_model(m, accumulate, &table);
    if (!write.empty()) {
        AtomicFile f(write);
        const std::string text = format_gemm_choices(table);
        f.write(text.data(), text.size());
        f.commit();
        printf("gemm table: %zu shape(s) whose fastest algorithm beats cuBLASLt's first by %.0f%% or more, written to %s "
               "(train_gpt --gemm-algos %s)\n", table.algorithm.size(), 100 * kTableMinGain, write.c_str(), write.c_str());
    }
    return 0;
}
