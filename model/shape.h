// The model's shape in one place: its size (GPT2Config, as the checkpoint header stores it), its
// 16 parameter tensors and where each sits in the flat parameter buffer (ParamLayout, also the
// checkpoint's order), which of them decay, how they group for zero/ (param_groups), and the
// shapes by name that -e takes.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/io.h"
#include "../common/tensor_slice.h"

// the model's shape, as the checkpoint header stores it
struct GPT2Config {
    int max_seq_len = 1024;  // maxT
    int vocab_size = 50257;  // V
    int padded_vocab_size = 50304;  // Vp: V rounded up to 128, for aligned matmuls
    int num_layers = 12;     // L
    int num_heads = 12;      // NH
    int channels = 768;      // C
};

inline int pad_vocab(int V) { return (V + 127) / 128 * 128; }

// The 16 parameter tensors in llm.c's order, which is also the checkpoint's order.
enum Param { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB,
             FCPROJW, FCPROJB, LNFW, LNFB, NUM_PARAM_TENSORS };

// their names, as llm.c's train_gpt2.py calls them (without "transformer." and "h.N.")
inline const char* const kParamNames[NUM_PARAM_TENSORS] = {"wte", "wpe", "ln_1.weight", "ln_1.bias", "attn.c_attn.weight",
    "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
    "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"};

// The largest maxT, V, L, NH and C a model may have (the -e descriptor's limit too), and Vp's:
// with all of them within, ParamLayout's total fits in 64 bits (under 2^63.6).
constexpr int kMaxDimension = 1 << 20, kMaxPaddedVocab = 1 << 21;

// where each tensor sits in the flat parameter buffer (and in the checkpoint after its header)
struct ParamLayout {
    size_t size[NUM_PARAM_TENSORS];
    size_t offset[NUM_PARAM_TENSORS];
    size_t total = 0;

    explicit ParamLayout(const GPT2Config& c) {
        const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, T = c.max_seq_len;
        const size_t sizes[NUM_PARAM_TENSORS] = {Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C,
                                                 L * C * C, L * C, L * C, L * C, L * 4 * C * C, L * 4 * C,
                                                 L * C * 4 * C, L * C, C, C};
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            size[i] = sizes[i];
            offset[i] = total;
            total += sizes[i];
        }
    }
};

// Where the first value of x (values [first, first + n) of a parameter-shaped array, in
// ParamLayout's order) that is NaN or infinite, or with `nonnegative` (Adam's v) below zero,
// sits, and what it is: "h.1.mlp.c_fc.weight[904] (value 5000 of 7296) is nan". "" when there
// is none.
inline std::string find_bad_value(const float* x, size_t first, size_t n, const GPT2Config& c, bool nonnegative) {
    const ParamLayout layout(c);
    for (size_t k = 0; k < n; k++) {
        if (std::isfinite(x[k]) && !(nonnegative && x[k] < 0.0f)) continue;
        const size_t i = first + k;
        int p = NUM_PARAM_TENSORS - 1;
        while (layout.offset[p] > i) p--;
        size_t at = i - layout.offset[p];
        std::string name = kParamNames[p];
        if (p >= LN1W && p <= FCPROJB) {  // stored for all layers at once, layer after layer
            const size_t per_layer = layout.size[p] / c.num_layers;
            name = "h." + std::to_string(at / per_layer) + "." + name;
            at %= per_layer;
        }
        char what[200];
        snprintf(what, sizeof(what), "%s[%zu] (value %zu of %zu) is %g", name.c_str(), at, i, layout.total, x[k]);
        return what;
    }
    return "";
}
// ... of a whole array
inline std::string find_bad_value(const float* x, const GPT2Config& c, bool nonnegative) {
    return find_bad_value(x, 0, ParamLayout(c).total, c, nonnegative);
}

// A layer's tensors within its group, LN1W..FCPROJB in Param's order: in a layer's group,
// p[L_QKVW] is that layer's slice of QKVW.
enum LayerParam { L_LN1W, L_LN1B, L_QKVW, L_QKVB, L_ATTPROJW, L_ATTPROJB, L_LN2W, L_LN2B, L_FCW,
                  L_FCB, L_FCPROJW, L_FCPROJB, kLayerTensors };
static_assert(kLayerTensors == FCPROJB - LN1W + 1 && L_QKVW == QKVW - LN1W && L_FCPROJB == FCPROJB - LN1W,
              "LayerParam follows Param from LN1W to FCPROJB");

// The groups' numbers, as param_groups() makes them, and the tensors within the embedding's and
// the final layernorm's groups
constexpr int kEmbeddingGroup = 0;
inline int layer_group(int l) { return 1 + l; }
inline int final_group(const GPT2Config& c) { return 1 + c.num_layers; }
enum EmbeddingParam { E_WTE, E_WPE };
enum FinalParam { F_LNFW, F_LNFB };

// weight decay goes to the 2-D weights only, as in GPT-2
inline bool decays(int p) { return p == WTE || p == WPE || p == QKVW || p == ATTPROJW || p == FCW || p == FCPROJW; }

// The groups zero/ communicates by: group 0 the embedding {WTE, WPE}, groups 1..L the layers
// (kLayerTensors each, LayerParam's order), group L+1 the final layernorm {LNFW, LNFB}.
inline std::vector<std::vector<TensorSlice>> param_groups(const GPT2Config& c) {
    const ParamLayout p(c);
    const int L = c.num_layers;
    std::vector<std::vector<TensorSlice>> g;
    g.push_back({{p.offset[WTE], p.size[WTE], true}, {p.offset[WPE], p.size[WPE], true}});
    for (int l = 0; l < L; l++) {
        std::vector<TensorSlice> layer;
        for (int t = 0; t < kLayerTensors; t++) {
            const int param = LN1W + t;
            const size_t per_layer = p.size[param] / L;
            layer.push_back({p.offset[param] + l * per_layer, per_layer, decays(param)});
        }
        g.push_back(layer);
    }
    g.push_back({{p.offset[LNFW], p.size[LNFW], false}, {p.offset[LNFB], p.size[LNFB], false}});
    return g;
}

// Model shapes by name, as llm.c derives them: "dX" or "gpt2:dX" is GPT-2 of depth X (d12 124M,
// d24 350M, d36 774M, d48 1558M, and llm.c's unofficial d6, d60, d72, d84); "gpt3:cX" is GPT-3 of
// X channels (c768 125M ... c12288 175B; dense attention, context 2048). Both with GPT-2's
// vocabulary. "L=2,NH=4,C=64[,V=...,maxT=...]" spells out a small one. Returns false when desc
// is none of these (then it is a checkpoint path).
inline bool named_config(const std::string& desc, GPT2Config* c) {
    struct Gpt2 { int L, NH, C; };
    static const Gpt2 gpt2[] = {{6, 6, 384}, {12, 12, 768}, {24, 16, 1024}, {36, 20, 1280}, {48, 25, 1600},
                                {60, 30, 1920}, {72, 30, 2880}, {84, 36, 3456}};
    struct Gpt3 { int C, L, head_size; };
    static const Gpt3 gpt3[] = {{384, 6, 64}, {768, 12, 64}, {1024, 24, 64}, {1536, 24, 96}, {2048, 24, 128},
                                {2560, 32, 80}, {4096, 32, 128}, {5140, 40, 128}, {12288, 96, 128}};
    const bool is_gpt3 = desc.rfind("gpt3:c", 0) == 0;
    const size_t prefix = desc.rfind("gpt2:d", 0) == 0 || is_gpt3 ? 6 : desc.size() > 1 && desc[0] == 'd' ? 1 : 0;
    if (prefix == 0 || desc.find_first_not_of("0123456789", prefix) != std::string::npos) return false;
    const int x = atoi(desc.c_str() + prefix);
    *c = GPT2Config{};
    for (const auto& g : gpt2)
        if (!is_gpt3 && g.L == x) {
            c->num_layers = g.L, c->num_heads = g.NH, c->channels = g.C;
            return true;
        }
    for (const auto& g : gpt3)
        if (is_gpt3 && g.C == x) {
            if (g.C % g.head_size != 0) fatal(2, "model descriptor '%s': %d channels are not a whole number of heads of %d", desc.c_str(), g.C, g.head_size);
            c->num_layers = g.L, c->num_heads = g.C / g.head_size, c->channels = g.C, c->max_seq_len = 2048;
            return true;
        }
    fatal(2, is_gpt3 ? "model descriptor '%s': no GPT-3 with that channel count (expected 384, 768, 1024, 1536, 2048, 2560, 4096, 5140 or 12288)"
                     : "model descriptor '%s': no GPT-2 of that depth (expected 6, 12, 24, 36, 48, 60, 72 or 84)", desc.c_str());
}

inline bool config_from_descriptor(const std::string& desc, GPT2Config* c) {
    if (named_config(desc, c)) return true;
    if (desc.find('=') == std::string::npos) return false;
    *c = GPT2Config{};
    size_t pos = 0;
    while (pos < desc.size()) {
        size_t end = desc.find(',', pos);
        if (end == std::string::npos) end = desc.size();
        std::string item = desc.substr(pos, end - pos);
        size_t eq = item.find('=');
        std::string key = item.substr(0, eq);
        char* rest = nullptr;
        long value = eq == std::string::npos ? 0 : strtol(item.c_str() + eq + 1, &rest, 10);
        if (eq == std::string::npos || *rest != '\0' || value <= 0 || value > kMaxDimension)
            fatal(2, "bad model descriptor item '%s' in '%s' (expected KEY=positive integer)", item.c_str(), desc.c_str());
        if (key == "L") c->num_layers = (int)value;
        else if (key == "NH") c->num_heads = (int)value;
        else if (key == "C") c->channels = (int)value;
        else if (key == "V") c->vocab_size = (int)value;
        else if (key == "maxT") c->max_seq_len = (int)value;
        else fatal(2, "unknown model descriptor key '%s' (expected L, NH, C, V or maxT)", key.c_str());
        pos = end + 1;
    }
    if (c->channels % c->num_heads != 0)
        fatal(2, "model descriptor '%s': C=%d is not a multiple of NH=%d", desc.c_str(), c->channels, c->num_heads);
    c->padded_vocab_size = pad_vocab(c->vocab_size);
    return true;
}
