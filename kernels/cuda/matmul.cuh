// Linear layer out = inp @ W^T + bias, W stored (OC, C) row-major like torch.nn.Linear, through
// cuBLASLt. cuBLAS is column-major: a row-major (R, K) matrix is a column-major (K, R) one, so
// out^T (OC, N) = W^T' (OC, C) @ inp^T (C, N) where W^T' reads the stored W transposed.
// Forward adds the bias in the GEMM epilogue (no second pass over out). Backward: dinp is
// overwritten, dweight accumulates through beta = 1, and dbias += uses the deterministic column
// sums (cuBLASLt's BGRADB epilogue writes instead of adding). The bf16 build also puts
// GELU in the epilogues (GELU_AUX_BIAS forward: the pre-GELU output and its GELU from one GEMM;
// DGELU backward: dinp times GELU' of the pre-GELU input), and takes dbias from BGRADB inside the
// dweight GEMM where dbias still holds zeros; wherever cuBLASLt has no algorithm for an epilogue
// (or a pointer is not 16-byte aligned) the separate kernels run instead, as in the fp32 build.
// The candidate build (KERNELS=candidate) uses no BGRADB, which cuBLASLt runs as a second pass
// over dout in a kernel of its own, slower than our column sums (docs/cuda.md has the figures):
// the bias gradient of the layer below the GELU comes from the DGELU GEMM (DGELU_BGRAD: the column
// sums of the dinp it makes), the others from the column sums.
// Compute is fp32 in both builds; the fp32 build gets no TF32, so it matches the CPU closely.
#pragma once
#include <initializer_list>
#include <iterator>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "../gemm_choices.h"
#include "column_sum.cuh"
#include "common.cuh"
#include "gelu.cuh"

namespace gpu {

// The alignment the heuristic is told depends on the shape only, never on where the operands
// sit: 16 bytes when every leading dimension keeps rows 16-byte aligned (then, in the model,
// every operand is: zero/ and GPT2 place tensors at multiples of C), else one element. So a
// shape gets one algorithm at every layer and every -r, and recompute stays bit-identical.
inline uint32_t gemm_alignment(int lda, int ldb, int ldd, std::initializer_list<const void*> ptrs) {
    const int per16 = 16 / (int)sizeof(floatX);
    if (lda % per16 != 0 || ldb % per16 != 0 || ldd % per16 != 0) return sizeof(floatX);
    for (const void* p : ptrs)
        if (p != nullptr && !aligned16(p)) return sizeof(floatX);  // only outside the model (tests)
    return 16;
}

// A matmul's cuBLASLt descriptors and chosen algorithm, made once per shape and epilogue:
// creating them and asking the heuristic costs more than a small GEMM. A and B are floatX, or
// fp8 (--fp8, kernels/cuda/fp8.cuh: D stays floatX; fast_accum is cuBLASLt's FAST_ACCUM for them).
struct GemmKey {
    int m, n, k, lda, ldb, ldd;
    bool trans_a, trans_b;
    cublasLtEpilogue_t epilogue;
    uint32_t align;
    cudaDataType_t a_type = kCudaFloatX, b_type = kCudaFloatX;
    bool fast_accum = false;
    bool operator<(const GemmKey& o) const {
        return std::tie(m, n, k, lda, ldb, ldd, trans_a, trans_b, epilogue, align, a_type, b_type, fast_accum) <
               std::tie(o.m, o.n, o.k, o.lda, o.ldb, o.ldd, o.trans_a, o.trans_b, o.epilogue, o.align, o.a_type, o.b_type, o.fast_accum);
    }
};
struct GemmPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    bool found;  // the heuristic had an algorithm (always, for the plain and bias epilogues)
};

// What the GEMM does after the product: DEFAULT nothing; BIAS adds bias per row of D;
// GELU_AUX_BIAS writes aux = D + bias and D = gelu(aux); DGELU multiplies D by gelu'(aux);
// DGELU_BGRAD does so and writes bias = the sums of D's rows (over n); BGRADB writes bias = the
// sums of op(B) over k (the column sums of dout in dweight's GEMM).
struct GemmEpilogue {
    cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    const void* aux = nullptr;  // m x n like D, leading dimension m
};

// the epilogues with a matrix beside D (GemmEpilogue::aux): the pre-GELU values
inline bool epilogue_has_aux(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// the epilogues a --gemm-algos table can name, in kGemmEpilogueNames' order
constexpr cublasLtEpilogue_t kGemmEpilogues[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                                 CUBLASLT_EPILOGUE_DGELU,   CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADB};
static_assert(std::size(kGemmEpilogues) == std::size(kGemmEpilogueNames), "one name for each epilogue");
// an epilogue as the table spells it ("" for one it cannot name)
inline const char* gemm_epilogue_name(cublasLtEpilogue_t e) {
    for (size_t i = 0; i < std::size(kGemmEpilogues); i++)
        if (kGemmEpilogues[i] == e) return kGemmEpilogueNames[i];
    return "";
}
inline std::string gemm_shape_text(const GemmKey& k) {
    return ::gemm_shape_text(k.m, k.n, k.k, k.lda, k.ldb, k.ldd, k.trans_a, k.trans_b, gemm_epilogue_name(k.epilogue), (int)k.align);
}
// the key a table's shape text names (a text parse_gemm_choices accepted)
inline GemmKey gemm_key_of(const std::string& shape) {
    std::istringstream f(shape);
    GemmKey k;
    int trans_a, trans_b;
    std::string epilogue;
    f >> k.m >> k.n >> k.k >> k.lda >> k.ldb >> k.ldd >> trans_a >> trans_b >> epilogue >> k.align;
    k.trans_a = trans_a == 1, k.trans_b = trans_b == 1;
    k.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    for (size_t i = 0; i < std::size(kGemmEpilogues); i++)
        if (epilogue == kGemmEpilogueNames[i]) k.epilogue = kGemmEpilogues[i];
    return k;
}
// an algorithm as the table names it: its configuration, nine numbers joined by ':'
inline std::string gemm_algorithm_text(const cublasLtMatmulAlgo_t& algo) {
    constexpr cublasLtMatmulAlgoConfigAttributes_t kConfigs[kGemmAlgorithmConfigs] = {
        CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
        CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
        CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
    std::string text;
    for (cublasLtMatmulAlgoConfigAttributes_t attr : kConfigs) {
        size_t size = 0;
        CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &size));
        uint32_t value = 0;  // each is 2 or 4 bytes, never negative (little-endian: the low bytes)
        if (size > sizeof(value)) fatal(1, "cuBLASLt: algorithm configuration %d takes %zu bytes, expected at most 4", (int)attr, size);
        CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, size, &size));
        text += (text.empty() ? "" : ":") + std::to_string(value);
    }
    return text;
}
inline std::string gemm_precision() { return sizeof(floatX) == 2 ? "bf16" : "fp32"; }

// Every matmul's plan, made at its shape's first call (or, for the shapes of a --gemm-algos table,
// when the table is taken) and kept for the process's life, like the cuBLASLt handle they belong to.
inline std::map<GemmKey, GemmPlan>& gemm_plans() {
    static std::map<GemmKey, GemmPlan> plans;
    return plans;
}

// The plan's descriptors, and the first `want` algorithms cuBLASLt's heuristic offers for it (1;
// kGemmAlgorithmsAsked for a --gemm-algos table, as scripts/bench_gemm asks), best first; returns
// how many it had.
inline int make_gemm_descriptors(const GemmKey& key, GemmPlan& g, int want, cublasLtMatmulHeuristicResult_t* heur) {
    Context& c = ctx();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (key.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue, sizeof(key.epilogue)));
    if (epilogue_has_aux(key.epilogue)) {
        const int64_t aux_ld = key.m;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    if (key.a_type != kCudaFloatX || key.b_type != kCudaFloatX) {
        const int8_t fast_accum = key.fast_accum ? 1 : 0;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
    }
    // stored shapes: A is (k, m) when transposed else (m, k); likewise B
    const int m = key.m, n = key.n, k = key.k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.la, key.a_type, key.trans_a ? k : m, key.trans_a ? m : k, key.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.lb, key.b_type, key.trans_b ? n : k, key.trans_b ? k : n, key.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.ld, kCudaFloatX, m, n, key.ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &c.lt_workspace_size, sizeof(c.lt_workspace_size)));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &key.align, sizeof(key.align)));
    int found = 0;
    // a combination of types, layouts and epilogue that cuBLASLt has no kernel for (an fp8 GEMM's
    // epilogue, often) is "not supported" rather than none found: none found, for the caller's fallback
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(c.lt, g.desc, g.la, g.lb, g.ld, g.ld, pref, want, heur, &found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
    else CUBLAS_CHECK(status);
    cublasLtMatmulPreferenceDestroy(pref);
    return found;
}

inline void destroy_gemm_descriptors(GemmPlan& g) {
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(g.desc));
    for (cublasLtMatrixLayout_t l : {g.la, g.lb, g.ld}) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(l));
}

// a shape's plan with the heuristic's first algorithm
inline GemmPlan make_gemm_plan(const GemmKey& key) {
    GemmPlan g;
    cublasLtMatmulHeuristicResult_t heur;
    const int found = make_gemm_descriptors(key, g, 1, &heur) > 0 && heur.state == CUBLAS_STATUS_SUCCESS ? 1 : 0;
    // a floatX GEMM always has BIAS; an fp8 one may not, and adds its bias in a pass of its own
    const bool fp8 = key.a_type != kCudaFloatX || key.b_type != kCudaFloatX;
    const bool optional = key.epilogue != CUBLASLT_EPILOGUE_DEFAULT && (key.epilogue != CUBLASLT_EPILOGUE_BIAS || fp8);
    if (found == 0 && !optional)
        fatal(1, "cuBLASLt: no algorithm for m=%d n=%d k=%d transA=%d transB=%d epilogue=%d A type %d B type %d", key.m, key.n, key.k,
              (int)key.trans_a, (int)key.trans_b, (int)key.epilogue, (int)key.a_type, (int)key.b_type);
    g.found = found > 0;
    if (g.found) g.algo = heur.algo;
    return g;
}

// From now on each GEMM shape that `t` names runs the algorithm it names, taken from among the
// kGemmAlgorithmsAsked the heuristic offers (what bench_gemm timed), and planned here, before
// any GEMM runs; plans made before are dropped. Returns "" or why not: `t` was timed on another
// GPU, cuBLASLt, workspace or precision, or names an algorithm the heuristic does not offer.
inline std::string use_gemm_choices(const GemmChoices& t) {
    Context& c = ctx();
    if (c.capturing || c.live_graphs > 0) return "a CUDA graph holds the algorithms planned so far";
    const long version = (long)cublasLtGetVersion();
    if (t.gpu != c.device_name || t.sms != c.num_sms || t.cublaslt_version != version || t.workspace != (long)c.lt_workspace_size ||
        t.precision != gemm_precision())
        return "timed on " + t.gpu + " (" + std::to_string(t.sms) + " SMs) with cuBLASLt " + std::to_string(t.cublaslt_version) + ", " +
               std::to_string(t.workspace) + " bytes of workspace, " + t.precision + "; this run has " + c.device_name + " (" +
               std::to_string(c.num_sms) + " SMs), cuBLASLt " + std::to_string(version) + ", " + std::to_string(c.lt_workspace_size) +
               ", " + gemm_precision() + " (scripts/bench_gemm --write makes a table here)";
    std::map<GemmKey, GemmPlan> chosen;
    auto drop = [](std::map<GemmKey, GemmPlan>& plans) {
        for (auto& [key, g] : plans) destroy_gemm_descriptors(g);
        plans.clear();
    };
    for (const auto& [shape, algorithm] : t.algorithm) {
        const GemmKey key = gemm_key_of(shape);
        GemmPlan g;
        std::vector<cublasLtMatmulHeuristicResult_t> heur(kGemmAlgorithmsAsked);
        heur.resize(make_gemm_descriptors(key, g, kGemmAlgorithmsAsked, heur.data()));
        g.found = false;
        for (const cublasLtMatmulHeuristicResult_t& h : heur)
            if (!g.found && h.state == CUBLAS_STATUS_SUCCESS && gemm_algorithm_text(h.algo) == algorithm) g.algo = h.algo, g.found = true;
        chosen.emplace(key, g);
        if (!g.found) {
            drop(chosen);
            return "GEMM " + shape + ": algorithm " + algorithm + " is not among the " + std::to_string(heur.size()) +
                   " cuBLASLt offers here";
        }
    }
    drop(gemm_plans());
    gemm_plans() = std::move(chosen);
    return "";
}

// the dequantisation multipliers of fp8 A and B (device floats: cuBLASLt's A/B scale pointers
// multiply the product of the codes by them), null for floatX operands
struct GemmDescales {
    const float *a = nullptr, *b = nullptr;
};

// column-major D (m, n) = alpha op(A) op(B) + beta D, then the epilogue, for the GEMM `key`
// describes (its operands' types: floatX, or fp8 with their descales). Returns false, having
// queued nothing, when cuBLASLt has no algorithm for an epilogue other than DEFAULT (and, for
// floatX operands, BIAS).
inline bool gemm_lt_key(const GemmKey& key, floatX* d, const void* a, const void* b, float beta, const GemmEpilogue& epilogue,
                        const GemmDescales& descales) {
    std::map<GemmKey, GemmPlan>& plans = gemm_plans();
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_gemm_plan(key)).first;
    GemmPlan& g = it->second;
    if (!g.found) return false;
    if (epilogue.bias != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias, sizeof(epilogue.bias)));
    if (epilogue.aux != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epilogue.aux,
                                                    sizeof(epilogue.aux)));
    if (descales.a != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &descales.a, sizeof(descales.a)));
    if (descales.b != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &descales.b, sizeof(descales.b)));
    Context& c = ctx();
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(c.lt, g.desc, &alpha, a, g.la, b, g.lb, &beta, d, g.ld, d, g.ld, &g.algo,
                                c.lt_workspace, c.lt_workspace_size, c.stream));
    check_launch();
    return true;
}

// gemm_lt_key for floatX operands, the key made from the shape
inline bool gemm_lt(floatX* d, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a, bool trans_b,
                    int lda, int ldb, int ldd, float beta, const GemmEpilogue& epilogue = {}) {
    const GemmKey key{m, n, k, lda, ldb, ldd, trans_a, trans_b, epilogue.kind, gemm_alignment(lda, ldb, ldd, {a, b, d})};
    return gemm_lt_key(key, d, a, b, beta, epilogue, {});
}

// adds bias[j] to column j of the row-major (N, OC) matrix out
__global__ void add_bias_kernel(floatX* out, const floatX* bias, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = (floatX)((float)out[i] + (float)bias[i % OC]);
}

// out (N, OC) = inp (N, C) @ W^T + bias; bias may be null
inline void matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C,
                           int OC) {
    if (N == 0 || OC == 0) return;
    // cuBLASLt's bias epilogue wants an aligned bias; in the model biases sit at multiples of C,
    // so only an odd C lands here, and then the bias goes in its own pass
    const bool epilogue = bias != nullptr && aligned16(bias);
    // column-major: out^T (OC, N) = (W stored (C, OC))^T @ (inp stored (C, N))
    gemm_lt(out, w, inp, OC, N, C, true, false, C, C, OC, 0.0f,
            epilogue ? GemmEpilogue{CUBLASLT_EPILOGUE_BIAS, bias} : GemmEpilogue{});
    if (bias != nullptr && !epilogue) {
        const size_t n = (size_t)N * OC;
        add_bias_kernel<<<(unsigned)std::min<size_t>((n + 255) / 256, 65535), 256, 0, ctx().stream>>>(out, bias, n, OC);
        check_launch();
    }
}

// pre_gelu (N, OC) = inp (N, C) @ W^T + bias and out_gelu = gelu(pre_gelu), both stored
inline void matmul_gelu_forward(floatX* out_gelu, floatX* pre_gelu, const floatX* inp, const floatX* w,
                                const floatX* bias, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
#ifndef ENABLE_FP32
    // one GEMM writes both, GELU taken of the fp32 result
    if (bias != nullptr && aligned16(bias) && aligned16(pre_gelu) && gemm_alignment(C, C, OC, {w, inp, out_gelu}) == 16 &&
        gemm_lt(out_gelu, w, inp, OC, N, C, true, false, C, C, OC, 0.0f,
                GemmEpilogue{CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_gelu}))
        return;
#endif
    matmul_forward(pre_gelu, inp, w, bias, N, C, OC);
    gelu_forward(out_gelu, pre_gelu, (size_t)N * OC);
}

// dinp (N, C) = dout @ W (overwritten), times gelu'(pre_gelu) when pre_gelu is given (inp was
// gelu(pre_gelu): dinp is then the gradient of pre_gelu); dweight (OC, C) += dout^T @ inp;
// dbias += column sums of dout. dbias_zeroed: dbias holds zeros, so a sum written over it
// (cuBLASLt's BGRADB) is the same as one added to it. pre_gelu_dbias: null, or the bias gradient
// of the layer that made pre_gelu, holding zeros; the candidate build writes dinp's column sums
// there when its DGELU GEMM can. Returns whether it did (else the caller's next backward sums them).
inline bool matmul_backward_impl(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                                 const floatX* w, const floatX* pre_gelu, floatX* pre_gelu_dbias, int N, int C, int OC,
                                 bool dbias_zeroed) {
    if (N == 0) return false;
    bool fused_gelu = false, fused_bias = false, fused_pre_gelu_bias = false;
#ifndef ENABLE_FP32
    const bool gelu_epilogue = pre_gelu != nullptr && aligned16(pre_gelu) && gemm_alignment(C, OC, C, {w, dout, dinp}) == 16;
#ifdef KERNELS_CANDIDATE
    if (gelu_epilogue && pre_gelu_dbias != nullptr && aligned16(pre_gelu_dbias))
        fused_gelu = fused_pre_gelu_bias = gemm_lt(dinp, w, dout, C, N, OC, false, false, C, OC, C, 0.0f,
                                                   GemmEpilogue{CUBLASLT_EPILOGUE_DGELU_BGRAD, pre_gelu_dbias, pre_gelu});
#endif
    if (gelu_epilogue && !fused_gelu)
        fused_gelu = gemm_lt(dinp, w, dout, C, N, OC, false, false, C, OC, C, 0.0f,
                             GemmEpilogue{CUBLASLT_EPILOGUE_DGELU, nullptr, pre_gelu});
#ifndef KERNELS_CANDIDATE
    if (dbias != nullptr && dbias_zeroed && aligned16(dbias) && gemm_alignment(C, OC, C, {inp, dout, dweight}) == 16)
        fused_bias = gemm_lt(dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.0f,
                             GemmEpilogue{CUBLASLT_EPILOGUE_BGRADB, dbias});
#endif
#endif
    if (!fused_gelu) {
        // dinp^T (C, N) = (W stored (C, OC)) @ (dout stored (OC, N))
        gemm_lt(dinp, w, dout, C, N, OC, false, false, C, OC, C, 0.0f);
        if (pre_gelu != nullptr) gelu_backward(dinp, pre_gelu, (size_t)N * C);
    }
    if (!fused_bias) {
        // dW^T (C, OC) = (inp stored (C, N)) @ (dout stored (OC, N))^T
        gemm_lt(dweight, inp, dout, C, OC, N, false, true, C, OC, C, 1.0f);
        if (dbias != nullptr) column_sums_add(dbias, dout, N, OC);
    }
    return fused_pre_gelu_bias;
}

// the scratch matmul_backward asks for at most: the bias gradient's column sums (none where
// cuBLASLt sums them)
inline size_t matmul_backward_scratch_bytes(int N, int OC) { return column_sums_scratch_bytes(N, OC); }

inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                            const floatX* w, int N, int C, int OC, bool dbias_zeroed) {
    matmul_backward_impl(dinp, dweight, dbias, dout, inp, w, nullptr, nullptr, N, C, OC, dbias_zeroed);
}

// the backward of out = gelu(pre_gelu) @ W^T + bias, with inp = gelu(pre_gelu): dinp is the
// gradient of pre_gelu; pre_gelu_dbias and the result as matmul_backward_impl's
inline bool matmul_gelu_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                                 const floatX* pre_gelu, const floatX* w, int N, int C, int OC, bool dbias_zeroed,
                                 floatX* pre_gelu_dbias) {
    return matmul_backward_impl(dinp, dweight, dbias, dout, inp, w, pre_gelu, pre_gelu_dbias, N, C, OC, dbias_zeroed);
}

}  // namespace gpu
