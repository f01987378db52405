// Linear layer out = inp @ W^T + bias, W stored (OC, C) row-major like torch.nn.Linear, through
// cuBLASLt. cuBLAS is column-major: a row-major (R, K) matrix is a column-major (K, R) one, so
// out^T (OC, N) = W^T' (OC, C) @ inp^T (C, N) where W^T' reads the stored W transposed.
// Forward adds the bias in the GEMM epilogue (no second pass over out). Backward: dinp is
// overwritten, dweight accumulates through beta = 1, and dbias += uses the deterministic column
// sums (cuBLASLt's BGRAD epilogues overwrite instead of adding, and are picky about layouts).
// Compute is fp32 in both builds; the fp32 build gets no TF32, so it matches the CPU closely.
#pragma once
#include "column_sum.cuh"
#include "common.cuh"

namespace gpu {

// the largest power of two (up to 256) dividing the address: tells the heuristic which kernels
// may be used, since zero/ hands out tensors at arbitrary element offsets
inline uint32_t pointer_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && (a % align) != 0) align >>= 1;
    return align;
}

// column-major D (m, n) = alpha op(A) op(B) + beta D (+ bias[m] per row when bias != null)
inline void gemm_lt(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                    bool trans_a, bool trans_b, int lda, int ldb, int ldd, float beta) {
    Context& c = ctx();
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (bias != nullptr) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    // stored shapes: A is (k, m) when transposed else (m, k); likewise B
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, kCudaFloatX, trans_a ? k : m, trans_a ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, kCudaFloatX, trans_b ? n : k, trans_b ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, kCudaFloatX, m, n, ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &c.lt_workspace_size, sizeof(c.lt_workspace_size)));
    uint32_t al_a = pointer_alignment(a), al_b = pointer_alignment(b), al_d = pointer_alignment(d);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));

    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c.lt, desc, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found == 0)
        fatal(1, "cuBLASLt: no algorithm for m=%d n=%d k=%d transA=%d transB=%d bias=%d", m, n, k, (int)trans_a,
              (int)trans_b, bias != nullptr);
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(c.lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo,
                                c.lt_workspace, c.lt_workspace_size, c.stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
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
    const bool epilogue = bias != nullptr && pointer_alignment(bias) >= 16;
    // column-major: out^T (OC, N) = (W stored (C, OC))^T @ (inp stored (C, N))
    gemm_lt(out, w, inp, epilogue ? bias : nullptr, OC, N, C, true, false, C, C, OC, 0.0f);
    if (bias != nullptr && !epilogue) {
        const size_t n = (size_t)N * OC;
        add_bias_kernel<<<(unsigned)std::min<size_t>((n + 255) / 256, 65535), 256, 0, ctx().stream>>>(out, bias, n, OC);
        check_launch();
    }
}

// dinp (N, C) = dout @ W (overwritten); dweight (OC, C) += dout^T @ inp; dbias += column sums
inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                            const floatX* w, int N, int C, int OC) {
    if (N == 0) return;
    // dinp^T (C, N) = (W stored (C, OC)) @ (dout stored (OC, N))
    gemm_lt(dinp, w, dout, nullptr, C, N, OC, false, false, C, OC, C, 0.0f);
    // dW^T (C, OC) = (inp stored (C, N)) @ (dout stored (OC, N))^T
    gemm_lt(dweight, inp, dout, nullptr, C, OC, N, false, true, C, OC, C, 1.0f);
    if (dbias != nullptr) column_sums_add(dbias, nullptr, dout, nullptr, nullptr, nullptr, N, OC);
}

}  // namespace gpu
