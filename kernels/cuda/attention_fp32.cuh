// Causal attention in plain fp32 arithmetic, for the fp32 build (the reference, not a speed
// target): one block owns a tile of query rows (or key rows, in backward), streams the other side
// through shared memory and keeps an online softmax, as the bf16 tensor-core kernels
// (flash_attention.cuh) do, but every tile product is a loop over shared memory. Head sizes are
// padded with zeros to a multiple of 16; 128-bit loads where hs is a multiple of 4.
#pragma once
#include <initializer_list>

#include "attention_heads.cuh"
#include "common.cuh"

namespace gpu {

constexpr int kAttnThreads = 128;  // 4 warps
constexpr int kPadX = 8;           // floatX row padding: keeps keeps 16-byte rows aligned
constexpr int kPadF = 4;           // float row padding

// C[M][N] (fp32, ldc) = (accumulate ? C : 0) + op(A)[M][K] @ op(B)[K][N], all in shared memory.
// A_T: A is stored [K][M] (read transposed); B_T: B is stored [N][K]. M, N, K multiples of 16.
template <bool A_T, bool B_T>
__device__ inline void smem_gemm(float* C, int ldc, const floatX* A, int lda, const floatX* Bm, int ldb, int M,
                                 int N, int K, bool accumulate) {
    for (int idx = threadIdx.x; idx < M * N; idx += blockDim.x) {
        const int m = idx / N, n = idx % N;
        float sum = accumulate ? C[m * ldc + n] : 0.0f;
        for (int k = 0; k < K; k++)
            sum += (A_T ? A[k * lda + m] : A[m * lda + k]) * (B_T ? Bm[n * ldb + k] : Bm[k * ldb + n]);
        C[m * ldc + n] = sum;
    }
}

// rows r0..r0+rows of a (T, *) matrix with row stride `stride` (elements), hs columns, into
// shared memory [rows][ld] padded with zeros to hsp columns and beyond row T
__device__ inline void load_rows(floatX* dst, int ld, const floatX* src, size_t stride, int r0, int rows, int T,
                                 int hs, int hsp, bool vec) {
    if (vec) {
        const int S = x128::size, units = hsp / S;
        for (int idx = threadIdx.x; idx < rows * units; idx += blockDim.x) {
            const int r = idx / units, d = (idx % units) * S;
            x128 v;
            if (r0 + r < T && d < hs) {
                v = load128(src + (size_t)(r0 + r) * stride + d);
            } else {
                for (int k = 0; k < S; k++) v[k] = (floatX)0.0f;
            }
            store128(dst + r * ld + d, v);
        }
    } else {
        for (int idx = threadIdx.x; idx < rows * hsp; idx += blockDim.x) {
            const int r = idx / hsp, d = idx % hsp;
            dst[r * ld + d] = (r0 + r < T && d < hs) ? src[(size_t)(r0 + r) * stride + d] : (floatX)0.0f;
        }
    }
}

// shared memory carving, identical on host (sizes) and device (pointers)
struct AttnSmem {
    int tile, hsp, ldx, ldt, lds, ldo;
    size_t used = 0;
    char* base;
    __host__ __device__ AttnSmem(char* b, int tile_, int hsp_)
        : tile(tile_), hsp(hsp_), ldx(hsp_ + kPadX), ldt(tile_ + kPadX), lds(tile_ + kPadF), ldo(hsp_ + kPadF),
          base(b) {}
    template <class T>
    __host__ __device__ T* take(size_t n) {
        T* p = (T*)(base + used);
        used += (n * sizeof(T) + 127) / 128 * 128;  // 128-byte aligned regions
        return p;
    }
    __host__ __device__ floatX* rows_x() { return take<floatX>((size_t)tile * ldx); }  // tile x hsp
    __host__ __device__ float* rows_o() { return take<float>((size_t)tile * ldo); }    // tile x hsp, fp32
    __host__ __device__ float* square_f() { return take<float>((size_t)tile * lds); }  // tile x tile, fp32
    __host__ __device__ floatX* square_x() { return take<floatX>((size_t)tile * ldt); }  // tile x tile
    __host__ __device__ float* vec() { return take<float>(tile); }
};

// grid (query tiles, attention_grid's heads)
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, int hs, int hsp,
                             int tile, bool vec) {
    extern __shared__ __align__(128) char smem_raw[];
    AttnSmem sm(smem_raw, tile, hsp);
    floatX *Qs = sm.rows_x(), *Ks = sm.rows_x(), *Vs = sm.rows_x(), *Ps = sm.square_x();
    float *Ss = sm.square_f(), *Os = sm.rows_o(), *ms = sm.vec(), *ls = sm.vec();
    const int qt = gridDim.x - 1 - blockIdx.x;  // the longest (last) query tiles start first
    int b, h;
    if (!head_of_block(NH, B, &b, &h)) return;
    const int q0 = qt * tile;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
    const size_t C3 = (size_t)3 * C;
    const floatX* base = qkv + (size_t)b * T * C3 + h * hs;
    const float scale = 1.0f / sqrtf((float)hs);

    load_rows(Qs, sm.ldx, base, C3, q0, tile, T, hs, hsp, vec);
    for (int i = threadIdx.x; i < tile * sm.ldo; i += blockDim.x) Os[i] = 0.0f;
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        ms[i] = -INFINITY;
        ls[i] = 0.0f;
    }
    const int last_key = min(q0 + tile, T) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += tile) {
        __syncthreads();  // the previous tile's K, V, P are no longer read
        load_rows(Ks, sm.ldx, base + C, C3, k0, tile, T, hs, hsp, vec);
        load_rows(Vs, sm.ldx, base + 2 * C, C3, k0, tile, T, hs, hsp, vec);
        __syncthreads();
        smem_gemm<false, true>(Ss, sm.lds, Qs, sm.ldx, Ks, sm.ldx, tile, tile, hsp, false);  // S = Q K^T
        __syncthreads();
        // online softmax, one warp per row: rescale what O holds by exp(m_old - m_new)
        for (int r = warp; r < tile; r += nwarps) {
            const int q = q0 + r;
            float mx = -INFINITY;
            for (int c = lane; c < tile; c += kWarp) {
                const int k = k0 + c;
                float s = (q < T && k <= q) ? Ss[r * sm.lds + c] * scale : -INFINITY;
                Ss[r * sm.lds + c] = s;
                mx = fmaxf(mx, s);
            }
            const float m_old = ms[r], m_new = fmaxf(m_old, warp_max(mx));
            // a row with nothing visible yet (m_new = -inf) must not turn into NaNs
            const bool empty = m_new == -INFINITY;
            const float alpha = empty ? 1.0f : expf(m_old - m_new);
            float sum = 0.0f;
            for (int c = lane; c < tile; c += kWarp) {
                float p = empty ? 0.0f : expf(Ss[r * sm.lds + c] - m_new);
                Ps[r * sm.ldt + c] = (floatX)p;
                sum += p;
            }
            sum = warp_sum(sum);
            for (int d = lane; d < hsp; d += kWarp) Os[r * sm.ldo + d] *= alpha;
            if (lane == 0) {
                ms[r] = m_new;
                ls[r] = ls[r] * alpha + sum;
            }
        }
        __syncthreads();
        smem_gemm<false, false>(Os, sm.ldo, Ps, sm.ldt, Vs, sm.ldx, tile, hsp, tile, true);  // O += P V
    }
    __syncthreads();
    for (int r = warp; r < tile; r += nwarps) {
        const int q = q0 + r;
        if (q >= T) break;
        const float inv = 1.0f / ls[r];
        floatX* o = out + ((size_t)b * T + q) * C + h * hs;
        for (int d = lane; d < hs; d += kWarp) o[d] = (floatX)(Os[r * sm.ldo + d] * inv);
        if (lane == 0) lse[((size_t)b * NH + h) * T + q] = ms[r] + logf(ls[r]);
    }
}

// P = exp(s - lse) and dS = P (dP - D) * scale for the (query tile q0, key tile k0) square
__device__ inline void attention_backward_scores(floatX* Ps, floatX* dSs, const float* Ss, const float* dPs,
                                                 const float* lse_s, const float* delta_s, const AttnSmem& sm,
                                                 int q0, int k0, int T, float scale) {
    const int tile = sm.tile;
    for (int idx = threadIdx.x; idx < tile * tile; idx += blockDim.x) {
        const int r = idx / tile, c = idx % tile, q = q0 + r, k = k0 + c;
        float p = (q < T && k <= q) ? expf(Ss[r * sm.lds + c] * scale - lse_s[r]) : 0.0f;
        if (Ps) Ps[r * sm.ldt + c] = (floatX)p;
        dSs[r * sm.ldt + c] = (floatX)(p * (dPs[r * sm.lds + c] - delta_s[r]) * scale);
    }
}

__device__ inline void load_row_stats(float* lse_s, float* delta_s, const float* lse, const float* delta,
                                      size_t bh_off, int q0, int tile, int T) {
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        const bool ok = q0 + i < T;
        lse_s[i] = ok ? lse[bh_off + q0 + i] : INFINITY;
        delta_s[i] = ok ? delta[bh_off + q0 + i] : 0.0f;
    }
}

// grid (key tiles, attention_grid's heads): dK, dV of one key tile, summed over the query tiles at or below it
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_kv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                 const float* delta, int B, int T, int C, int NH, int hs, int hsp, int tile, bool vec) {
    extern __shared__ __align__(128) char smem_raw[];
    AttnSmem sm(smem_raw, tile, hsp);
    floatX *Ks = sm.rows_x(), *Vs = sm.rows_x(), *Qs = sm.rows_x(), *dOs = sm.rows_x();
    floatX *Ps = sm.square_x(), *dSs = sm.square_x();
    float *Ss = sm.square_f(), *dPs = sm.square_f(), *dKs = sm.rows_o(), *dVs = sm.rows_o();
    float *lse_s = sm.vec(), *delta_s = sm.vec();
    const int kt = blockIdx.x;  // low key tiles see the most queries: blocks start in index order
    int b, h;
    if (!head_of_block(NH, B, &b, &h)) return;
    const int k0 = kt * tile;
    const size_t C3 = (size_t)3 * C, bh_off = ((size_t)b * NH + h) * T;
    const floatX* base = qkv + (size_t)b * T * C3 + h * hs;
    const floatX* dout_base = dout + (size_t)b * T * C + h * hs;
    const float scale = 1.0f / sqrtf((float)hs);

    load_rows(Ks, sm.ldx, base + C, C3, k0, tile, T, hs, hsp, vec);
    load_rows(Vs, sm.ldx, base + 2 * C, C3, k0, tile, T, hs, hsp, vec);
    for (int i = threadIdx.x; i < tile * sm.ldo; i += blockDim.x) dKs[i] = dVs[i] = 0.0f;
    for (int q0 = k0; q0 < T; q0 += tile) {  // tiles are aligned: queries below k0 see none of these keys
        __syncthreads();
        load_rows(Qs, sm.ldx, base, C3, q0, tile, T, hs, hsp, vec);
        load_rows(dOs, sm.ldx, dout_base, C, q0, tile, T, hs, hsp, vec);
        load_row_stats(lse_s, delta_s, lse, delta, bh_off, q0, tile, T);
        __syncthreads();
        smem_gemm<false, true>(Ss, sm.lds, Qs, sm.ldx, Ks, sm.ldx, tile, tile, hsp, false);    // S = Q K^T
        smem_gemm<false, true>(dPs, sm.lds, dOs, sm.ldx, Vs, sm.ldx, tile, tile, hsp, false);  // dP = dO V^T
        __syncthreads();
        attention_backward_scores(Ps, dSs, Ss, dPs, lse_s, delta_s, sm, q0, k0, T, scale);
        __syncthreads();
        smem_gemm<true, false>(dVs, sm.ldo, Ps, sm.ldt, dOs, sm.ldx, tile, hsp, tile, true);  // dV += P^T dO
        smem_gemm<true, false>(dKs, sm.ldo, dSs, sm.ldt, Qs, sm.ldx, tile, hsp, tile, true);  // dK += dS^T Q
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < tile * hs; idx += blockDim.x) {
        const int r = idx / hs, d = idx % hs, k = k0 + r;
        if (k >= T) break;
        floatX* dst = dqkv + ((size_t)b * T + k) * C3 + h * hs + d;
        dst[C] = (floatX)dKs[r * sm.ldo + d];
        dst[2 * C] = (floatX)dVs[r * sm.ldo + d];
    }
}

// grid (query tiles, attention_grid's heads): dQ of one query tile, summed over the key tiles up to the diagonal
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_q_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                const float* delta, int B, int T, int C, int NH, int hs, int hsp, int tile, bool vec) {
    extern __shared__ __align__(128) char smem_raw[];
    AttnSmem sm(smem_raw, tile, hsp);
    floatX *Qs = sm.rows_x(), *dOs = sm.rows_x(), *Ks = sm.rows_x(), *Vs = sm.rows_x();
    floatX* dSs = sm.square_x();
    float *Ss = sm.square_f(), *dPs = sm.square_f(), *dQs = sm.rows_o();
    float *lse_s = sm.vec(), *delta_s = sm.vec();
    const int qt = gridDim.x - 1 - blockIdx.x;
    int b, h;
    if (!head_of_block(NH, B, &b, &h)) return;
    const int q0 = qt * tile;
    const size_t C3 = (size_t)3 * C, bh_off = ((size_t)b * NH + h) * T;
    const floatX* base = qkv + (size_t)b * T * C3 + h * hs;
    const float scale = 1.0f / sqrtf((float)hs);

    load_rows(Qs, sm.ldx, base, C3, q0, tile, T, hs, hsp, vec);
    load_rows(dOs, sm.ldx, dout + (size_t)b * T * C + h * hs, C, q0, tile, T, hs, hsp, vec);
    load_row_stats(lse_s, delta_s, lse, delta, bh_off, q0, tile, T);
    for (int i = threadIdx.x; i < tile * sm.ldo; i += blockDim.x) dQs[i] = 0.0f;
    const int last_key = min(q0 + tile, T) - 1;
    for (int k0 = 0; k0 <= last_key; k0 += tile) {
        __syncthreads();
        load_rows(Ks, sm.ldx, base + C, C3, k0, tile, T, hs, hsp, vec);
        load_rows(Vs, sm.ldx, base + 2 * C, C3, k0, tile, T, hs, hsp, vec);
        __syncthreads();
        smem_gemm<false, true>(Ss, sm.lds, Qs, sm.ldx, Ks, sm.ldx, tile, tile, hsp, false);
        smem_gemm<false, true>(dPs, sm.lds, dOs, sm.ldx, Vs, sm.ldx, tile, tile, hsp, false);
        __syncthreads();
        attention_backward_scores(nullptr, dSs, Ss, dPs, lse_s, delta_s, sm, q0, k0, T, scale);
        __syncthreads();
        smem_gemm<false, false>(dQs, sm.ldo, dSs, sm.ldt, Ks, sm.ldx, tile, hsp, tile, true);  // dQ += dS K
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < tile * hs; idx += blockDim.x) {
        const int r = idx / hs, d = idx % hs, q = q0 + r;
        if (q >= T) break;
        dqkv[((size_t)b * T + q) * C3 + h * hs + d] = (floatX)dQs[r * sm.ldo + d];
    }
}

enum class AttnKernel { Forward, BackwardKV, BackwardQ };

inline size_t attention_smem_bytes(AttnKernel which, int tile, int hsp) {
    AttnSmem sm(nullptr, tile, hsp);
    if (which == AttnKernel::Forward) {
        // Q K V | P | S | O | m l
        for (int i = 0; i < 3; i++) sm.rows_x();
        sm.square_x();
        sm.square_f();
        sm.rows_o();
    } else if (which == AttnKernel::BackwardKV) {
        // K V Q dO | P dS | S dP | dK dV | lse D
        for (int i = 0; i < 4; i++) sm.rows_x();
        for (int i = 0; i < 2; i++) {
            sm.square_x();
            sm.square_f();
            sm.rows_o();
        }
    } else {
        // Q dO K V | dS | S dP | dQ | lse D
        for (int i = 0; i < 4; i++) sm.rows_x();
        sm.square_x();
        for (int i = 0; i < 2; i++) sm.square_f();
        sm.rows_o();
    }
    sm.vec();
    sm.vec();
    return sm.used;
}

// the largest tile (64 or 32 rows) whose shared memory fits this GPU; 64 gives tensor cores
// more work per load, 32 keeps hs = 128 backward within an A100's 163 KiB
inline int attention_tile(AttnKernel which, int hsp, size_t* bytes) {
    for (int tile : {64, 32}) {
        *bytes = attention_smem_bytes(which, tile, hsp);
        if (*bytes <= ctx().max_smem_optin) return tile;
    }
    fatal(1, "attention: head size %d needs %zu bytes of shared memory, the GPU has %zu", hsp, *bytes,
          ctx().max_smem_optin);
}

template <class Kernel>
inline void attention_set_smem(Kernel kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

inline bool attention_vec_ok(int C, int hs, std::initializer_list<const void*> ptrs) {
    if (hs % x128::size != 0 || C % x128::size != 0) return false;
    for (const void* p : ptrs)
        if (!aligned16(p)) return false;
    return true;
}


inline void plain_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    const int hs = C / NH, hsp = (hs + 15) / 16 * 16;
    size_t bytes;
    const int tile = attention_tile(AttnKernel::Forward, hsp, &bytes);
    attention_set_smem(attention_forward_kernel, bytes);
    attention_forward_kernel<<<attention_grid(ceil_div(T, tile), B, NH), kAttnThreads, bytes, stream()>>>(
        out, lse, qkv, B, T, C, NH, hs, hsp, tile, attention_vec_ok(C, hs, {qkv}));
    check_launch();
}

inline void plain_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                     const float* delta, int B, int T, int C, int NH) {
    const int hs = C / NH, hsp = (hs + 15) / 16 * 16;
    const bool vec = attention_vec_ok(C, hs, {qkv, dout});
    size_t bytes;
    int tile = attention_tile(AttnKernel::BackwardKV, hsp, &bytes);
    attention_set_smem(attention_backward_kv_kernel, bytes);
    attention_backward_kv_kernel<<<attention_grid(ceil_div(T, tile), B, NH), kAttnThreads, bytes, stream()>>>(
        dqkv, dout, qkv, lse, delta, B, T, C, NH, hs, hsp, tile, vec);
    check_launch();
    tile = attention_tile(AttnKernel::BackwardQ, hsp, &bytes);
    attention_set_smem(attention_backward_q_kernel, bytes);
    attention_backward_q_kernel<<<attention_grid(ceil_div(T, tile), B, NH), kAttnThreads, bytes, stream()>>>(
        dqkv, dout, qkv, lse, delta, B, T, C, NH, hs, hsp, tile, vec);
    check_launch();
}

}  // namespace gpu
