// Attention alone on the GPU: forward and backward of one layer (causal, this build's floatX) at
// d12's and d48's shapes, timed with CUDA events (median of 20 after 3 warm-ups; the inputs,
// hundreds of MB, do not fit in L2). TFLOP/s count the causal work as ../shared/gpu_baseline.md
// does: forward 2·B·NH·T²·hs, backward 2.5 times that. Also checks that backward gives the same
// bits twice. Built by kernels/cuda.mk (scripts/bench_attention), run by scripts/bench_gpu.sh.
//   bench_attention           the three shapes, each kernel of backward on its own line
//   bench_attention --sweep   (bf16) also other tile shapes of the same kernels, to choose them
// The candidate build (KERNELS=candidate) on an sm_90 GPU also times the sm_80 kernels beside
// the sm_90a ones that attention_forward/backward take there, checks that the two agree, and
// that the sm_90a backward gives the same bits twice.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "scripts/bench_cuda.cuh"

namespace {

struct Shape {
    int B, NH, T, hs;
};

struct Buffers {
    Shape s;
    int C;
    size_t n3, n;
    gpu::floatX *qkv, *out, *dout, *dqkv;
    float *lse, *delta;
    explicit Buffers(Shape shape) : s(shape), C(shape.NH * shape.hs) {
        n3 = (size_t)s.B * s.T * 3 * C;
        n = (size_t)s.B * s.T * C;
        qkv = random_device(n3, 1);
        dout = random_device(n, 2);
        out = (gpu::floatX*)CudaBackend::alloc(n * sizeof(gpu::floatX));
        dqkv = (gpu::floatX*)CudaBackend::alloc(n3 * sizeof(gpu::floatX));
        lse = (float*)CudaBackend::alloc(gpu::attention_saved_floats(s.B, s.T, s.NH) * sizeof(float));
        delta = (float*)CudaBackend::alloc(gpu::attention_saved_floats(s.B, s.T, s.NH) * sizeof(float));
    }
    ~Buffers() {
        for (void* p : {(void*)qkv, (void*)out, (void*)dout, (void*)dqkv, (void*)lse, (void*)delta}) CudaBackend::release(p);
    }
    std::vector<unsigned char> dqkv_bytes() const {
        std::vector<unsigned char> h(n3 * sizeof(gpu::floatX));
        CudaBackend::to_host(h.data(), dqkv, h.size());
        return h;
    }
};

// which kernels attention_forward/backward take at this shape (the candidate build says)
std::string kernels_said(const Shape& s) {
#if defined(KERNELS_CANDIDATE) && !defined(ENABLE_FP32)
    return " (" + gpu::attention_kernels_said(s.NH * s.hs, s.NH) + ")";
#else
    (void)s;
    return "";
#endif
}

#ifndef ENABLE_FP32
gpu::FlashArgs flash_args(const Buffers& b) {
    return gpu::FlashArgs{b.qkv, b.out, b.lse, b.dout, b.delta, b.dqkv, b.s.B, b.s.T, b.C, b.s.NH, b.s.hs, true};
}

// largest |x - ref| over the largest |ref|: a tile shape sums in another order, so its output
// differs from the one in use by rounding only (bf16: ~1e-2 at most)
std::vector<float> to_floats(const gpu::floatX* d, size_t n) {
    std::vector<float> h(n);
    CudaBackend::download_fp32(h.data(), d, n);
    return h;
}
float relative_difference(const gpu::floatX* d, const std::vector<float>& ref) {
    const std::vector<float> x = to_floats(d, ref.size());
    float diff = 0.0f, scale = 0.0f;
    for (size_t i = 0; i < ref.size(); i++) {
        diff = std::max(diff, std::fabs(x[i] - ref[i]));
        scale = std::max(scale, std::fabs(ref[i]));
    }
    return diff / scale;
}

// other tile shapes of the same kernels, at hs 64: time each beside the one in use, and compare
// its output with the one in use
template <class F>
void time_forward(const Buffers& b, const char* name, double flop, const std::vector<float>& out_ref) {
    const gpu::FlashArgs a = flash_args(b);
    const float ms = median_ms([&] {
        gpu::launch_flash<F>(gpu::flash_forward_kernel<F>, gpu::ceil_div(b.s.T, F::query_rows),
                             gpu::flash_forward_smem<F>(), a, "forward");
    });
    printf("  sweep forward %-34s %7.3f ms  %6.1f TFLOP/s  differs by %.1e\n", name, ms, tflops(flop, ms),
           relative_difference(b.out, out_ref));
}
template <class KV>
void time_backward_kv(const Buffers& b, const char* name, double flop, const std::vector<float>& dqkv_ref) {
    const gpu::FlashArgs a = flash_args(b);
    const float ms = median_ms([&] {
        gpu::launch_flash<KV>(gpu::flash_backward_kv_kernel<KV>, gpu::ceil_div(b.s.T, KV::key_rows),
                              gpu::flash_backward_kv_smem<KV>(), a, "backward dK dV");
    });
    printf("  sweep backward dK dV %-27s %7.3f ms  %6.1f TFLOP/s of its 4 products  differs by %.1e\n", name, ms,
           tflops(flop * 0.8, ms), relative_difference(b.dqkv, dqkv_ref));
}
template <class Q>
void time_backward_q(const Buffers& b, const char* name, double flop, const std::vector<float>& dqkv_ref) {
    const gpu::FlashArgs a = flash_args(b);
    const float ms = median_ms([&] {
        gpu::launch_flash<Q>(gpu::flash_backward_q_kernel<Q>, gpu::ceil_div(b.s.T, Q::query_rows),
                             gpu::flash_backward_q_smem<Q>(), a, "backward dQ");
    });
    printf("  sweep backward dQ %-30s %7.3f ms  %6.1f TFLOP/s of its 3 products  differs by %.1e\n", name, ms,
           tflops(flop * 0.6, ms), relative_difference(b.dqkv, dqkv_ref));
}
void sweep(const Buffers& b, double fwd_flop, double bwd_flop) {
    using namespace attn;
    const Shape& s = b.s;
    gpu::attention_forward(b.out, b.lse, b.qkv, s.B, s.T, b.C, s.NH);
    gpu::attention_backward(b.dqkv, b.dout, b.qkv, b.out, b.lse, s.B, s.T, b.C, s.NH);  // also leaves delta
    const std::vector<float> out_ref = to_floats(b.out, b.n), dqkv_ref = to_floats(b.dqkv, b.n3);
    time_forward<ForwardTiles<64, 4, 2, 64>>(b, "4 warps x 32 rows, keys 64", fwd_flop, out_ref);
    time_forward<ForwardTiles<64, 4, 1, 64>>(b, "4 warps x 16 rows, keys 64", fwd_flop, out_ref);
    time_forward<ForwardTiles<64, 8, 1, 64>>(b, "8 warps x 16 rows, keys 64", fwd_flop, out_ref);
    time_forward<ForwardTiles<64, 4, 2, 32>>(b, "4 warps x 32 rows, keys 32", fwd_flop, out_ref);
    time_forward<ForwardTiles<64, 8, 2, 64>>(b, "8 warps x 32 rows, keys 64", fwd_flop, out_ref);
    // forward's output in use again for backward (the same up to rounding, but backward's reference came from it)
    gpu::attention_forward(b.out, b.lse, b.qkv, s.B, s.T, b.C, s.NH);
    time_backward_kv<BackwardKVTiles<64, 8, 64, true>>(b, "8 warps, queries 64, K V in regs", bwd_flop, dqkv_ref);
    time_backward_kv<BackwardKVTiles<64, 8, 64, false>>(b, "8 warps, queries 64, K V in smem", bwd_flop, dqkv_ref);
    time_backward_kv<BackwardKVTiles<64, 4, 64, true>>(b, "4 warps, queries 64, K V in regs", bwd_flop, dqkv_ref);
    time_backward_kv<BackwardKVTiles<64, 4, 128, true>>(b, "4 warps, queries 128, K V in regs", bwd_flop, dqkv_ref);
    time_backward_q<BackwardQTiles<64, 4, 64>>(b, "4 warps, keys 64", bwd_flop, dqkv_ref);
    time_backward_q<BackwardQTiles<64, 8, 64>>(b, "8 warps, keys 64", bwd_flop, dqkv_ref);
    time_backward_q<BackwardQTiles<64, 4, 32>>(b, "4 warps, keys 32", bwd_flop, dqkv_ref);
    time_backward_q<BackwardQTiles<64, 2, 64>>(b, "2 warps, keys 64", bwd_flop, dqkv_ref);
    time_backward_q<BackwardQTiles<64, 4, 128>>(b, "4 warps, keys 128", bwd_flop, dqkv_ref);
}
#endif

#if defined(KERNELS_CANDIDATE) && !defined(ENABLE_FP32)
// the sm_80 kernels (flash_attention.cuh) on the same buffers, against the sm_90a ones that
// attention_forward/backward just ran (fwd, bwd: their times); the outputs of the two differ by
// rounding only (another summation order)
void compare_with_sm80(const Buffers& b, float fwd, float bwd, double fwd_flop, double bwd_flop) {
    const Shape& s = b.s;
    const gpu::FlashArgs a = flash_args(b);
    gpu::attention_forward(b.out, b.lse, b.qkv, s.B, s.T, b.C, s.NH);
    gpu::attention_backward(b.dqkv, b.dout, b.qkv, b.out, b.lse, s.B, s.T, b.C, s.NH);
    const std::vector<float> out_new = to_floats(b.out, b.n), dqkv_new = to_floats(b.dqkv, b.n3);
    const float fwd_old = median_ms([&] { gpu::flash_attention_forward(a); });
    const float out_diff = relative_difference(b.out, out_new);
    const float bwd_old = median_ms([&] {
        gpu::attention_backward_delta(b.delta, b.dout, b.out, s.B, s.T, b.C, s.NH);
        gpu::flash_attention_backward(a);
    });
    printf("  sm_80 kernels: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f), forward+backward %.3f ms; "
           "sm_90a takes %.2fx the forward's time, %.2fx the backward's, %.2fx both; outputs differ by %.1e (out), %.1e (dqkv)\n",
           fwd_old, tflops(fwd_flop, fwd_old), bwd_old, tflops(bwd_flop, bwd_old), fwd_old + bwd_old, fwd / fwd_old, bwd / bwd_old,
           (fwd + bwd) / (fwd_old + bwd_old), out_diff, relative_difference(b.dqkv, dqkv_new));
}
#endif

void bench(Shape s, bool with_sweep) {
    Buffers b(s);
    const double fwd_flop = 2.0 * s.B * s.NH * (double)s.T * s.T * s.hs, bwd_flop = 2.5 * fwd_flop;
    const float fwd = median_ms([&] { gpu::attention_forward(b.out, b.lse, b.qkv, s.B, s.T, b.C, s.NH); });
    const float bwd = median_ms([&] { gpu::attention_backward(b.dqkv, b.dout, b.qkv, b.out, b.lse, s.B, s.T, b.C, s.NH); });
    const std::vector<unsigned char> first = b.dqkv_bytes();
    CUDA_CHECK(cudaMemset(b.dqkv, 0xff, b.n3 * sizeof(gpu::floatX)));
    gpu::attention_backward(b.dqkv, b.dout, b.qkv, b.out, b.lse, s.B, s.T, b.C, s.NH);
    const bool same = b.dqkv_bytes() == first;
    printf("bench attention B=%d NH=%d T=%d hs=%d %s%s: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f), "
           "forward+backward %.3f ms; backward %s\n",
           s.B, s.NH, s.T, s.hs, sizeof(gpu::floatX) == 2 ? "bf16" : "fp32", kernels_said(s).c_str(), fwd, tflops(fwd_flop, fwd), bwd,
           tflops(bwd_flop, bwd), fwd + bwd, same ? "deterministic (same bits twice)" : "NOT DETERMINISTIC");
#ifndef ENABLE_FP32
    // backward's three launches on their own: what determinism costs is the dQ kernel's two
    // recomputed score products, about 2/3 of its time (FlashAttention-2 adds dQ atomically from
    // the dK/dV kernel instead)
    const gpu::FlashArgs a = flash_args(b);
    using KV = attn::FlashTiles<64>::BackwardKV;
    using Q = attn::FlashTiles<64>::BackwardQ;
    if (s.hs == 64) {
        const float delta_ms = median_ms([&] { gpu::attention_backward_delta(b.delta, b.dout, b.out, s.B, s.T, b.C, s.NH); });
        const float kv_ms = median_ms([&] {
            gpu::launch_flash<KV>(gpu::flash_backward_kv_kernel<KV>, gpu::ceil_div(s.T, KV::key_rows),
                                  gpu::flash_backward_kv_smem<KV>(), a, "backward dK dV");
        });
        const float q_ms = median_ms([&] {
            gpu::launch_flash<Q>(gpu::flash_backward_q_kernel<Q>, gpu::ceil_div(s.T, Q::query_rows),
                                 gpu::flash_backward_q_smem<Q>(), a, "backward dQ");
        });
        printf("  backward kernels: delta %.3f ms, dK dV %.3f ms, dQ %.3f ms; determinism costs about %.3f ms "
               "(2/3 of dQ's products)\n",
               delta_ms, kv_ms, q_ms, q_ms * 2.0f / 3.0f);
    }
#ifdef KERNELS_CANDIDATE
    if (gpu::hopper_attention_takes(a)) compare_with_sm80(b, fwd, bwd, fwd_flop, bwd_flop);
#endif
    if (with_sweep && s.hs == 64) sweep(b, fwd_flop, bwd_flop);
#else
    (void)with_sweep;
#endif
}

}  // namespace

int main(int argc, char** argv) {
    if (!CudaBackend::available()) {
        printf("skipped: no GPU\n");
        return 0;
    }
    CudaBackend::init(0);
    const bool with_sweep = argc > 1 && strcmp(argv[1], "--sweep") == 0;
    bench({64, 12, 1024, 64}, with_sweep);  // d12 at B=64
    bench({16, 25, 1024, 64}, with_sweep);  // d48 at B=16
    bench({8, 12, 1024, 128}, false);       // hs 128
    return 0;
}
