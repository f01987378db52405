// What every CUDA kernel header shares: error checks, the floatX type, 128-bit packed access,
// warp/block reductions, stochastic rounding, and the one stream + cuBLASLt handle + scratch
// buffer that all ops use. Everything lives in namespace gpu (namespace cuda belongs to CCCL).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../../common/io.h"  // fatal(): one line, and every rank stops
#include "../../common/bf16.h"  // stochastic rounding
#include "../../common/watchdog.h"

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess) {                                                        \
            fatal(1, "CUDA error at %s:%d: %s (%s)", __FILE__, __LINE__,                 \
                  cudaGetErrorString(err_), #call);                                       \
        }                                                                                 \
    } while (0)

#define CUBLAS_CHECK(call)                                                                \
    do {                                                                                  \
        cublasStatus_t st_ = (call);                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                               \
            fatal(1, "cuBLAS error at %s:%d: status %d (%s)", __FILE__, __LINE__,        \
                  (int)st_, #call);                                                       \
        }                                                                                 \
    } while (0)

namespace gpu {

#ifdef ENABLE_FP32
typedef float floatX;
constexpr cudaDataType_t kCudaFloatX = CUDA_R_32F;
#else
typedef __nv_bfloat16 floatX;
constexpr cudaDataType_t kCudaFloatX = CUDA_R_16BF;
#endif

constexpr int kWarp = 32;

inline int ceil_div(size_t a, size_t b) { return (int)((a + b - 1) / b); }
inline bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

// ----------------------------------------------------------------------------
// 128-bit packed access: one LDG.128/STG.128 moves 8 bf16 or 4 fp32. Callers check alignment
// (aligned16) and that the element count is a multiple of x128::size.

template <class T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T payload[size];
    __device__ T& operator[](int i) { return payload[i]; }
    __device__ const T& operator[](int i) const { return payload[i]; }
};
typedef Packed128<floatX> x128;

template <class T>
__device__ inline Packed128<T> load128(const T* p) {
    int4 bits = *reinterpret_cast<const int4*>(p);
    Packed128<T> out;
    memcpy(&out, &bits, 16);
    return out;
}
template <class T>
__device__ inline void store128(T* p, const Packed128<T>& v) {
    int4 bits;
    memcpy(&bits, &v, 16);
    *reinterpret_cast<int4*>(p) = bits;
}

// ----------------------------------------------------------------------------
// reductions. Shuffles always combine lanes in the same pattern, so they are deterministic.

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ inline float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// whole-block sum, result in every thread; blockDim.x a multiple of 32, at most 1024
__device__ inline float block_sum(float v) {
    __shared__ float partial[kWarp];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
    v = warp_sum(v);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < nwarps ? partial[lane] : 0.0f;
    return warp_sum(v);
}
__device__ inline float block_max(float v) {
    __shared__ float partial[kWarp];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < nwarps ? partial[lane] : -INFINITY;
    return warp_max(v);
}

// ----------------------------------------------------------------------------
// Stochastic rounding (common/bf16.h says how) where the parameters are bf16

__device__ inline void store_rounded(float* out, float x, uint32_t, uint64_t) { *out = x; }
__device__ inline void store_rounded(__nv_bfloat16* out, float x, uint32_t seed, uint64_t index) {
    *out = __ushort_as_bfloat16(bf16_round_stochastic(__float_as_uint(x), random_u32(seed, index)));
}

// ----------------------------------------------------------------------------
// the process-wide context: one stream for every kernel, copy and collective; the cuBLASLt
// handle and workspace; a scratch buffer that one op at a time may use; the pinned buffers the
// batches are uploaded through. The scratch and upload buffers are sized up front for the run's
// shapes (reserve_scratch, reserve_uploads; kernels/backend_memory.h), so a step allocates nothing.

constexpr size_t kLtWorkspaceBytes = (size_t)32 << 20;
// device bytes init_context allocates: cuBLASLt's workspace and the gradient norm's counter
constexpr size_t kContextBufferBytes = kLtWorkspaceBytes + sizeof(unsigned);

// a pinned host buffer a batch is uploaded from, and the event recorded after the upload from it
struct PinnedUpload {
    void* host = nullptr;
    size_t size = 0;
    cudaEvent_t read = nullptr;
};

struct Context {
    bool ready = false;
    int device = 0;
    cudaStream_t stream = nullptr;
    cublasLtHandle_t lt = nullptr;
    void* lt_workspace = nullptr;
    size_t lt_workspace_size = kLtWorkspaceBytes;
    unsigned* norm_done = nullptr;  // grad_norm_squared's count of finished blocks, left 0 by each launch
    void* scratch = nullptr;
    size_t scratch_size = 0;
    PinnedUpload uploads[2];  // used in turn (upload_pinned)
    int next_upload = 0;
    size_t free_at_init = 0;  // device bytes free when the context was made, before its buffers
    std::string device_name;  // cudaDeviceProp::name
    int num_sms = 0;
    size_t max_smem_optin = 0;
    uint64_t launches = 0;  // kernels, cuBLASLt matmuls and graphs queued so far (check_launch counts them)
    uint64_t captured = 0;  // kernels and matmuls captured into graphs so far, not launched then
    bool capturing = false;  // the stream is being captured into a graph (run_captured)
    int live_graphs = 0;     // graphs instantiated and not yet destroyed: they hold the scratch's address
    bool sync_launches = false;  // CUDA_SYNC_LAUNCHES=1: check_launch waits for each launch
};

inline Context& context_raw() {
    static Context c;
    return c;
}
// device < 0: keep the current device
inline void init_context(int device) {
    Context& c = context_raw();
    if (c.ready) return;
    if (device >= 0) CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaGetDevice(&c.device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c.device));
    c.device_name = prop.name;
    c.num_sms = prop.multiProcessorCount;
    c.max_smem_optin = prop.sharedMemPerBlockOptin;
    const char* sync = getenv("CUDA_SYNC_LAUNCHES");
    c.sync_launches = sync != nullptr && strcmp(sync, "1") == 0;
    size_t total = 0;
    CUDA_CHECK(cudaMemGetInfo(&c.free_at_init, &total));  // the context is made by now
    CUDA_CHECK(cudaStreamCreate(&c.stream));
    CUBLAS_CHECK(cublasLtCreate(&c.lt));
    CUDA_CHECK(cudaMalloc(&c.lt_workspace, c.lt_workspace_size));
    CUDA_CHECK(cudaMalloc(&c.norm_done, sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(c.norm_done, 0, sizeof(unsigned)));
    c.ready = true;
}
inline Context& ctx() {
    Context& c = context_raw();
    if (!c.ready) init_context(-1);
    return c;
}
inline cudaStream_t stream() { return ctx().stream; }

// The host waits for device work under the watchdog (common/watchdog.h): work queued behind a
// collective that never ends (a peer rank died or hangs) would otherwise hold this rank forever.
// `done` queries without blocking: cudaErrorNotReady until the work is done.
template <class Query>
inline void host_wait(Query query, const char* what) {
    watchdog().wait(
        [&] {
            const cudaError_t err = query();
            if (err == cudaErrorNotReady) return false;
            CUDA_CHECK(err);
            return true;
        },
        [&] { return std::string(what); });
}
inline void wait_for_stream(cudaStream_t s) {
    host_wait([&] { return cudaStreamQuery(s); }, "the GPU's queued work (kernels, copies and the collectives they wait for)");
}
inline void wait_for_event(cudaEvent_t e) {
    host_wait([&] { return cudaEventQuery(e); }, "the GPU's queued work (kernels, copies and the collectives they wait for)");
}

// the scratch buffer, reallocated to `bytes` (after the stream has drained, so a kernel still
// reading the old one is never freed under it)
inline void resize_scratch(size_t bytes) {
    Context& c = ctx();
    if (c.capturing || c.live_graphs > 0)
        fatal(1, "the scratch would grow from %zu to %zu bytes (an op wants more than the run reserved) while a CUDA graph %s its "
              "address; --cuda-graph 0 runs without graphs", c.scratch_size, bytes, c.capturing ? "captures" : "holds");
    wait_for_stream(c.stream);
    if (c.scratch) CUDA_CHECK(cudaFree(c.scratch));
    c.scratch_size = bytes;
    CUDA_CHECK(cudaMalloc(&c.scratch, c.scratch_size));
}
// Scratch memory valid until the next call. A run reserves what its ops ask for at most
// (reserve_scratch); past that (an op called alone, in the tests) it grows by a quarter more.
inline void* scratch(size_t bytes) {
    Context& c = ctx();
    if (bytes > c.scratch_size) resize_scratch(bytes + (bytes >> 2));
    return c.scratch;
}
// the scratch made exactly `bytes` large, unless it is at least that already
inline void reserve_scratch(size_t bytes) {
    if (bytes > ctx().scratch_size) resize_scratch(bytes);
}

// each upload buffer made exactly `bytes` large, unless it is at least that already (after the
// upload from it, if any, has read it)
inline void reserve_upload(PinnedUpload& p, size_t bytes) {
    if (p.read == nullptr) CUDA_CHECK(cudaEventCreateWithFlags(&p.read, cudaEventDisableTiming));
    wait_for_event(p.read);  // a never-recorded event counts as done
    if (bytes <= p.size) return;
    if (p.host) CUDA_CHECK(cudaFreeHost(p.host));
    CUDA_CHECK(cudaMallocHost(&p.host, bytes));
    p.size = bytes;
}
inline void reserve_uploads(size_t bytes) {
    for (PinnedUpload& p : ctx().uploads) reserve_upload(p, bytes);
}

// Host -> device through the two pinned buffers used in turn: src is copied into one at once
// (after that buffer's previous upload has read it), so the caller may reuse src and the host
// does not wait for the GPU to drain.
inline void upload_pinned(void* dst, const void* src, size_t bytes) {
    Context& c = ctx();
    PinnedUpload& p = c.uploads[c.next_upload];
    c.next_upload ^= 1;
    reserve_upload(p, bytes);
    memcpy(p.host, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, p.host, bytes, cudaMemcpyHostToDevice, c.stream));
    CUDA_CHECK(cudaEventRecord(p.read, c.stream));
}

// After every kernel launch and cuBLASLt matmul: reports a failed launch, naming the function
// that launched it, and counts it. A kernel's own fault (an illegal address, say) surfaces only
// at some later call, far from the kernel; with CUDA_SYNC_LAUNCHES=1 in the environment each
// launch is waited for here, so the fault is reported at the launch that caused it.
inline void check_launch(const char* launcher = __builtin_FUNCTION(), const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
    Context& c = ctx();
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && c.sync_launches) {
        cudaStreamCaptureStatus capture;  // a stream being captured into a graph cannot be waited for
        err = cudaStreamIsCapturing(c.stream, &capture);
        if (err == cudaSuccess && capture == cudaStreamCaptureStatusNone) err = cudaStreamSynchronize(c.stream);
    }
    if (err != cudaSuccess) {
        fatal(1, "CUDA error at the launch in %s (%s:%d): %s%s", launcher, file, line, cudaGetErrorString(err),
              c.sync_launches ? " (CUDA_SYNC_LAUNCHES=1: this launch's own)"
                              : " (maybe an earlier kernel's: CUDA_SYNC_LAUNCHES=1 checks each launch at once)");
    }
    (c.capturing ? c.captured : c.launches)++;
}

// Work that runs the same kernels with the same arguments and pointers each time (a micro-step's
// forward and backward), as a CUDA graph: run as it is the first time (so its cuBLASLt plans are
// made and its kernels loaded outside a capture), captured the second time, and from then on one
// launch instead of one per kernel. The caller keeps one CapturedWork for each distinct work.
// What the work does on the host (flags it sets, counters, pointers it chooses) happens on its
// first two calls only: nothing may depend on it being done again.
struct CapturedWork {
    bool ran = false;  // the first call ran the work as it is
    cudaGraphExec_t exec = nullptr;
    uint64_t launches = 0;  // the kernels and matmuls the graph holds
    CapturedWork() = default;
    CapturedWork(const CapturedWork&) = delete;
    CapturedWork& operator=(const CapturedWork&) = delete;
    ~CapturedWork() {
        if (exec == nullptr) return;
        cudaGraphExecDestroy(exec);
        context_raw().live_graphs--;
    }
};
template <class F>
void run_captured(CapturedWork& w, F&& work) {
    Context& c = ctx();
    if (!w.ran) {
        w.ran = true;
        work();
        return;
    }
    if (w.exec == nullptr) {
        const uint64_t before = c.captured;
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
        c.capturing = true;
        work();
        c.capturing = false;
        CUDA_CHECK(cudaStreamEndCapture(c.stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&w.exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
        c.live_graphs++;
        w.launches = c.captured - before;
    }
    CUDA_CHECK(cudaGraphLaunch(w.exec, c.stream));
    check_launch();
}

// one launch shape for elementwise ops: enough blocks to fill the GPU, grid-stride beyond
inline int elementwise_blocks(size_t work, int block) {
    size_t want = (work + block - 1) / block, cap = (size_t)ctx().num_sms * 32;
    return (int)(want < cap ? (want > 0 ? want : 1) : cap);
}

// elements per staged fp32 <-> floatX conversion in upload_fp32/download_fp32
constexpr size_t kConvertChunk = (size_t)8 << 20;

// dst[i] = src[i] between float and floatX (round to nearest)
template <class Dst, class Src>
__global__ void convert_kernel(Dst* dst, const Src* src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = (Dst)(float)src[i];
}
template <class Dst, class Src>
inline void convert(Dst* dst, const Src* src, size_t n) {
    if (n == 0) return;
    convert_kernel<<<elementwise_blocks(n, 256), 256, 0, stream()>>>(dst, src, n);
    check_launch();
}

}  // namespace gpu
