// The CUDA backend: the same static members as CpuBackend (cpu_backend.h), so GPT2<Backend> and
// zero/ run unchanged. floatX is bf16 (fp32 master weights in zero/) or, built with
// -DENABLE_FP32, fp32. Every kernel, copy and cuBLASLt call goes to one stream (gpu::stream()),
// so their order is program order; to_host and from_host wait for it, nothing else does.
// Call CudaBackend::init(local_rank) before anything else.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <cuda_profiler_api.h>

#include "backend_interface.h"
#include "backend_memory.h"
#include "mlp_grads.h"
#include "cpu/adamw.h"  // the host AdamW of ZeRO-Offload
#include "cuda/adamw.cuh"
#include "cuda/attention.cuh"
#include "cuda/classifier.cuh"
#include "cuda/common.cuh"
#include "cuda/encoder.cuh"
#include "cuda/fp8.cuh"
#include "cuda/gelu.cuh"
#include "cuda/layernorm.cuh"
#include "cuda/matmul.cuh"
#include "cuda/norm.cuh"
#include "cuda/quantize.cuh"
#include "cuda/residual.cuh"
#include "cuda/transfer.cuh"

struct CudaBackend {
    using floatX = gpu::floatX;
    static constexpr const char* name = "cuda";
#ifdef ENABLE_FP32
    static constexpr bool params_narrower_than_fp32 = false;
#else
    static constexpr bool params_narrower_than_fp32 = true;  // bf16 params, fp32 master copy in zero/
#endif

    // a usable GPU is present; never aborts. Without one, `why` (where given) gets CUDA's reason:
    // no driver, a driver older than the toolkit, no device...
    static bool available(std::string* why = nullptr) {
        int n = 0;
        const cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();  // clear the sticky error for later calls
            if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ", " + cudaGetErrorString(err);
            return false;
        }
        if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
        return n > 0;
    }
    // the GPU's name (cudaDeviceProp::name), for the MFU's peak
    static std::string device_name() { return gpu::ctx().device_name; }
    // select device local_rank % count; create the stream, cuBLASLt handle and workspace
    static void init(int local_rank) {
        int n = 0;
        CUDA_CHECK(cudaGetDeviceCount(&n));
        gpu::init_context(local_rank % n);
    }

    // the selected GPU's id, the same in every process that sees that GPU
    static std::array<unsigned char, 16> device_uuid() {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu::ctx().device));
        std::array<unsigned char, 16> id;
        memcpy(id.data(), prop.uuid.bytes, 16);
        return id;
    }

    // memory: alloc returns zeroed device memory
    static void* alloc(size_t bytes) {
        gpu::ctx();  // the device is chosen before the first allocation
        void* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
        CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
        return p;
    }
    static void release(void* p) { CUDA_CHECK(cudaFree(p)); }
    static void to_host(void* dst, const void* src, size_t bytes) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, gpu::stream()));
        gpu::wait_for_stream(gpu::stream());
    }
    // Waits until the copy is done: CUDA promises nothing about when a copy from pageable memory
    // has read it (on unified-memory systems it may read it late), and callers free or reuse src.
    static void from_host(void* dst, const void* src, size_t bytes) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, gpu::stream()));
        gpu::wait_for_stream(gpu::stream());
    }
    // the same for the small uploads of every micro-step (the batch), without waiting for the GPU:
    // src is copied into pinned memory at once and uploaded from there in stream order
    static void from_host_pinned(void* dst, const void* src, size_t bytes) { gpu::upload_pinned(dst, src, bytes); }
    static void copy(void* dst, const void* src, size_t bytes) {
        if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, gpu::stream()));
    }
    static void zero(void* dst, size_t bytes) {
        if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, gpu::stream()));
    }
    // rows of `width` bytes from src (row pitch spitch) to dst (row pitch dpitch)
    static void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
        if (width == 0 || rows == 0) return;
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, gpu::stream()));
    }
    static void synchronize() { gpu::wait_for_stream(gpu::stream()); }
    // kernels, cuBLASLt matmuls and CUDA graphs queued since init (a graph's own kernels not counted)
    static uint64_t launches() { return gpu::ctx().launches; }
    using CapturedWork = gpu::CapturedWork;
    template <class F>
    static void run_captured(CapturedWork& w, F&& work) { gpu::run_captured(w, work); }
    // the range a profiler started with --profile-from-start off measures
    static void profiler_start() { CUDA_CHECK(cudaProfilerStart()); }
    static void profiler_stop() { CUDA_CHECK(cudaProfilerStop()); }
    static void accumulate(floatX* dst, const floatX* src, size_t n) { gpu::accumulate(dst, src, n); }
    // fp32 host <-> floatX device (round to nearest on the way in)
    static void upload_fp32(floatX* dst, const float* host, size_t n) {
#ifdef ENABLE_FP32
        from_host(dst, host, n * sizeof(float));
#else
        in_chunks(n, [&](size_t i, size_t len, float* tmp) {
            from_host(tmp, host + i, len * sizeof(float));
            gpu::convert(dst + i, tmp, len);
        });
#endif
    }
    static void download_fp32(float* host, const floatX* src, size_t n) {
#ifdef ENABLE_FP32
        to_host(host, src, n * sizeof(float));
#else
        in_chunks(n, [&](size_t i, size_t len, float* tmp) {
            gpu::convert(tmp, src + i, len);
            to_host(host + i, tmp, len * sizeof(float));
        });
#endif
    }
    // conversions go through an fp32 staging buffer of bounded size, so a large embedding
    // needs no fp32 twin on the device
    template <class F>
    static void in_chunks(size_t n, F f) {
        for (size_t i = 0; i < n; i += gpu::kConvertChunk) {
            size_t len = n - i < gpu::kConvertChunk ? n - i : gpu::kConvertChunk;
            f(i, len, (float*)gpu::scratch(conversion_scratch_bytes(len)));
        }
    }
    // the scratch converting n elements asks for (none in the fp32 build)
    static size_t conversion_scratch_bytes(size_t n) {
#ifdef ENABLE_FP32
        (void)n;
        return 0;
#else
        return std::min(n, gpu::kConvertChunk) * sizeof(float);
#endif
    }

    // ops: the headers in kernels/cuda/ say how; kernels/cpu/ says what
    static void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B, int T,
                                int C) {
        gpu::encoder_forward(out, tokens, wte, wpe, B, T, C);
    }
    static void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* tokens, int B, int T,
                                 int C) {
        gpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    }
    static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w,
                                  const floatX* b, int N, int C) {
        gpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    }
    static void residual_layernorm_forward(floatX* residual_out, floatX* out, float* mean, float* rstd,
                                           const floatX* a, const floatX* b, const floatX* w, const floatX* bias,
                                           int N, int C) {
        gpu::residual_layernorm_forward(residual_out, out, mean, rstd, a, b, w, bias, N, C);
    }
    static void layernorm_backward(floatX* dinp, floatX* dw, floatX* db, const floatX* dout, const floatX* inp,
                                   const floatX* w, const float* mean, const float* rstd, int N, int C) {
        gpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    }
    static void matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C,
                               int OC) {
        gpu::matmul_forward(out, inp, w, bias, N, C, OC);
    }
    static void matmul_backward(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout, const floatX* inp,
                                const floatX* w, int N, int C, int OC, bool dbias_zeroed) {
        gpu::matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, dbias_zeroed);
    }
    static void matmul_gelu_forward(floatX* out_gelu, floatX* pre_gelu, const floatX* inp, const floatX* w,
                                    const floatX* bias, int N, int C, int OC) {
        gpu::matmul_gelu_forward(out_gelu, pre_gelu, inp, w, bias, N, C, OC);
    }
    // --gemm-algos: from now on each GEMM shape the table names runs the algorithm it names;
    // returns "" or why it cannot (timed on another GPU, cuBLASLt or precision)
    static std::string use_gemm_choices(const GemmChoices& t) { return gpu::use_gemm_choices(t); }
    // the MLP block's backward (CpuBackend::mlp_backward's terms): GELU' inside the projection's
    // dinp GEMM, and there too fc's bias gradient where cuBLASLt offers it (DGELU_BGRAD) and the
    // gradients still hold zeros, else from fc's dweight GEMM
    static void mlp_backward(floatX* dinp, floatX* dpre_gelu, const floatX* dout, const floatX* inp, const floatX* pre_gelu,
                             const floatX* gelu, const floatX* w_fc, const floatX* w_proj, const MlpGrads<floatX>& g, int N, int C) {
        const bool fc_dbias_done = gpu::matmul_gelu_backward(dpre_gelu, g.w_proj, g.b_proj, dout, gelu, pre_gelu, w_proj, N, 4 * C, C,
                                                             g.zeroed, g.zeroed ? g.b_fc : nullptr);
        gpu::matmul_backward(dinp, g.w_fc, fc_dbias_done ? nullptr : g.b_fc, dpre_gelu, inp, w_fc, N, C, 4 * C, g.zeroed);
    }

    // --fp8 (kernels/cuda/fp8.cuh, the KERNELS=candidate bf16 build on sm_89 and later): the ops
    // above with fp8 operands, the workspace added
    using Fp8Copy = uint8_t;  // a code
    static constexpr bool fp8_gemms_take_transposed = true;  // fp8 GEMMs take "TN" operands only
    static std::string fp8_refusal() { return gpu::fp8_refusal(); }
    static void fp8_matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C, int OC,
                                   const gpu::Fp8& f) {
        gpu::fp8_matmul_forward_impl(out, nullptr, inp, w, bias, N, C, OC, f);
    }
    static void fp8_matmul_gelu_forward(floatX* out_gelu, floatX* pre_gelu, const floatX* inp, const floatX* w, const floatX* bias,
                                        int N, int C, int OC, const gpu::Fp8& f) {
        gpu::fp8_matmul_forward_impl(out_gelu, pre_gelu, inp, w, bias, N, C, OC, f);
    }
    static void fp8_matmul_backward(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout, const floatX* inp, const floatX* w,
                                    int N, int C, int OC, bool dbias_zeroed, const gpu::Fp8& f) {
        gpu::fp8_matmul_backward_impl(dinp, dw, dbias, dout, inp, w, nullptr, nullptr, N, C, OC, f);
    }
    // mlp_backward's terms: GELU' (and fc's bias gradient where DGELU_BGRAD runs) in the projection's dinp GEMM
    static void fp8_mlp_backward(floatX* dinp, floatX* dpre_gelu, const floatX* dout, const floatX* inp, const floatX* pre_gelu,
                                 const floatX* gelu, const floatX* w_fc, const floatX* w_proj, const MlpGrads<floatX>& g, int N, int C,
                                 const gpu::Fp8& f) {
        const bool fc_dbias_done = gpu::fp8_matmul_backward_impl(dpre_gelu, g.w_proj, g.b_proj, dout, gelu, w_proj, pre_gelu,
                                                                 g.zeroed ? g.b_fc : nullptr, N, 4 * C, C, f);
        gpu::fp8_matmul_backward_impl(dinp, g.w_fc, fc_dbias_done ? nullptr : g.b_fc, dpre_gelu, inp, w_fc, nullptr, nullptr, N, C, 4 * C, f);
    }
    static size_t attention_saved_floats(int B, int T, int NH) { return gpu::attention_saved_floats(B, T, NH); }
    // which attention kernels runs at these heads take (the run's setup line)
    static std::string attention_kernels(int C, int NH) { return gpu::attention_kernels_said(C, NH); }
    static void attention_forward(floatX* out, float* saved, const floatX* qkv, int B, int T, int C, int NH) {
        gpu::attention_forward(out, saved, qkv, B, T, C, NH);
    }
    static void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                   const float* saved, int B, int T, int C, int NH) {
        gpu::attention_backward(dqkv, dout, qkv, out, saved, B, T, C, NH);
    }
    static void gelu_forward(floatX* out, const floatX* inp, size_t n) { gpu::gelu_forward(out, inp, n); }
    static void gelu_backward(floatX* dinout, const floatX* inp, size_t n) { gpu::gelu_backward(dinout, inp, n); }
    static void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int N, int V,
                                 int Vp) {
        gpu::fused_classifier(logits, losses, targets, dloss, N, V, Vp);
    }
    static void mean_loss_add(double* acc, const float* losses, int N) { gpu::mean_loss_add(acc, losses, N); }
    // one launch each over this rank's shard, as the table maps it
    static void adamw_update(floatX* params, float* master, const floatX* grads, float* m, float* v,
                             const ShardTable& table, const AdamWStep& s) {
        gpu::adamw_update(params, master, grads, m, v, table, s);
    }
    // *out = sum of squares of the shard's gradients (out is device memory)
    static void grad_norm_squared(float* out, const floatX* grads, const ShardTable& table) {
        gpu::grad_norm_squared(out, grads, table);
    }

    // block-wise int8 quantization of `rows` rows (kernels/quantize_blocks.h): see cpu_backend.h
    static void quantize_int8(uint8_t* out, const floatX* x, const QuantRows& layout, int rows) {
        gpu::quantize_int8(out, x, layout, rows);
    }
    static void dequantize_int8(floatX* x, const uint8_t* in, const QuantRows& layout, int rows) {
        gpu::dequantize_int8(x, in, layout, rows);
    }
    static void dequantize_sum_int8(floatX* out, const uint8_t* in, const QuantRows& layout, int rows) {
        gpu::dequantize_sum_int8(out, in, layout, rows);
    }

    // ZeRO-Offload (zero/offload.h): pinned host memory (nullptr when it cannot be had), the
    // transfers of kernels/cuda/transfer.cuh, and AdamW on the host's cores
    static void* alloc_pinned(size_t bytes) {
        void* p = nullptr;
        if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        memset(p, 0, bytes);
        return p;
    }
    static void release_pinned(void* p) { CUDA_CHECK(cudaFreeHost(p)); }
    static void transfers_after_kernels() { gpu::transfers_after_kernels(); }
    static void kernels_after_transfers() { gpu::kernels_after_transfers(); }
    static void transfer_to_host(void* host, const void* src, size_t bytes) {
        gpu::transfer(host, src, bytes, cudaMemcpyDeviceToHost);
    }
    static void transfer_from_host(void* dst, const void* host, size_t bytes) {
        gpu::transfer(dst, host, bytes, cudaMemcpyHostToDevice);
    }
    static uint64_t transfer_mark() { return gpu::transfer_mark(); }
    static void transfer_wait(uint64_t mark) { gpu::transfer_wait(mark); }
#ifdef ENABLE_FP32
    using HostX = float;
#else
    using HostX = uint16_t;  // bf16 bits: the host kernel's view of floatX
#endif
    static void adamw_update_host(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                  const ShardTensor* table, int count, const AdamWStep& s) {
        cpu::adamw_update((HostX*)params, master, (const HostX*)grads, m, v, table, count, s);
    }
    // bytes of device memory in use by every process on this GPU
    static size_t device_memory_in_use() {
        size_t free = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free, &total));
        return total - free;
    }
    // bytes of device memory free on this GPU
    static size_t device_memory_free() {
        size_t free = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free, &total));
        return free;
    }
    // Bytes free on the GPU for a run's planned buffers: what is free now (after the CUDA context
    // and NCCL's communicators took theirs), plus what this backend already holds of what the plan
    // counts (the context's buffers, a scratch reserved by an earlier run in this process)
    static size_t device_memory_free_for_run() {
        if (!gpu::context_raw().ready) return device_memory_free();
        const BackendMemory held = memory();
        return device_memory_free() + held.context + held.kernel_scratch;
    }
    // bytes the GPU has lost since init() made the context: what this process allocated, the
    // kernels loaded since and what the libraries took (and any other process's allocations)
    static size_t device_memory_taken() {
        const size_t before = gpu::ctx().free_at_init, now = device_memory_free();
        return before > now ? before - now : 0;
    }

    // What the backend holds besides the model's and zero/'s buffers (kernels/backend_memory.h):
    // cuBLASLt's workspace and the norm's counter from init(); the scratch, sized for the most any
    // op asks for at these shapes (each op's *_scratch_bytes is what the op itself asks for); two
    // pinned upload buffers of the largest batch upload. planned_memory() touches no GPU.
    static constexpr bool device_is_host = false;
    static size_t scratch_bytes(const OpShapes& s) {
        const int BT = s.B * s.T;
        return std::max({gpu::matmul_backward_scratch_bytes(BT, s.widest_bias), gpu::layernorm_backward_scratch_bytes(BT, s.C),
                         gpu::attention_backward_scratch_bytes(s.B, s.T, s.C, s.NH), gpu::encoder_backward_scratch_bytes(s.B, s.T, s.C),
                         gpu::grad_norm_scratch_bytes(), conversion_scratch_bytes(s.largest_conversion)});
    }
    static BackendMemory planned_memory(const OpShapes& s) {
        return {gpu::kContextBufferBytes, scratch_bytes(s), 2 * s.largest_upload, 3};
    }
    static void reserve(const OpShapes& s) {
        gpu::reserve_scratch(scratch_bytes(s));
        gpu::reserve_uploads(s.largest_upload);
    }
    static BackendMemory memory() {
        const gpu::Context& c = gpu::ctx();
        return {c.lt_workspace_size + sizeof(*c.norm_done), c.scratch_size, c.uploads[0].size + c.uploads[1].size,
                c.scratch != nullptr ? 3u : 2u};
    }
};
template struct BackendInterface<CudaBackend>;  // the shared list of ops (kernels/backend_interface.h)
