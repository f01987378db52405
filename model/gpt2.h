// GPT-2, written once for every backend: its initialisation, its activations, and its forward
// and backward passes as calls of the backend's ops (kernels/cpu_backend.h, kernels/cuda_backend.cuh).
// The parameters and their gradients are zero/'s: the model asks it for each group's tensors
// (params, grads) as it reaches that group, and says when a group's backward is done.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "../kernels/allocations.h"
#include "../kernels/backend_memory.h"
#include "../kernels/fp8_scaling.h"
#include "../zero/zero.h"
#include "shape.h"


// GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2L), zero
// biases, unit layernorm weights. std::mt19937 is specified exactly by the standard; the normal
// draws are our own Box-Muller so the values do not depend on the C++ library.
inline std::vector<float> random_init(const GPT2Config& c, uint64_t seed) {
    ParamLayout layout(c);
    std::vector<float> params(layout.total, 0.0f);
    std::mt19937 rng((uint32_t)seed);
    auto uniform = [&]() { return ((rng() >> 8) + 0.5f) / 16777216.0f; };
    auto fill_normal = [&](int p, float std, size_t count) {
        float* x = params.data() + layout.offset[p];
        for (size_t i = 0; i + 1 < count + 1; i += 2) {
            float r = sqrtf(-2.0f * logf(uniform())), th = 6.2831853071795864f * uniform();
            x[i] = std * r * cosf(th);
            if (i + 1 < count) x[i + 1] = std * r * sinf(th);
        }
    };
    const float residual_std = 0.02f / sqrtf(2.0f * c.num_layers);
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        if (p == LN1W || p == LN2W || p == LNFW) std::fill_n(params.data() + layout.offset[p], layout.size[p], 1.0f);
        else if (p == WTE) fill_normal(p, 0.02f, (size_t)c.vocab_size * c.channels);  // padded rows stay 0
        else if (p == ATTPROJW || p == FCPROJW) fill_normal(p, residual_std, layout.size[p]);
        else if (decays(p)) fill_normal(p, 0.02f, layout.size[p]);
    }
    return params;
}

template <class Backend>
class GPT2 {
public:
    using floatX = typename Backend::floatX;
    using Tensors = typename Zero<Backend>::Tensors;
    static_assert(kLayerTensors <= Zero<Backend>::kMaxGroupTensors, "a layer's group must fit zero/'s Tensors");

    // recompute: 0 keeps every activation, 1 recomputes GELU in backward, 2 also the layernorms;
    // fp8: the blocks' matmuls with fp8 operands (--fp8 e4m3, kernels/fp8_scaling.h)
    GPT2(const GPT2Config& c, int B, int T, int recompute, Zero<Backend>& zero, bool fp8 = false)
        : c_(c), B_(B), T_(T), recompute_(recompute), fp8_on_(fp8), zero_(zero) {
        const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, Vp = c.padded_vocab_size;
        const size_t ln_copies = recompute >= 2 ? 1 : L, gelu_copies = recompute >= 1 ? 1 : L;
        owned_.alloc(&encoded_, BT * C, &activation_bytes_);
        owned_.alloc(&ln1_, ln_copies * BT * C, &activation_bytes_);
        owned_.alloc(&ln2_, ln_copies * BT * C, &activation_bytes_);
        owned_.alloc(&ln1_stats_, L * 2 * BT, &activation_bytes_);
        owned_.alloc(&ln2_stats_, L * 2 * BT, &activation_bytes_);
        owned_.alloc(&qkv_, L * BT * 3 * C, &activation_bytes_);
        owned_.alloc(&atty_, L * BT * C, &activation_bytes_);
        att_saved_per_layer_ = Backend::attention_saved_floats(B, T, c.num_heads);
        owned_.alloc(&att_saved_, L * att_saved_per_layer_, &activation_bytes_);
        owned_.alloc(&residual2_, L * BT * C, &activation_bytes_);
        owned_.alloc(&residual3_, L * BT * C, &activation_bytes_);
        owned_.alloc(&fch_, L * BT * 4 * C, &activation_bytes_);
        owned_.alloc(&fch_gelu_, gelu_copies * BT * 4 * C, &activation_bytes_);
        owned_.alloc(&lnf_, BT * C, &activation_bytes_);
        owned_.alloc(&lnf_stats_, 2 * BT, &activation_bytes_);
        owned_.alloc(&logits_, BT * Vp, &activation_bytes_);
        owned_.alloc(&losses_, BT, &activation_bytes_);
        owned_.alloc(&inputs_, BT, &activation_bytes_);
        owned_.alloc(&targets_, BT, &activation_bytes_);
        owned_.alloc(&scratch_, BT * C, &scratch_bytes_);
        owned_.alloc(&dresidual_, BT * C, &scratch_bytes_);
        owned_.alloc(&dbuf_, BT * C, &scratch_bytes_);
        owned_.alloc(&dbuf4_, BT * 4 * C, &scratch_bytes_);
        if (fp8) {  // the casts' buffers, one set for every layer (Fp8Workspace says what each holds)
            owned_.alloc(&fp8_.rows, BT * 4 * C, &fp8_bytes_);
            if (Backend::fp8_gemms_take_transposed) owned_.alloc(&fp8_.rows_t, BT * 4 * C, &fp8_bytes_);
            owned_.alloc(&fp8_.other, BT * 4 * C, &fp8_bytes_);
            owned_.alloc(&fp8_.weight, 4 * C * C, &fp8_bytes_);
            owned_.alloc(&fp8_.scales, kFp8Operands, &fp8_bytes_);
            owned_.alloc(&fp8_.nonfinite_amaxes, 1, &fp8_bytes_);
        }
    }
    GPT2(const GPT2&) = delete;
    GPT2& operator=(const GPT2&) = delete;

    size_t activation_bytes() const { return activation_bytes_; }
    size_t scratch_bytes() const { return scratch_bytes_; }
    size_t fp8_bytes() const { return fp8_bytes_; }
    const GPT2Config& config() const { return c_; }

    // The largest shapes the backend's ops see in a run of this model at B x T, for the memory the
    // backend reserves (kernels/backend_memory.h): every op at B x T, the widest bias 4C, the
    // largest tensor zero/ loads or saves whole and a row of logits converted to fp32, the tokens
    // or targets of a batch uploaded
    static OpShapes op_shapes(const GPT2Config& c, int B, int T) {
        size_t largest = c.vocab_size;
        for (const auto& group : param_groups(c))
            for (const TensorSlice& t : group) largest = std::max(largest, t.n);
        return {B, T, c.channels, c.num_heads, 4 * c.channels, largest, (size_t)B * T * sizeof(int)};
    }

    // Forward pass on B x T tokens (B, T no larger than at construction). With targets it also
    // computes each position's loss (device_losses(), losses()), and with dloss != 0 leaves
    // d(loss)/d(logits) in place for backward(). It adds nothing up: a caller that wants a sum of
    // losses keeps its own LossSum. Training calls zero's begin_micro_step() before it; an
    // evaluation calls it alone.
    void forward(const int* inputs, const int* targets, int B, int T, float dloss) {
        upload_batch(inputs, targets, B * T);
        forward_uploaded(targets != nullptr, B, T, dloss);
    }
    // forward()'s two halves: the batch's tokens (and targets, if any) into backend memory, then
    // the pass, which reads nothing from the host (so that a CUDA graph may capture it)
    void upload_batch(const int* inputs, const int* targets, int BT) {
        Backend::from_host_pinned(inputs_, inputs, BT * sizeof(int));
        if (targets != nullptr) Backend::from_host_pinned(targets_, targets, BT * sizeof(int));
    }
    void forward_uploaded(bool with_targets, int B, int T, float dloss) {
        const int C = c_.channels, NH = c_.num_heads, L = c_.num_layers, BT = B * T;
        zero_.prefetch(layer_group(0));  // the first layer's parameters arrive while the embedding's are gathered
        Tensors emb = zero_.params(kEmbeddingGroup);
        Backend::encoder_forward(encoded_, inputs_, emb[E_WTE], emb[E_WPE], B, T, C);
        Tensors p = zero_.params(layer_group(0));
        Backend::layernorm_forward(ln1(0), ln1_stats(0, 0), ln1_stats(0, 1), encoded_, p[L_LN1W], p[L_LN1B], BT, C);
        for (int l = 0; l < L; l++) {
            const bool last = l + 1 == L;
            const int next = last ? final_group(c_) : layer_group(l + 1);
            zero_.prefetch(next);  // the next layer's (or the final layernorm's) parameters
            const floatX* residual = l == 0 ? encoded_ : layer(residual3_, l - 1, C);
            block_matmul_forward(layer(qkv_, l, 3 * C), ln1(l), p[L_QKVW], p[L_QKVB], BT, C, 3 * C);
            Backend::attention_forward(layer(atty_, l, C), att_saved(l), layer(qkv_, l, 3 * C), B, T, C, NH);
            block_matmul_forward(scratch_, layer(atty_, l, C), p[L_ATTPROJW], p[L_ATTPROJB], BT, C, C);
            Backend::residual_layernorm_forward(layer(residual2_, l, C), ln2(l), ln2_stats(l, 0), ln2_stats(l, 1),
                                                residual, scratch_, p[L_LN2W], p[L_LN2B], BT, C);
            block_matmul_gelu_forward(fch_gelu(l), layer(fch_, l, 4 * C), ln2(l), p[L_FCW], p[L_FCB], BT, C, 4 * C);
            block_matmul_forward(scratch_, fch_gelu(l), p[L_FCPROJW], p[L_FCPROJB], BT, 4 * C, C);
            // the block's residual add and the layernorm after it (the next layer's first, or the
            // final one) in one pass over the residual
            p = zero_.params(next);
            const floatX *next_w = last ? p[F_LNFW] : p[L_LN1W], *next_b = last ? p[F_LNFB] : p[L_LN1B];
            Backend::residual_layernorm_forward(layer(residual3_, l, C), last ? lnf_ : ln1(l + 1), last ? lnf_stats_ : ln1_stats(l + 1, 0),
                                                last ? lnf_stats_ + B_ * T_ : ln1_stats(l + 1, 1), layer(residual2_, l, C), scratch_,
                                                next_w, next_b, BT, C);
        }
        Backend::matmul_forward(logits_, lnf_, emb[E_WTE], nullptr, BT, C, c_.padded_vocab_size);
        if (!with_targets) return;
        Backend::fused_classifier(logits_, losses_, targets_, dloss, BT, c_.vocab_size, c_.padded_vocab_size);
    }

    // Backward pass of the last forward (which must have had targets and dloss != 0).
    // Gradients are added into what zero_ hands out, group by group, last layer first.
    void backward(int B, int T) {
        const int C = c_.channels, NH = c_.num_heads, L = c_.num_layers, BT = B * T;
        Tensors emb = zero_.params(kEmbeddingGroup), fin = zero_.params(final_group(c_));
        Tensors demb = zero_.grads(kEmbeddingGroup), dfin = zero_.grads(final_group(c_));
        Backend::matmul_backward(dbuf_, demb[E_WTE], nullptr, logits_, lnf_, emb[E_WTE], BT, C, c_.padded_vocab_size, false);
        Backend::zero(dresidual_, (size_t)BT * C * sizeof(floatX));
        Backend::layernorm_backward(dresidual_, dfin[F_LNFW], dfin[F_LNFB], dbuf_, layer(residual3_, L - 1, C), fin[F_LNFW],
                                    lnf_stats_, lnf_stats_ + B_ * T_, BT, C);
        zero_.grads_done(final_group(c_));
        for (int l = L - 1; l >= 0; l--) {
            Tensors p = zero_.params(layer_group(l)), g = zero_.grads(layer_group(l));
            // each bias gets one addition a backward: while the group is zero, it may be written
            const bool zeroed = zero_.grads_zeroed(layer_group(l));
            zero_.prefetch(l > 0 ? layer_group(l - 1) : kEmbeddingGroup);  // the group below
            const floatX* residual = l == 0 ? encoded_ : layer(residual3_, l - 1, C);
            floatX* fch = layer(fch_, l, 4 * C);
            if (recompute_ >= 1) Backend::gelu_forward(fch_gelu(l), fch, (size_t)BT * 4 * C);
            if (recompute_ >= 2)
                Backend::layernorm_forward(ln2(l), ln2_stats(l, 0), ln2_stats(l, 1), layer(residual2_, l, C), p[L_LN2W], p[L_LN2B], BT, C);
            block_mlp_backward(dbuf_, dbuf4_, dresidual_, ln2(l), fch, fch_gelu(l), p[L_FCW], p[L_FCPROJW],
                               {g[L_FCW], g[L_FCB], g[L_FCPROJW], g[L_FCPROJB], zeroed}, BT, C);
            Backend::layernorm_backward(dresidual_, g[L_LN2W], g[L_LN2B], dbuf_, layer(residual2_, l, C), p[L_LN2W],
                                        ln2_stats(l, 0), ln2_stats(l, 1), BT, C);
            block_matmul_backward(dbuf_, g[L_ATTPROJW], g[L_ATTPROJB], dresidual_, layer(atty_, l, C), p[L_ATTPROJW], BT, C, C,
                                  zeroed);
            floatX* dqkv = dbuf4_;  // dbuf4_ is free again and 4C >= 3C wide
            Backend::attention_backward(dqkv, dbuf_, layer(qkv_, l, 3 * C), layer(atty_, l, C), att_saved(l), B, T, C, NH);
            if (recompute_ >= 2)
                Backend::layernorm_forward(ln1(l), ln1_stats(l, 0), ln1_stats(l, 1), residual, p[L_LN1W], p[L_LN1B], BT, C);
            block_matmul_backward(dbuf_, g[L_QKVW], g[L_QKVB], dqkv, ln1(l), p[L_QKVW], BT, C, 3 * C, zeroed);
            Backend::layernorm_backward(dresidual_, g[L_LN1W], g[L_LN1B], dbuf_, residual, p[L_LN1W],
                                        ln1_stats(l, 0), ln1_stats(l, 1), BT, C);
            zero_.grads_done(layer_group(l));
        }
        Backend::encoder_backward(demb[E_WTE], demb[E_WPE], dresidual_, inputs_, B, T, C);
        zero_.grads_done(kEmbeddingGroup);
    }

    // the per-position losses of the last forward with targets, row b*T+t, in backend memory
    const float* device_losses() const { return losses_; }
    // the same, copied to the host
    const float* losses() {
        host_losses_.resize((size_t)B_ * T_);
        Backend::to_host(host_losses_.data(), losses_, host_losses_.size() * sizeof(float));
        return host_losses_.data();
    }

    // logits of row b*T+t after a forward whose loss had dloss == 0, as fp32 on the host
    void logits_at(int row, float* out) {
        Backend::download_fp32(out, logits_ + (size_t)row * c_.padded_vocab_size, c_.vocab_size);
    }

    // the casts since the last call whose amax was not finite: an infinity or NaN that an fp8
    // cast saturated away (kernels/fp8_scaling.h), which the trainer makes a non-finite step.
    // Reads backend memory and sets the count back to zero; 0 without --fp8.
    unsigned take_nonfinite_fp8_amaxes() {
        unsigned count = 0;
        if (!fp8_on_) return count;
        Backend::to_host(&count, fp8_.nonfinite_amaxes, sizeof(count));
        Backend::zero(fp8_.nonfinite_amaxes, sizeof(count));
        return count;
    }

private:
    // The block's matmuls: with --fp8 at the shapes fp8 GEMMs take, their fp8 forms (the same
    // call with the casts' workspace), else as they are
    bool fp8_at(int N, int C, int OC) const { return fp8_on_ && fp8_gemm_shape(N, C, OC); }
    void block_matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C, int OC) {
        if (fp8_at(N, C, OC)) Backend::fp8_matmul_forward(out, inp, w, bias, N, C, OC, fp8_);
        else Backend::matmul_forward(out, inp, w, bias, N, C, OC);
    }
    void block_matmul_gelu_forward(floatX* out_gelu, floatX* pre_gelu, const floatX* inp, const floatX* w, const floatX* bias, int N,
                                   int C, int OC) {
        if (fp8_at(N, C, OC)) Backend::fp8_matmul_gelu_forward(out_gelu, pre_gelu, inp, w, bias, N, C, OC, fp8_);
        else Backend::matmul_gelu_forward(out_gelu, pre_gelu, inp, w, bias, N, C, OC);
    }
    void block_matmul_backward(floatX* dinp, floatX* dw, floatX* dbias, const floatX* dout, const floatX* inp, const floatX* w, int N,
                               int C, int OC, bool dbias_zeroed) {
        if (fp8_at(N, C, OC)) Backend::fp8_matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, dbias_zeroed, fp8_);
        else Backend::matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, dbias_zeroed);
    }
    void block_mlp_backward(floatX* dinp, floatX* dpre_gelu, const floatX* dout, const floatX* inp, const floatX* pre_gelu,
                            const floatX* gelu, const floatX* w_fc, const floatX* w_proj, const MlpGrads<floatX>& g, int N, int C) {
        if (fp8_at(N, C, 4 * C)) Backend::fp8_mlp_backward(dinp, dpre_gelu, dout, inp, pre_gelu, gelu, w_fc, w_proj, g, N, C, fp8_);
        else Backend::mlp_backward(dinp, dpre_gelu, dout, inp, pre_gelu, gelu, w_fc, w_proj, g, N, C);
    }

    // per-layer activations are laid out layer-major with stride B*T*width
    floatX* layer(floatX* base, int l, int width) const { return base + (size_t)l * B_ * T_ * width; }
    floatX* ln1(int l) const { return layer(ln1_, recompute_ >= 2 ? 0 : l, c_.channels); }
    floatX* ln2(int l) const { return layer(ln2_, recompute_ >= 2 ? 0 : l, c_.channels); }
    floatX* fch_gelu(int l) const { return layer(fch_gelu_, recompute_ >= 1 ? 0 : l, 4 * c_.channels); }
    // which = 0: mean, 1: rstd
    float* ln1_stats(int l, int which) const { return ln1_stats_ + ((size_t)l * 2 + which) * B_ * T_; }
    float* ln2_stats(int l, int which) const { return ln2_stats_ + ((size_t)l * 2 + which) * B_ * T_; }
    float* att_saved(int l) const { return att_saved_ + (size_t)l * att_saved_per_layer_; }

    GPT2Config c_;
    int B_, T_, recompute_;
    bool fp8_on_;
    Zero<Backend>& zero_;
    Allocations<Backend> owned_;
    size_t activation_bytes_ = 0, scratch_bytes_ = 0, fp8_bytes_ = 0, att_saved_per_layer_ = 0;
    Fp8Workspace<typename Backend::Fp8Copy> fp8_;  // with --fp8
    floatX *encoded_, *ln1_, *ln2_, *qkv_, *atty_, *residual2_, *residual3_, *fch_, *fch_gelu_, *lnf_, *logits_;
    float *ln1_stats_, *ln2_stats_, *att_saved_, *lnf_stats_, *losses_;
    std::vector<float> host_losses_;
    int *inputs_, *targets_;
    floatX *scratch_, *dresidual_, *dbuf_, *dbuf4_;
};
