// The CPU backend: fp32 everywhere, OpenMP loops, OpenBLAS matmuls. It is the reference that the
// CUDA kernels are tested against. train_gpt.cu and zero/ see only this interface (the CUDA
// backend in cuda_backend.cuh has the same members).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/adamw.h"
#include "cpu/attention.h"
#include "cpu/classifier.h"
#include "cpu/encoder.h"
#include "cpu/fp8.h"
#include "cpu/gelu.h"
#include "cpu/layernorm.h"
#include "cpu/matmul.h"
#include "cpu/quantize.h"
#include "cpu/residual.h"
#include "../common/io.h"
#include "backend_interface.h"
#include "backend_memory.h"
#include "fp8_scaling.h"
#include "gemm_choices.h"
#include "mlp_grads.h"
#include "shard_table.h"

struct CpuBackend {
    using floatX = float;  // parameters, activations and gradients
    static constexpr const char* name = "cpu";
    static constexpr bool params_narrower_than_fp32 = false;  // fp32 params are their own master copy
    static std::string device_name() { return "cpu"; }
    static std::string attention_kernels(int, int) { return "CPU loops (kernels/cpu/attention.h)"; }

    // memory: "device" memory is host memory here
    static void* alloc(size_t bytes) {
        void* p = calloc(bytes ? bytes : 1, 1);
        if (p == nullptr) fatal(1, "cannot allocate %zu bytes of host memory (model, batch or sequence too large?)", bytes);
        return p;
    }
    static void release(void* p) { free(p); }
    static void to_host(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
    static void from_host(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
    static void from_host_pinned(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
    static void copy(void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
    static void zero(void* dst, size_t bytes) { memset(dst, 0, bytes); }
    // rows of `width` bytes from src (row pitch spitch) to dst (row pitch dpitch)
    static void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                       size_t rows) {
        for (size_t r = 0; r < rows; r++)
            memcpy((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
    }
    static void synchronize() {}
    static uint64_t launches() { return 0; }  // no kernels here
    // no graphs here: the work runs as it is (kernels/cuda/common.cuh: run_captured)
    struct CapturedWork {
        uint64_t launches = 0;
    };
    template <class F>
    static void run_captured(CapturedWork&, F&& work) { work(); }
    static void profiler_start() {}
    static void profiler_stop() {}
    static void accumulate(floatX* dst, const floatX* src, size_t n) { cpu::residual_forward(dst, dst, src, n); }
    static void upload_fp32(floatX* dst, const float* host, size_t n) { memcpy(dst, host, n * 4); }
    static void download_fp32(float* host, const floatX* src, size_t n) { memcpy(host, src, n * 4); }

    // ops: see the headers in kernels/cpu/ for what each computes
    static void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                                int B, int T, int C) {
        cpu::encoder_forward(out, tokens, wte, wpe, B, T, C);
    }
    static void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* tokens,
                                 int B, int T, int C) {
        cpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    }
    static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                                  const floatX* w, const floatX* b, int N, int C) {
        cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    }
    // residual_out = a + b, then out = layernorm(residual_out)
    static void residual_layernorm_forward(floatX* residual_out, floatX* out, float* mean,
                                           float* rstd, const floatX* a, const floatX* b,
                                           const floatX* w, const floatX* bias, int N, int C) {
        cpu::residual_forward(residual_out, a, b, (size_t)N * C);
        cpu::layernorm_forward(out, mean, rstd, residual_out, w, bias, N, C);
    }
    static void layernorm_backward(floatX* dinp, floatX* dw, floatX* db, const floatX* dout,
                                   const floatX* inp, const floatX* w, const float* mean,
                                   const float* rstd, int N, int C) {
        cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    }
    static void matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias,
                               int N, int C, int OC) {
        cpu::matmul_forward(out, inp, w, bias, N, C, OC);
    }
    // dbias_zeroed (dbias holds zeros) lets a backend write dbias instead of adding; here it adds
    static void matmul_backward(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout,
                                const floatX* inp, const floatX* w, int N, int C, int OC, bool dbias_zeroed) {
        matmul_backward_fp8_or_not(dinp, dw, dbias, dout, inp, w, N, C, OC, nullptr);
    }
    // pre_gelu = inp @ w^T + bias, out_gelu = gelu(pre_gelu)
    static void matmul_gelu_forward(floatX* out_gelu, floatX* pre_gelu, const floatX* inp, const floatX* w,
                                    const floatX* bias, int N, int C, int OC) {
        cpu::matmul_forward(pre_gelu, inp, w, bias, N, C, OC);
        cpu::gelu_forward(out_gelu, pre_gelu, (size_t)N * OC);
    }
    // --gemm-algos names cuBLASLt's algorithms: none here
    static std::string use_gemm_choices(const GemmChoices&) {
        return "a table of cuBLASLt's algorithms, for --device cuda; this run is on the CPU backend";
    }
    // the MLP block's backward, out = gelu(inp @ W_fc^T + b_fc) @ W_proj^T + b_proj, with inp (N, C),
    // pre_gelu and gelu (N, 4C) from the forward; dpre_gelu (N, 4C) is scratch
    static void mlp_backward(floatX* dinp, floatX* dpre_gelu, const floatX* dout, const floatX* inp, const floatX* pre_gelu,
                             const floatX* gelu, const floatX* w_fc, const floatX* w_proj, const MlpGrads<floatX>& g, int N, int C) {
        mlp_backward_fp8_or_not(dinp, dpre_gelu, dout, inp, pre_gelu, gelu, w_fc, w_proj, g, N, C, nullptr);
    }

    // --fp8 (kernels/fp8_scaling.h), emulated: each operand rounded to the fp8 grid at its
    // tensor's scale, then the fp32 GEMM. The same ops as above, the workspace added; the bias
    // gradients come from the output gradients as they are (the GPU's column sums read those too).
    using Fp8Copy = float;  // the value a code stands for
    using Fp8 = Fp8Workspace<Fp8Copy>;
    static constexpr bool fp8_gemms_take_transposed = false;  // BLAS reads either layout
    static std::string fp8_refusal() { return ""; }           // every CPU runs it
    static void fp8_matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C, int OC,
                                   const Fp8& f) {
        fp8_round_trip(f.rows, inp, (size_t)N * C, kFp8Input, f);
        fp8_round_trip(f.weight, w, (size_t)OC * C, kFp8Weight, f);
        cpu::matmul_forward(out, f.rows, f.weight, bias, N, C, OC);
    }
    static void fp8_matmul_gelu_forward(floatX* out_gelu, floatX* pre_gelu, const floatX* inp, const floatX* w, const floatX* bias,
                                        int N, int C, int OC, const Fp8& f) {
        fp8_matmul_forward(pre_gelu, inp, w, bias, N, C, OC, f);
        cpu::gelu_forward(out_gelu, pre_gelu, (size_t)N * OC);
    }
    static void fp8_matmul_backward(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout, const floatX* inp, const floatX* w,
                                    int N, int C, int OC, bool dbias_zeroed, const Fp8& f) {
        matmul_backward_fp8_or_not(dinp, dw, dbias, dout, inp, w, N, C, OC, &f);
    }
    static void fp8_mlp_backward(floatX* dinp, floatX* dpre_gelu, const floatX* dout, const floatX* inp, const floatX* pre_gelu,
                                 const floatX* gelu, const floatX* w_fc, const floatX* w_proj, const MlpGrads<floatX>& g, int N, int C,
                                 const Fp8& f) {
        mlp_backward_fp8_or_not(dinp, dpre_gelu, dout, inp, pre_gelu, gelu, w_fc, w_proj, g, N, C, &f);
    }
    static size_t attention_saved_floats(int B, int T, int NH) {
        return cpu::attention_saved_floats(B, T, NH);
    }
    static void attention_forward(floatX* out, float* saved, const floatX* qkv, int B, int T, int C,
                                  int NH) {
        cpu::attention_forward(out, saved, qkv, B, T, C, NH);
    }
    static void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                   const floatX* out, const float* saved, int B, int T, int C,
                                   int NH) {
        (void)out;  // the flash-style CUDA kernel needs the output; the CPU one keeps att instead
        cpu::attention_backward(dqkv, dout, qkv, saved, B, T, C, NH);
    }
    static void gelu_forward(floatX* out, const floatX* inp, size_t n) { cpu::gelu_forward(out, inp, n); }
    static void gelu_backward(floatX* dinout, const floatX* inp, size_t n) {
        cpu::gelu_backward(dinout, inp, n);
    }
    static void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp) {
        cpu::fused_classifier(logits, losses, targets, dloss, N, V, Vp);
    }
    static void mean_loss_add(double* acc, const float* losses, int N) { cpu::mean_loss_add(acc, losses, N); }
    // AdamW over this rank's shard, as the table maps it (master is unused here: fp32 params;
    // seed feeds stochastic rounding where parameters are bf16)
    static void adamw_update(floatX* params, float* master, const floatX* grads, float* m, float* v,
                             const ShardTable& table, const AdamWStep& s) {
        (void)master;
        adamw_update_host(params, nullptr, grads, m, v, table.host, table.count, s);
    }
    // *out = sum of squares of the shard's gradients (out lives in backend memory)
    static void grad_norm_squared(float* out, const floatX* grads, const ShardTable& table) {
        float sum = 0.0f;
        for (int j = 0; j < table.count; j++)
            sum += (float)cpu::sum_squares(grads + table.host[j].grad_offset, table.host[j].n);
        *out = sum;
    }

    // block-wise int8 quantization of `rows` rows of layout.values values (kernels/quantize_blocks.h),
    // for zero/'s quantized collectives: to quantized rows, back, and the fp32 sum of quantized rows
    static void quantize_int8(uint8_t* out, const floatX* x, const QuantRows& layout, int rows) {
        cpu::quantize_int8(out, x, layout, rows);
    }
    static void dequantize_int8(floatX* x, const uint8_t* in, const QuantRows& layout, int rows) {
        cpu::dequantize_int8(x, in, layout, rows);
    }
    static void dequantize_sum_int8(floatX* out, const uint8_t* in, const QuantRows& layout, int rows) {
        cpu::dequantize_sum_int8(out, in, layout, rows);
    }

    // ZeRO-Offload (zero/offload.h): backend memory is host memory here, so its transfers are
    // copies done at once; the offload path still goes through them and through its own buffers
    static void* alloc_pinned(size_t bytes) { return calloc(bytes ? bytes : 1, 1); }  // nullptr: not had
    static void release_pinned(void* p) { free(p); }
    static void transfers_after_kernels() {}
    static void kernels_after_transfers() {}
    static void transfer_to_host(void* host, const void* src, size_t bytes) { memcpy(host, src, bytes); }
    static void transfer_from_host(void* dst, const void* host, size_t bytes) { memcpy(dst, host, bytes); }
    static uint64_t transfer_mark() { return 0; }
    static void transfer_wait(uint64_t) {}
    static void adamw_update_host(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                  const ShardTensor* table, int count, const AdamWStep& s) {
        cpu::adamw_update(params, master, grads, m, v, table, count, s);
    }
    static size_t device_memory_in_use() { return 0; }  // no device
    static size_t device_memory_taken() { return 0; }

    // what the backend holds besides the model's and zero/'s buffers (kernels/backend_memory.h):
    // nothing; its "device" memory is the host's
    static constexpr bool device_is_host = true;
    static BackendMemory planned_memory(const OpShapes&) { return {}; }
    static void reserve(const OpShapes&) {}
    static BackendMemory memory() { return {}; }

private:
    // x's fp8 copy as operand `role` into `out`, noted in f's scales
    static void fp8_round_trip(float* out, const float* x, size_t n, Fp8Operand role, const Fp8& f) {
        cpu::fp8_round_trip(out, x, n, fp8_format_of(role), f.scales + role, f.nonfinite_amaxes);
    }
    // matmul_backward, with fp8 operands where f is given
    static void matmul_backward_fp8_or_not(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout, const floatX* inp,
                                           const floatX* w, int N, int C, int OC, const Fp8* f) {
        if (f != nullptr) {
            fp8_round_trip(f->rows, dout, (size_t)N * OC, kFp8Gradient, *f);
            fp8_round_trip(f->other, inp, (size_t)N * C, kFp8Input, *f);
            fp8_round_trip(f->weight, w, (size_t)OC * C, kFp8Weight, *f);
        }
        cpu::matmul_backward(dinp, dw, nullptr, f ? f->rows : dout, f ? f->other : inp, f ? f->weight : w, N, C, OC);
        if (dbias != nullptr) cpu::bias_backward(dbias, dout, N, OC);
    }
    static void mlp_backward_fp8_or_not(floatX* dinp, floatX* dpre_gelu, const floatX* dout, const floatX* inp, const floatX* pre_gelu,
                                        const floatX* gelu, const floatX* w_fc, const floatX* w_proj, const MlpGrads<floatX>& g, int N,
                                        int C, const Fp8* f) {
        matmul_backward_fp8_or_not(dpre_gelu, g.w_proj, g.b_proj, dout, gelu, w_proj, N, 4 * C, C, f);
        cpu::gelu_backward(dpre_gelu, pre_gelu, (size_t)N * 4 * C);
        matmul_backward_fp8_or_not(dinp, g.w_fc, g.b_fc, dpre_gelu, inp, w_fc, N, C, 4 * C, f);
    }
};
template struct BackendInterface<CpuBackend>;  // the shared list of ops (kernels/backend_interface.h)
