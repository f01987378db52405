// --fp8 on the GPU: the blocks' matmuls on fp8 operands through cuBLASLt (kernels/fp8_scaling.h
// says what is computed; the CPU backend's fp8 ops are the reference the GPU tests hold these to).
// A candidate no GPU has run yet: only the KERNELS=candidate bf16 build has it; elsewhere --fp8
// is refused at start (fp8_refusal) and the ops below are never reached.
//
// Each operand is cast by two kernels: fp8_amax_kernel takes its amax (the scale must be known
// before the first value is rounded: current scaling), then fp8_cast_kernel rounds each value
// times the scale and writes the codes as stored, transposed, or both from one read. Hopper's fp8
// GEMMs take only "TN" operands (both contiguous along the summed dimension), so the backward's
// GEMMs read transposed copies: dinp = dout @ W reads W^T, dweight = dout^T @ inp reads dout^T and
// inp^T. dout is cast once, into both layouts.
//
// cuBLASLt's side (matmul.cuh's gemm_lt_key): A and B as CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 (never
// both e5m2, which it refuses: weights and inputs e4m3, gradients e5m2), D bf16, fp32 compute.
// The A/B scale pointers are dequantisation multipliers: D = descale_a * descale_b * (A @ B), so
// they point at each cast's 1 / scale (Fp8Scale::descale). D_SCALE is left unset: it scales only
// an fp8 D, and ours is bf16. AMAX_D is not used: it reports the amax of D, which only an fp8 D's
// own scale would need, and our amaxes are of the casts' inputs. FAST_ACCUM off (kFp8FastAccum):
// partial sums are promoted to fp32 periodically, where on they stay in the tensor cores' narrower
// accumulator for the whole summed length (d12's weight gradients sum 65,536 products); the test
// measures both (Cuda.Fp8AccumulationModesAtTheLongestSum). The epilogues are asked for as in bf16 (BIAS,
// GELU_AUX_BIAS forward; DGELU, and DGELU_BGRAD in this build, backward), each falling back to the
// separate kernels where cuBLASLt offers no fp8 algorithm for it (gemm_lt_key returns false); the
// bias gradients are the column sums of the bf16 output gradient, as the CPU's are (BGRADB would
// sum the fp8 copy).
#pragma once
#include <algorithm>
#include <string>

#include "../fp8_scaling.h"
#include "column_sum.cuh"
#include "common.cuh"
#include "gelu.cuh"
#include "matmul.cuh"

namespace gpu {

using Fp8 = Fp8Workspace<uint8_t>;

// why --fp8 cannot run with this build on this GPU ("" where it can; the GPU is asked only once
// the context exists, so that --plan asks nothing of a GPU it may not have)
inline std::string fp8_refusal() {
#if defined(ENABLE_FP32)
    return "the fp32 CUDA build (PRECISION=FP32) has no fp8 path; the bf16 build has it, or --device cpu emulates it";
#elif !defined(KERNELS_CANDIDATE)
    return "the CUDA fp8 path is a candidate no GPU has run yet, built only with KERNELS=candidate "
           "(make -f kernels/cuda.mk KERNELS=candidate build/candidate/train_gpt; docs/fp8.md); --device cpu emulates it";
#else
    if (!context_raw().ready) return "";
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx().device));
    if (prop.major * 10 + prop.minor >= 89) return "";
    return "fp8 tensor cores need compute capability 8.9 or later (Ada, Hopper); " + std::string(prop.name) + " is " +
           std::to_string(prop.major) + "." + std::to_string(prop.minor) + "; --device cpu emulates it";
#endif
}

#if defined(KERNELS_CANDIDATE) && !defined(ENABLE_FP32)

constexpr bool kFp8FastAccum = false;
constexpr int kCastTile = 64, kCastThreads = 256;

// *amax_bits = the largest of its value and |x|'s bits over n values (kernels/fp8_scaling.h: a
// NaN above all), 16 bytes a load: x 16-byte aligned, n a multiple of 8; kCastThreads a block
__global__ void __launch_bounds__(kCastThreads) fp8_amax_kernel(const floatX* x, size_t n, uint32_t* amax_bits) {
    uint32_t amax = 0;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < n; i += (size_t)gridDim.x * blockDim.x * x128::size) {
        const x128 v = load128(x + i);
        for (int k = 0; k < x128::size; k++) amax = max(amax, abs_bits((float)v[k]));
    }
    __shared__ uint32_t warp_amax[kCastThreads / kWarp];
    amax = __reduce_max_sync(0xffffffffu, amax);
    if (threadIdx.x % kWarp == 0) warp_amax[threadIdx.x / kWarp] = amax;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < kCastThreads / kWarp; w++) amax = max(amax, warp_amax[w]);
    if (amax > 0) atomicMax(amax_bits, amax);  // one a block
}

// The codes of x (rows x cols, row-major) times the scale its amax gives, in format F: into out
// as stored (rows x cols) and into out_t transposed (cols x rows), either null. A block casts a
// 64 x 64 tile: each thread two adjacent columns of 8 rows, read once; the tile's codes go through
// shared memory to be written transposed, 4 bytes (4 source rows) a store. Block (0, 0) writes the
// dequantisation multiplier beside the amax, and counts the cast if its amax is not finite.
// rows and cols multiples of 16 (fp8_gemm_shape), so a pair or a group of 4 is in or out whole.
template <Fp8Format F>
__global__ void __launch_bounds__(kCastThreads) fp8_cast_kernel(const floatX* x, int rows, int cols, uint8_t* out, uint8_t* out_t,
                                                                 Fp8Scale* noted, unsigned* nonfinite_amaxes) {
    __shared__ uint8_t tile[kCastTile][kCastTile + 4];  // +4: the transposed reads of a warp fall in different banks
    const uint32_t amax = noted->amax_bits;
    const float scale = fp8_scale(amax, F);
    const int r0 = blockIdx.y * kCastTile, c0 = blockIdx.x * kCastTile;
    const int pair = threadIdx.x % kWarp, row_group = threadIdx.x / kWarp, c = c0 + 2 * pair;
    for (int i = row_group; i < kCastTile; i += kCastThreads / kWarp) {
        const int r = r0 + i;
        if (r >= rows || c >= cols) continue;
        const size_t at = (size_t)r * cols + c;
        const uint8_t lo = fp8_from_float((float)x[at] * scale, F), hi = fp8_from_float((float)x[at + 1] * scale, F);
        if (out != nullptr) *(uint16_t*)(out + at) = (uint16_t)(lo | hi << 8);
        tile[i][2 * pair] = lo, tile[i][2 * pair + 1] = hi;
    }
    if (out_t != nullptr) {
        __syncthreads();
        constexpr int kGroups = kCastTile / 4;  // threads per transposed row: 4 source rows each
        for (int j = threadIdx.x / kGroups; j < kCastTile; j += kCastThreads / kGroups) {
            const int i = threadIdx.x % kGroups * 4;
            if (c0 + j >= cols || r0 + i >= rows) continue;
            const uint32_t four = tile[i][j] | tile[i + 1][j] << 8 | tile[i + 2][j] << 16 | (uint32_t)tile[i + 3][j] << 24;
            *(uint32_t*)(out_t + (size_t)(c0 + j) * rows + r0 + i) = four;
        }
    }
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        noted->descale = fp8_descale(amax, F);
        if (amax_nonfinite(amax)) atomicAdd(nonfinite_amaxes, 1u);
    }
}

// x (rows x cols) cast as operand `role` (kernels/fp8_scaling.h): its amax, then its codes into
// out and/or out_t (as fp8_cast_kernel's), noted in f's scales
inline void fp8_cast(const floatX* x, int rows, int cols, uint8_t* out, uint8_t* out_t, Fp8Operand role, const Fp8& f) {
    const size_t n = (size_t)rows * cols;
    if (!aligned16(x) || n % x128::size != 0 || rows % kFp8DimMultiple != 0 || cols % kFp8DimMultiple != 0)
        fatal(1, "fp8 cast of %d x %d: expected a 16-byte aligned tensor, both sides multiples of %d", rows, cols, kFp8DimMultiple);
    Fp8Scale* noted = f.scales + role;
    CUDA_CHECK(cudaMemsetAsync(&noted->amax_bits, 0, sizeof(noted->amax_bits), stream()));
    fp8_amax_kernel<<<elementwise_blocks(n / x128::size, kCastThreads), kCastThreads, 0, stream()>>>(x, n, &noted->amax_bits);
    check_launch();
    const dim3 grid(ceil_div(cols, kCastTile), ceil_div(rows, kCastTile));
    if (fp8_format_of(role) == Fp8Format::E4M3)
        fp8_cast_kernel<Fp8Format::E4M3><<<grid, kCastThreads, 0, stream()>>>(x, rows, cols, out, out_t, noted, f.nonfinite_amaxes);
    else
        fp8_cast_kernel<Fp8Format::E5M2><<<grid, kCastThreads, 0, stream()>>>(x, rows, cols, out, out_t, noted, f.nonfinite_amaxes);
    check_launch();
}

inline cudaDataType_t fp8_cuda_type(Fp8Operand role) {
    return fp8_format_of(role) == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}
// column-major D (m, n) = A^T B + beta D on codes, "TN": A stored (k, m) with leading dimension
// lda, B stored (k, n) with ldb, each dequantised by its cast's multiplier; then the epilogue. As
// gemm_lt_key: false where cuBLASLt has no algorithm for the epilogue (BIAS included). fast_accum:
// the other accumulation mode, for the test that measures both.
inline bool gemm_fp8(floatX* d, const uint8_t* a, Fp8Operand a_role, const uint8_t* b, Fp8Operand b_role, int m, int n, int k, int lda,
                     int ldb, int ldd, float beta, const Fp8& f, const GemmEpilogue& epilogue = {}, bool fast_accum = kFp8FastAccum) {
    GemmKey key{m, n, k, lda, ldb, ldd, true, false, epilogue.kind, 16};
    key.a_type = fp8_cuda_type(a_role), key.b_type = fp8_cuda_type(b_role), key.fast_accum = fast_accum;
    return gemm_lt_key(key, d, a, b, beta, epilogue, {&f.scales[a_role].descale, &f.scales[b_role].descale});
}

// out (N, OC) = inp @ W^T + bias on fp8 copies, and with pre_gelu given out = gelu(pre_gelu),
// pre_gelu the GEMM's output (matmul_gelu_forward's)
inline void fp8_matmul_forward_impl(floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* w, const floatX* bias, int N, int C,
                                    int OC, const Fp8& f) {
    fp8_cast(inp, N, C, f.rows, nullptr, kFp8Input, f);
    fp8_cast(w, OC, C, f.weight, nullptr, kFp8Weight, f);
    // column-major: out^T (OC, N) = (W codes stored (C, OC))^T @ (inp codes stored (C, N))
    auto gemm = [&](floatX* d, const GemmEpilogue& e) { return gemm_fp8(d, f.weight, kFp8Weight, f.rows, kFp8Input, OC, N, C, C, C, OC, 0.0f, f, e); };
    const bool bias_epilogue = bias != nullptr && aligned16(bias);
    if (pre_gelu != nullptr && bias_epilogue && aligned16(pre_gelu) && gemm(out, {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_gelu})) return;
    floatX* d = pre_gelu != nullptr ? pre_gelu : out;
    if (!(bias_epilogue && gemm(d, {CUBLASLT_EPILOGUE_BIAS, bias}))) {
        gemm(d, {});
        if (bias != nullptr) {
            const size_t n = (size_t)N * OC;
            add_bias_kernel<<<(unsigned)std::min<size_t>((n + 255) / 256, 65535), 256, 0, stream()>>>(d, bias, n, OC);
            check_launch();
        }
    }
    if (pre_gelu != nullptr) gelu_forward(out, pre_gelu, (size_t)N * OC);
}

// matmul_backward_impl's terms (matmul.cuh) on fp8 copies: dinp = dout @ W, times gelu'(pre_gelu)
// where given; dweight += dout^T @ inp; dbias += column sums of dout. Returns whether DGELU_BGRAD
// wrote pre_gelu_dbias.
inline bool fp8_matmul_backward_impl(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp, const floatX* w,
                                     const floatX* pre_gelu, floatX* pre_gelu_dbias, int N, int C, int OC, const Fp8& f) {
    fp8_cast(dout, N, OC, f.rows, f.rows_t, kFp8Gradient, f);
    fp8_cast(inp, N, C, nullptr, f.other, kFp8Input, f);
    fp8_cast(w, OC, C, nullptr, f.weight, kFp8Weight, f);
    // dinp^T (C, N) = (W^T codes stored (OC, C))^T @ (dout codes stored (OC, N))
    auto dinp_gemm = [&](const GemmEpilogue& e) { return gemm_fp8(dinp, f.weight, kFp8Weight, f.rows, kFp8Gradient, C, N, OC, OC, OC, C, 0.0f, f, e); };
    bool fused_gelu = false, fused_pre_gelu_bias = false;
    if (pre_gelu != nullptr && aligned16(pre_gelu)) {
        if (pre_gelu_dbias != nullptr && aligned16(pre_gelu_dbias))
            fused_gelu = fused_pre_gelu_bias = dinp_gemm({CUBLASLT_EPILOGUE_DGELU_BGRAD, pre_gelu_dbias, pre_gelu});
        if (!fused_gelu) fused_gelu = dinp_gemm({CUBLASLT_EPILOGUE_DGELU, nullptr, pre_gelu});
    }
    if (!fused_gelu) {
        dinp_gemm({});
        if (pre_gelu != nullptr) gelu_backward(dinp, pre_gelu, (size_t)N * C);
    }
    // dW^T (C, OC) += (inp^T codes stored (N, C))^T @ (dout^T codes stored (N, OC))
    gemm_fp8(dweight, f.other, kFp8Input, f.rows_t, kFp8Gradient, C, OC, N, N, N, C, 1.0f, f);
    if (dbias != nullptr) column_sums_add(dbias, dout, N, OC);
    return fused_pre_gelu_bias;
}

#else  // no fp8 path in this build: fp8_refusal() stops a run before these are reached

inline void fp8_matmul_forward_impl(floatX*, floatX*, const floatX*, const floatX*, const floatX*, int, int, int, const Fp8&) {
    fatal(1, "--fp8: %s", fp8_refusal().c_str());
}
inline bool fp8_matmul_backward_impl(floatX*, floatX*, floatX*, const floatX*, const floatX*, const floatX*, const floatX*, floatX*, int, int,
                                     int, const Fp8&) {
    fatal(1, "--fp8: %s", fp8_refusal().c_str());
}

#endif

}  // namespace gpu
