// Hopper-only (sm_90a) building blocks, as PTX: warpgroup matrix products (wgmma) with operands
// in shared memory described by kernels/wgmma_layout.h, the bulk tensor copy engine (TMA) and
// the bulk copies it shares with plain byte ranges, mbarriers that the copies complete on,
// named barriers, and the register reallocation between warpgroups (setmaxnreg).
//
// Every body is compiled for the sm_90a image only (__CUDA_ARCH_FEAT_SM90_ALL): the sm_80 image
// of the same source sees empty functions and never runs them (flash_attention_hopper.cuh's
// kernels trap there, and the host picks them only on an sm_90 GPU whose image has them).
#pragma once
#include <cuda.h>  // CUtensorMap
#include <cstdint>

namespace gpu {
namespace sm90 {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90_BODY(...) __VA_ARGS__
#else
#define SM90_BODY(...)
#endif

__device__ inline uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ----------------------------------------------------------------------------
// mbarriers (by shared-memory address: 32 bits, where a pointer takes two registers): a phase
// completes when its arrivals are all in and the bytes it expects have landed

__device__ inline void mbarrier_init(uint32_t bar, int arrivals) {
    SM90_BODY(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");)
}
// the barriers' initialisation made visible to the copy engine (then a block barrier for the threads)
__device__ inline void fence_barrier_init() {
    SM90_BODY(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");)
}
__device__ inline void mbarrier_arrive(uint32_t bar) {
    SM90_BODY(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");)
}
// the phase also waits for `bytes` more from copies that complete on it (no arrival)
__device__ inline void mbarrier_expect_bytes(uint32_t bar, uint32_t bytes) {
    SM90_BODY(asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");)
}
// until the phase of this parity has completed (a fresh barrier counts parity 1 as completed)
__device__ inline void mbarrier_wait(uint32_t bar, uint32_t parity) {
    SM90_BODY(asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");)
}

// ----------------------------------------------------------------------------
// bulk copies

// a box of a tensor map (coordinates innermost first) into shared memory, completing on bar
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
    SM90_BODY(asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
            smem_u32(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");)
}
// shared memory into a box of a tensor map; rows past the tensor's end are left out
__device__ inline void tma_store_3d(const CUtensorMap* map, int c0, int c1, int c2, const void* src) {
    SM90_BODY(asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
                           "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(src))
                           : "memory");)
}
// bytes (a multiple of 16, both ends 16-byte aligned) from shared to global memory: copied, or
// added element by element as floats
__device__ inline void bulk_copy_to_global(float* dst, const void* src, uint32_t bytes) {
    SM90_BODY(asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_u32(src)),
                           "r"(bytes)
                           : "memory");)
}
__device__ inline void bulk_add_to_global(float* dst, const void* src, uint32_t bytes) {
    SM90_BODY(asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                           "r"(smem_u32(src)), "r"(bytes)
                           : "memory");)
}
__device__ inline void bulk_commit() { SM90_BODY(asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");) }
// until this thread's bulk stores have read their shared memory / have completed their writes
__device__ inline void bulk_wait_read() { SM90_BODY(asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");) }
__device__ inline void bulk_wait_written() { SM90_BODY(asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");) }

// Ordinary accesses and the copy engine's or the tensor cores' (the "async proxy") are ordered
// only through these: shared memory written by threads before a bulk copy or wgmma reads it, and
// global memory between a bulk write and the flag that publishes it.
__device__ inline void fence_async_shared() { SM90_BODY(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");) }
__device__ inline void fence_async_global() { SM90_BODY(asm volatile("fence.proxy.async.global;\n" ::: "memory");) }

// a counter in global memory that blocks of one grid order their work by
__device__ inline uint32_t load_acquire(const uint32_t* p) {
    uint32_t v = 0;
    SM90_BODY(asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");)
    return v;
}
__device__ inline void add_release(uint32_t* p, uint32_t v) {
    SM90_BODY(asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");)
}

// ----------------------------------------------------------------------------
// warps and warpgroups

// threadIdx.x read anew (volatile: not merged with an earlier read), so that values derived
// from it after a long loop are computed there instead of held in registers through the loop
__device__ inline uint32_t thread_index_reread() {
    uint32_t t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}
// a barrier among `threads` threads of the block (a multiple of 32) under id (1..15; 0 is
// __syncthreads's)
__device__ inline void named_barrier(int id, int threads) {
    SM90_BODY(asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");)
}
// the warpgroup's register budget per thread, given back to the pool or taken from it
template <int REGISTERS>
__device__ inline void registers_release() {
    SM90_BODY(asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));)
}
template <int REGISTERS>
__device__ inline void registers_claim() {
    SM90_BODY(asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));)
}

// Four 8x8 bf16 matrices to shared memory: lanes 8i..8i+7 give the addresses of the 8 rows
// (16 bytes each) of matrix i, whose elements (lane / 4, 2 (lane % 4) + {0, 1}) come from
// register i of each lane (ldmatrix the other way round)
__device__ inline void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    SM90_BODY(asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2),
                           "r"(r3)
                           : "memory");)
}

// ----------------------------------------------------------------------------
// wgmma: D (64 x N, fp32, in the warpgroup's registers) += A (64 x 16) B (16 x N), bf16.
// Issue order: fence_operands on every register the products read or write, wgmma_fence, the
// products, wgmma_commit; then wgmma_wait<n> (at most n groups of this warp still running)
// and fence_operands again before the registers are touched. The empty asm statements keep
// the compiler from moving accesses of those registers across the asynchronous products.

__device__ inline void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ inline void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <class T, int N>
__device__ inline void fence_operands(T (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) fence_operand(r[i]);
}
__device__ inline void wgmma_fence() { SM90_BODY(asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");) }
__device__ inline void wgmma_commit() { SM90_BODY(asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");) }
template <int PENDING>
__device__ inline void wgmma_wait() {
    SM90_BODY(asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");)
}

#define SM90_D8(c, i) c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define SM90_D32(c) SM90_D8(c, 0), SM90_D8(c, 8), SM90_D8(c, 16), SM90_D8(c, 24)
#define SM90_D64(c) SM90_D32(c), SM90_D8(c, 32), SM90_D8(c, 40), SM90_D8(c, 48), SM90_D8(c, 56)
#define SM90_R32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SM90_R64                                                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, " \
    "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, "  \
    "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// the operands after the accumulators: a, b, TRANS_A, TRANS_B, ACCUMULATE (SS); a0-a3, b, TRANS_B (RS)
#define SM90_SS(shape, regs, dregs, a_op, b_op, ta_op, tb_op, acc_op)                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " acc_op ", 0;\nwgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 " regs \
                 ", " a_op ", " b_op ", p, 1, 1, " ta_op ", " tb_op ";\n}\n"                                                             \
                 : dregs                                                                                                       \
                 : "l"(a_desc), "l"(b_desc), "n"(TRANS_A), "n"(TRANS_B), "n"((int)ACCUMULATE))
#define SM90_RS(shape, regs, dregs, a_op, b_op, tb_op)                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 " regs      \
                 ", " a_op ", " b_op ", p, 1, 1, " tb_op ";\n}\n"                                                                    \
                 : dregs                                                                                                       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(TRANS_B))
#define ACC "+f"
#define OUT "=f"

// A and B from shared memory (descriptors); TRANS_A / TRANS_B: the operand is stored MN-major
// (wgmma_layout.h). ACCUMULATE = false: D = A B, the registers' old values unread (the first
// k-slice of a product: its accumulators need not stay live before it).
template <int N, int TRANS_A, int TRANS_B, bool ACCUMULATE>
__device__ inline void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc) {
    static_assert(N == 64 || N == 128, "m64n64k16 and m64n128k16 only");
    if constexpr (N == 64 && ACCUMULATE) {
        SM90_BODY(SM90_SS("m64n64k16", SM90_R32, SM90_D32(ACC), "%32", "%33", "%34", "%35", "%36");)
    } else if constexpr (N == 64) {
        SM90_BODY(SM90_SS("m64n64k16", SM90_R32, SM90_D32(OUT), "%32", "%33", "%34", "%35", "%36");)
    } else if constexpr (ACCUMULATE) {
        SM90_BODY(SM90_SS("m64n128k16", SM90_R64, SM90_D64(ACC), "%64", "%65", "%66", "%67", "%68");)
    } else {
        SM90_BODY(SM90_SS("m64n128k16", SM90_R64, SM90_D64(OUT), "%64", "%65", "%66", "%67", "%68");)
    }
}
// D (64 x N) = the sum of the products of K_SLICES k-slices, a(kk) and b(kk) their descriptors
template <int N, int TRANS_A, int TRANS_B, int K_SLICES, class DescA, class DescB>
__device__ inline void wgmma_product(float (&d)[N / 2], const DescA& a, const DescB& b) {
    wgmma_ss<N, TRANS_A, TRANS_B, false>(d, a(0), b(0));
#pragma unroll
    for (int kk = 1; kk < K_SLICES; kk++) wgmma_ss<N, TRANS_A, TRANS_B, true>(d, a(kk), b(kk));
}
// A from registers: the four registers of one k-slice (two bf16 each, wgmma_layout.h's
// a_row / a_col), B from shared memory; D += A B
template <int N, int TRANS_B>
__device__ inline void wgmma_rs(float (&d)[N / 2], const uint32_t* a, uint64_t b_desc) {
    static_assert(N == 64 || N == 128, "m64n64k16 and m64n128k16 only");
    if constexpr (N == 64) {
        SM90_BODY(SM90_RS("m64n64k16", SM90_R32, SM90_D32(ACC), "{%32, %33, %34, %35}", "%36", "%37");)
    } else {
        SM90_BODY(SM90_RS("m64n128k16", SM90_R64, SM90_D64(ACC), "{%64, %65, %66, %67}", "%68", "%69");)
    }
}
#undef SM90_D8
#undef SM90_D32
#undef SM90_D64
#undef SM90_R32
#undef SM90_R64
#undef SM90_SS
#undef SM90_RS
#undef ACC
#undef OUT

}  // namespace sm90
}  // namespace gpu
