// Linear layer out = inp @ weight^T + bias with weight stored (OC, C) like torch.nn.Linear.
// The products go through OpenBLAS; only the bias sums are written here.
#pragma once
#include <cstddef>
#ifndef NO_BLAS
#include <cblas.h>
#endif

namespace cpu {

// Row-major C = alpha * op(A) @ op(B) + beta * C, op transposing where asked.
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
#ifndef NO_BLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
#else
    // Built without OpenBLAS (make NO_BLAS=1, for a GPU machine that lacks it, where this is only
    // the tests' reference): plain loops, ordered so the innermost one runs along memory.
    #pragma omp parallel for
    for (int i = 0; i < M; i++) {
        float* c = C + (size_t)i * ldc;
        for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int k = 0; k < K; k++) {
            float a = alpha * (trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
            if (trans_b) {
                for (int j = 0; j < N; j++) c[j] += a * B[(size_t)j * ldb + k];
            } else {
                const float* b = B + (size_t)k * ldb;
                for (int j = 0; j < N; j++) c[j] += a * b[j];
            }
        }
    }
#endif
}

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
    gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias == nullptr) return;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* o = out + (size_t)i * OC;
        for (int j = 0; j < OC; j++) o[j] += bias[j];
    }
}

// dbias += the column sums of dout (N, OC)
inline void bias_backward(float* dbias, const float* dout, int N, int OC) {
    #pragma omp parallel for
    for (int j = 0; j < OC; j++) {
        float sum = 0.0f;
        for (int i = 0; i < N; i++) sum += dout[(size_t)i * OC + j];
        dbias[j] += sum;
    }
}

// dinp is overwritten; dweight and dbias accumulate (+=) so micro-batches add up.
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int N, int C, int OC) {
    gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

}  // namespace cpu
