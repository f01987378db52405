// Linear layer out = inp @ weight^T + bias with weight stored (OC, C) like torch.nn.Linear.
// The products go through OpenBLAS; only the bias sums are written here.
#pragma once
#include <cblas.h>
#include <cstddef>

namespace cpu {

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f,
                out, OC);
    if (bias == nullptr) return;
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* o = out + (size_t)i * OC;
        for (int j = 0; j < OC; j++) o[j] += bias[j];
    }
}

// dinp is overwritten; dweight and dbias accumulate (+=) so micro-batches add up.
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
    if (dbias == nullptr) return;
    #pragma omp parallel for
    for (int j = 0; j < OC; j++) {
        float sum = 0.0f;
        for (int i = 0; i < N; i++) sum += dout[(size_t)i * OC + j];
        dbias[j] += sum;
    }
}

}  // namespace cpu
