// Every op of the CPU backend (kernels/cpu/) on its own, forward and backward, against its
// formula evaluated directly in double precision on small random inputs; every backward also
// against central finite differences (in double) of that double forward, which checks the
// chain rule independently of how the backward formula was derived.
//
// Tolerances: |fp32 - reference| <= atol + rtol |reference| per element. The references are
// exact to ~1e-15 (finite differences to ~1e-9 absolute), so the tolerances bound only the
// kernels' fp32 rounding: a few ulp (2^-23 = 1.2e-7) times the length of the sums involved.
//   residual, encoder forward            rtol 2.4e-7 (one fp32 addition per element)
//   encoder backward                     rtol 2.4e-7, atol 1e-7 (a few additions per element)
//   GELU forward                         rtol 1e-6, atol 1e-7 (near 0 the output is a
//                                        difference of O(|x|) terms: atol covers it)
//   GELU backward                        rtol 1e-6, atol 2.4e-7 |dout| (1 + |x|^3): a
//                                        difference of terms that large
//   layernorm, matmul, attention         rtol 1e-6, atol 1e-6 (sums of <= 64 terms)
//   classifier                           rtol 1e-6, atol 1e-6 (loss), 1e-8 (dlogits ~ dloss/V)
//   AdamW update                         rtol 1e-6, atol 1e-9
//   sum of squares                       rtol 1e-12 (summed in double)
// Against finite differences the same, but 1e-6 absolute at least where the op's is smaller
// (the encoder's). The inputs are small (dozens to hundreds of elements), so the binary runs in
// well under a second, and a constant wrong in its 4th digit (GELU's 0.044715) fails its op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <cstring>
#include <vector>

#include "kernels/attention_tiles.h"
#include "kernels/wgmma_layout.h"
#include "kernels/cpu_backend.h"
#include "test/tolerance.h"

namespace {

using Vec = std::vector<double>;

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> x(n);
    for (auto& v : x) v = dist(rng);
    return x;
}

Vec widen(const std::vector<float>& x) { return Vec(x.begin(), x.end()); }

double dot(const Vec& a, const Vec& b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

// every element within atol[i] + rtol |want|; names the worst one otherwise
void expect_close(const char* what, const std::vector<float>& got, const Vec& want, double rtol, const Vec& atol) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double r = std::fabs(got[i] - want[i]) / (atol[i] + rtol * std::fabs(want[i]));
        if (!(r <= worst)) worst = r, at = i;  // also catches NaN
    }
    EXPECT_LE(worst, 1.0) << what << ": element " << at << " is " << got[at] << ", expected " << want[at];
}
void expect_close(const char* what, const std::vector<float>& got, const Vec& want, double rtol, double atol) {
    expect_close(what, got, want, rtol, Vec(want.size(), atol));
}

// d/dx of dot(dout, f(x)) by central differences in double
Vec numeric_grad(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& dout) {
    Vec g(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double x0 = x[i], h = 1e-6 * std::max(1.0, std::fabs(x0));
        x[i] = x0 + h;
        const double plus = dot(dout, f(x));
        x[i] = x0 - h;
        const double minus = dot(dout, f(x));
        x[i] = x0;
        g[i] = (plus - minus) / (2 * h);
    }
    return g;
}

Vec plus(const Vec& a, const Vec& b) {
    Vec s(a);
    for (size_t i = 0; i < s.size(); i++) s[i] += b[i];
    return s;
}

// ----------------------------------------------------------------------------

TEST(Ops, ResidualForward) {
    auto a = random_floats(100, 1), b = random_floats(100, 2);
    std::vector<float> out(100);
    cpu::residual_forward(out.data(), a.data(), b.data(), out.size());
    expect_close("a + b", out, plus(widen(a), widen(b)), 2.4e-7, 0.0);
}

TEST(Ops, Encoder) {
    const int B = 2, T = 5, C = 6, V = 7;
    std::vector<int> tokens = {3, 1, 3, 6, 0, 3, 3, 2, 6, 1};  // repeats: rows that collect several gradients
    auto wte = random_floats((size_t)V * C, 3), wpe = random_floats((size_t)T * C, 4);
    std::vector<float> out((size_t)B * T * C);
    cpu::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    auto reference = [&](const Vec& te, const Vec& pe) {
        Vec o((size_t)B * T * C);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < C; c++) o[((size_t)b * T + t) * C + c] = te[(size_t)tokens[b * T + t] * C + c] + pe[(size_t)t * C + c];
        return o;
    };
    const Vec te = widen(wte), pe = widen(wpe);
    expect_close("encoder forward", out, reference(te, pe), 2.4e-7, 0.0);

    auto dout = random_floats(out.size(), 5);
    auto dwte = random_floats(wte.size(), 6), dwpe = random_floats(wpe.size(), 7);  // accumulated into
    const Vec dwte0 = widen(dwte), dwpe0 = widen(dwpe), d = widen(dout);
    cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    Vec want_te = dwte0, want_pe = dwpe0;
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            want_te[(size_t)tokens[bt] * C + c] += d[(size_t)bt * C + c];
            want_pe[(size_t)(bt % T) * C + c] += d[(size_t)bt * C + c];
        }
    expect_close("encoder dwte", dwte, want_te, 2.4e-7, 1e-7);
    expect_close("encoder dwpe", dwpe, want_pe, 2.4e-7, 1e-7);
    expect_close("encoder dwte vs finite differences", dwte,
                 plus(dwte0, numeric_grad([&](const Vec& x) { return reference(x, pe); }, te, d)), 1e-6, 1e-6);
    expect_close("encoder dwpe vs finite differences", dwpe,
                 plus(dwpe0, numeric_grad([&](const Vec& x) { return reference(te, x); }, pe, d)), 1e-6, 1e-6);
}

// GELU's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

TEST(Ops, Gelu) {
    auto x = random_floats(400, 8, -5.0f, 5.0f);
    std::vector<float> out(x.size());
    cpu::gelu_forward(out.data(), x.data(), x.size());
    auto reference = [](const Vec& in) {
        Vec o(in.size());
        for (size_t i = 0; i < in.size(); i++) o[i] = gelu(in[i]);
        return o;
    };
    const Vec xd = widen(x);
    expect_close("gelu forward", out, reference(xd), 1e-6, 1e-7);

    auto dinout = random_floats(x.size(), 9);
    const Vec dout = widen(dinout);
    cpu::gelu_backward(dinout.data(), x.data(), x.size());
    Vec want(x.size());
    const double s = std::sqrt(2.0 / M_PI);
    for (size_t i = 0; i < x.size(); i++) {
        const double v = xd[i], th = std::tanh(s * (v + 0.044715 * v * v * v));
        want[i] = dout[i] * (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * s * (1 + 3 * 0.044715 * v * v));
    }
    // the derivative is a difference of terms up to ~|x|^3 |dout| large (0.5 x sech^2 du)
    Vec atol(x.size());
    for (size_t i = 0; i < x.size(); i++) atol[i] = 2.4e-7 * std::fabs(dout[i]) * (1.0 + std::pow(std::fabs(xd[i]), 3));
    expect_close("gelu backward", dinout, want, 1e-6, atol);
    expect_close("gelu backward vs finite differences", dinout, numeric_grad(reference, xd, dout), 1e-6, atol);
}

TEST(Ops, Layernorm) {
    const int N = 6, C = 32;
    auto inp = random_floats((size_t)N * C, 10, -2.0f, 3.0f), w = random_floats(C, 11, 0.5f, 1.5f), b = random_floats(C, 12);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    // y = (x - mean) / sqrt(var + 1e-5) w + b, var the biased variance of the row
    auto stats = [&](const Vec& x, Vec* m, Vec* s) {
        for (int i = 0; i < N; i++) {
            double sum = 0, sq = 0;
            for (int c = 0; c < C; c++) sum += x[(size_t)i * C + c];
            (*m)[i] = sum / C;
            for (int c = 0; c < C; c++) sq += (x[(size_t)i * C + c] - (*m)[i]) * (x[(size_t)i * C + c] - (*m)[i]);
            (*s)[i] = 1.0 / std::sqrt(sq / C + 1e-5);
        }
    };
    auto reference = [&](const Vec& x, const Vec& wd, const Vec& bd) {
        Vec m(N), s(N), y(x.size());
        stats(x, &m, &s);
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) y[(size_t)i * C + c] = (x[(size_t)i * C + c] - m[i]) * s[i] * wd[c] + bd[c];
        return y;
    };
    const Vec x = widen(inp), wd = widen(w), bd = widen(b);
    Vec m(N), s(N);
    stats(x, &m, &s);
    expect_close("layernorm forward", out, reference(x, wd, bd), 1e-6, 1e-6);
    expect_close("layernorm mean", mean, m, 1e-6, 1e-6);
    expect_close("layernorm rstd", rstd, s, 1e-6, 0.0);

    auto dout = random_floats(out.size(), 13);
    auto dinp = random_floats(inp.size(), 14), dw = random_floats(C, 15), db = random_floats(C, 16);  // accumulated into
    const Vec d = widen(dout), dinp0 = widen(dinp), dw0 = widen(dw), db0 = widen(db);
    cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(), rstd.data(), N, C);
    // dx = rstd (dn - mean(dn) - norm mean(dn norm)) with dn = dy w; dw = sum dy norm; db = sum dy
    Vec want_x = dinp0, want_w = dw0, want_b = db0;
    for (int i = 0; i < N; i++) {
        double dn_mean = 0, dn_norm_mean = 0;
        for (int c = 0; c < C; c++) {
            const size_t k = (size_t)i * C + c;
            const double norm = (x[k] - m[i]) * s[i];
            dn_mean += d[k] * wd[c] / C;
            dn_norm_mean += d[k] * wd[c] * norm / C;
            want_w[c] += d[k] * norm;
            want_b[c] += d[k];
        }
        for (int c = 0; c < C; c++) {
            const size_t k = (size_t)i * C + c;
            want_x[k] += s[i] * (d[k] * wd[c] - dn_mean - (x[k] - m[i]) * s[i] * dn_norm_mean);
        }
    }
    expect_close("layernorm dinp", dinp, want_x, 1e-6, 1e-6);
    expect_close("layernorm dweight", dw, want_w, 1e-6, 1e-6);
    expect_close("layernorm dbias", db, want_b, 1e-6, 1e-6);
    expect_close("layernorm dinp vs finite differences", dinp,
                 plus(dinp0, numeric_grad([&](const Vec& v) { return reference(v, wd, bd); }, x, d)), 1e-6, 1e-6);
    expect_close("layernorm dweight vs finite differences", dw,
                 plus(dw0, numeric_grad([&](const Vec& v) { return reference(x, v, bd); }, wd, d)), 1e-6, 1e-6);
    expect_close("layernorm dbias vs finite differences", db,
                 plus(db0, numeric_grad([&](const Vec& v) { return reference(x, wd, v); }, bd, d)), 1e-6, 1e-6);
}

TEST(Ops, Matmul) {
    const int N = 7, C = 5, OC = 6;
    auto inp = random_floats((size_t)N * C, 17), w = random_floats((size_t)OC * C, 18), bias = random_floats(OC, 19);
    // out[n,o] = sum_c inp[n,c] w[o,c] + bias[o]
    auto reference = [&](const Vec& x, const Vec& wd, const Vec* bd) {
        Vec o((size_t)N * OC);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < OC; j++) {
                double sum = bd ? (*bd)[j] : 0.0;
                for (int c = 0; c < C; c++) sum += x[(size_t)n * C + c] * wd[(size_t)j * C + c];
                o[(size_t)n * OC + j] = sum;
            }
        return o;
    };
    const Vec x = widen(inp), wd = widen(w), bd = widen(bias);
    std::vector<float> out((size_t)N * OC);
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    expect_close("matmul forward", out, reference(x, wd, &bd), 1e-6, 1e-6);
    cpu::matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
    expect_close("matmul forward without bias", out, reference(x, wd, nullptr), 1e-6, 1e-6);

    auto dout = random_floats(out.size(), 20);
    std::vector<float> dinp = random_floats(inp.size(), 21);  // overwritten
    auto dw = random_floats(w.size(), 22), db = random_floats(OC, 23);  // accumulated into
    const Vec d = widen(dout), dw0 = widen(dw), db0 = widen(db);
    cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
    Vec want_x((size_t)N * C, 0.0), want_w = dw0, want_b = db0;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OC; j++) {
            const double g = d[(size_t)n * OC + j];
            want_b[j] += g;
            for (int c = 0; c < C; c++) {
                want_x[(size_t)n * C + c] += g * wd[(size_t)j * C + c];
                want_w[(size_t)j * C + c] += g * x[(size_t)n * C + c];
            }
        }
    expect_close("matmul dinp", dinp, want_x, 1e-6, 1e-6);
    expect_close("matmul dweight", dw, want_w, 1e-6, 1e-6);
    expect_close("matmul dbias", db, want_b, 1e-6, 1e-6);
    expect_close("matmul dinp vs finite differences", dinp, numeric_grad([&](const Vec& v) { return reference(v, wd, &bd); }, x, d), 1e-6, 1e-6);
    expect_close("matmul dweight vs finite differences", dw,
                 plus(dw0, numeric_grad([&](const Vec& v) { return reference(x, v, &bd); }, wd, d)), 1e-6, 1e-6);
    expect_close("matmul dbias vs finite differences", db,
                 plus(db0, numeric_grad([&](const Vec& v) { return reference(x, wd, &v); }, bd, d)), 1e-6, 1e-6);
}

TEST(Ops, Attention) {
    const int B = 2, T = 5, C = 8, NH = 2, hs = C / NH;
    auto qkv = random_floats((size_t)B * T * 3 * C, 24, -2.0f, 2.0f);
    // out[b,t,h] = sum_{t2 <= t} p[t2] v[b,t2,h], p = softmax over t2 of q[b,t,h].k[b,t2,h] / sqrt(hs)
    auto at = [&](int b, int t, int part, int h) { return ((size_t)b * T + t) * 3 * C + part * C + h * hs; };
    auto probabilities = [&](const Vec& in, int b, int h, int t) {
        Vec p(t + 1);
        double mx = -INFINITY, sum = 0;
        for (int t2 = 0; t2 <= t; t2++) {
            double s = 0;
            for (int i = 0; i < hs; i++) s += in[at(b, t, 0, h) + i] * in[at(b, t2, 1, h) + i];
            p[t2] = s / std::sqrt((double)hs);
            mx = std::max(mx, p[t2]);
        }
        for (auto& v : p) sum += (v = std::exp(v - mx));
        for (auto& v : p) v /= sum;
        return p;
    };
    auto reference = [&](const Vec& in) {
        Vec o((size_t)B * T * C, 0.0);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    Vec p = probabilities(in, b, h, t);
                    for (int t2 = 0; t2 <= t; t2++)
                        for (int i = 0; i < hs; i++) o[((size_t)b * T + t) * C + h * hs + i] += p[t2] * in[at(b, t2, 2, h) + i];
                }
        return o;
    };
    const Vec x = widen(qkv);
    std::vector<float> out((size_t)B * T * C), att(cpu::attention_saved_floats(B, T, NH));
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    expect_close("attention forward", out, reference(x), 1e-6, 1e-6);
    std::vector<float> att_causal;  // only the entries t2 <= t are defined
    Vec want_att;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                Vec p = probabilities(x, b, h, t);
                for (int t2 = 0; t2 <= t; t2++) {
                    att_causal.push_back(att[(((size_t)b * NH + h) * T + t) * T + t2]);
                    want_att.push_back(p[t2]);
                }
            }
    expect_close("attention probabilities", att_causal, want_att, 1e-6, 1e-7);

    auto dout = random_floats(out.size(), 25);
    std::vector<float> dqkv = random_floats(qkv.size(), 26);  // overwritten
    const Vec d = widen(dout);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    // dv[t2] += p dout[t]; dp = dout[t].v[t2]; ds = p (dp - sum p dp); dq += ds k[t2] / sqrt(hs), dk[t2] += ds q / sqrt(hs)
    Vec want(x.size(), 0.0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                Vec p = probabilities(x, b, h, t), dp(t + 1, 0.0);
                const double* g = d.data() + ((size_t)b * T + t) * C + h * hs;
                double pdp = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    for (int i = 0; i < hs; i++) {
                        dp[t2] += g[i] * x[at(b, t2, 2, h) + i];
                        want[at(b, t2, 2, h) + i] += p[t2] * g[i];
                    }
                    pdp += p[t2] * dp[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    const double ds = p[t2] * (dp[t2] - pdp) / std::sqrt((double)hs);
                    for (int i = 0; i < hs; i++) {
                        want[at(b, t, 0, h) + i] += ds * x[at(b, t2, 1, h) + i];
                        want[at(b, t2, 1, h) + i] += ds * x[at(b, t, 0, h) + i];
                    }
                }
            }
    expect_close("attention dqkv", dqkv, want, 1e-6, 1e-6);
    expect_close("attention dqkv vs finite differences", dqkv, numeric_grad(reference, x, d), 1e-6, 1e-6);
}

// ----------------------------------------------------------------------------
// The tensor-core attention kernels' schedule (kernels/attention_tiles.h), replayed on the host:
// the same blocks, warps and tiles in the same order, the same skips and masks, the same online
// softmax arithmetic, over keys and queries past T that the kernels see as rows of zeros; in
// fp32, against the CPU attention. A wrong loop bound, skip or mask leaves out or lets in a
// (query, key) pair, and the sums no longer match.

struct AttentionInputs {
    int B, T, C, NH, hs;
    std::vector<float> qkv, dout;
    // row t of part (0 q, 1 k, 2 v) of head h, or zeros past T (as the kernels load it)
    std::vector<float> zeros;
    const float* row(int b, int t, int part, int h) const {
        return t < T ? qkv.data() + ((size_t)b * T + t) * 3 * C + part * C + h * hs : zeros.data();
    }
    const float* dout_row(int b, int t, int h) const {
        return t < T ? dout.data() + ((size_t)b * T + t) * C + h * hs : zeros.data();
    }
};
float dot(const float* a, const float* b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

template <class F>
void replay_forward(const AttentionInputs& in, std::vector<float>* out, std::vector<float>* lse) {
    const int T = in.T, hs = in.hs, BK = F::key_tile;
    const float sl2 = attn::scale_log2(hs);
    out->assign((size_t)in.B * T * in.C, 0.0f);
    lse->assign((size_t)in.B * in.NH * T, 0.0f);
    for (int b = 0; b < in.B; b++)
        for (int h = 0; h < in.NH; h++)
            for (int q0 = 0; q0 < T; q0 += F::query_rows) {
                const int tiles = attn::key_tiles_seen(q0, F::query_rows, T, BK);
                for (int w = 0; w < F::warps; w++) {
                    const int wq0 = q0 + w * F::rows_per_warp, wq_last = wq0 + F::rows_per_warp - 1;
                    for (int q = wq0; q <= wq_last && q < T; q++) {  // rows past T are never stored
                        float m = -INFINITY, l = 0.0f;
                        std::vector<float> o(hs, 0.0f);
                        for (int j = 0; j < tiles; j++) {
                            const int k0 = j * BK;
                            if (attn::tile_all_masked(wq_last, k0)) continue;
                            const bool mask = attn::tile_needs_mask(wq0, k0 + BK - 1);
                            std::vector<float> x(BK);
                            float mx = m;
                            for (int c = 0; c < BK; c++) {
                                x[c] = dot(in.row(b, q, 0, h), in.row(b, k0 + c, 1, h), hs) * sl2;
                                if (mask && !attn::key_visible(q, k0 + c)) x[c] = -INFINITY;
                                mx = std::max(mx, x[c]);
                            }
                            const float alpha = attn::rescale_factor(m, mx);
                            m = mx;
                            float sum = 0.0f;
                            for (float& v : o) v *= alpha;
                            for (int c = 0; c < BK; c++) {
                                const float p = attn::softmax_term(x[c], mx);
                                sum += p;
                                const float* v = in.row(b, k0 + c, 2, h);
                                for (int i = 0; i < hs; i++) o[i] += p * v[i];
                            }
                            l = l * alpha + sum;
                        }
                        for (int i = 0; i < hs; i++) (*out)[((size_t)b * T + q) * in.C + h * hs + i] = o[i] / l;
                        (*lse)[((size_t)b * in.NH + h) * T + q] = attn::log_sum_exp(m, l);
                    }
                }
            }
}

// dqkv from the kernels' two backward schedules: key blocks for dK and dV, query blocks for dQ
template <class KV, class Q>
void replay_backward(const AttentionInputs& in, const std::vector<float>& out, const std::vector<float>& lse,
                     std::vector<float>* dqkv) {
    const int T = in.T, hs = in.hs, C = in.C;
    const float sl2 = attn::scale_log2(hs), scale = 1.0f / std::sqrt((float)hs);
    dqkv->assign((size_t)in.B * T * 3 * C, 0.0f);
    for (int b = 0; b < in.B; b++)
        for (int h = 0; h < in.NH; h++) {
            const size_t bh = ((size_t)b * in.NH + h) * T;
            auto lse2 = [&](int q) { return q < T ? lse[bh + q] * attn::kLog2e : INFINITY; };
            auto delta = [&](int q) {
                return q < T ? dot(in.dout_row(b, q, h), out.data() + ((size_t)b * T + q) * C + h * hs, hs) : 0.0f;
            };
            auto grad = [&](int part, int t) { return dqkv->data() + ((size_t)b * T + t) * 3 * C + part * C + h * hs; };
            for (int k0 = 0; k0 < T; k0 += KV::key_rows)
                for (int w = 0; w < KV::warps; w++) {
                    const int wk0 = k0 + w * KV::keys_per_warp;
                    for (int i = attn::first_query_tile(k0, KV::query_tile); i < attn::query_tiles(T, KV::query_tile); i++) {
                        const int q0 = i * KV::query_tile;
                        if (attn::tile_all_masked(q0 + KV::query_tile - 1, wk0)) continue;
                        const bool mask = attn::tile_needs_mask(q0, wk0 + KV::keys_per_warp - 1);
                        for (int k = wk0; k < wk0 + KV::keys_per_warp && k < T; k++)
                            for (int q = q0; q < q0 + KV::query_tile; q++) {
                                float p = attn::prob_from_lse(dot(in.row(b, k, 1, h), in.row(b, q, 0, h), hs) * sl2, lse2(q));
                                if (mask && !attn::key_visible(q, k)) p = 0.0f;
                                const float ds = attn::softmax_grad(p, dot(in.row(b, k, 2, h), in.dout_row(b, q, h), hs), delta(q));
                                for (int d = 0; d < hs; d++) {
                                    grad(2, k)[d] += p * in.dout_row(b, q, h)[d];
                                    grad(1, k)[d] += ds * scale * in.row(b, q, 0, h)[d];
                                }
                            }
                    }
                }
            for (int q0 = 0; q0 < T; q0 += Q::query_rows) {
                const int tiles = attn::key_tiles_seen(q0, Q::query_rows, T, Q::key_tile);
                for (int w = 0; w < Q::warps; w++) {
                    const int wq0 = q0 + w * Q::rows_per_warp, wq_last = wq0 + Q::rows_per_warp - 1;
                    for (int j = 0; j < tiles; j++) {
                        const int k0 = j * Q::key_tile;
                        if (attn::tile_all_masked(wq_last, k0)) continue;
                        const bool mask = attn::tile_needs_mask(wq0, k0 + Q::key_tile - 1);
                        for (int q = wq0; q <= wq_last && q < T; q++)
                            for (int k = k0; k < k0 + Q::key_tile; k++) {
                                float p = attn::prob_from_lse(dot(in.row(b, q, 0, h), in.row(b, k, 1, h), hs) * sl2, lse2(q));
                                if (mask && !attn::key_visible(q, k)) p = 0.0f;
                                const float ds = attn::softmax_grad(p, dot(in.dout_row(b, q, h), in.row(b, k, 2, h), hs), delta(q));
                                for (int d = 0; d < hs; d++) grad(0, q)[d] += ds * scale * in.row(b, k, 1, h)[d];
                            }
                    }
                }
            }
        }
}

// a schedule's replayed forward (and its log-sum-exp) and backward (replay_backward_of(in, out,
// lse, &dqkv)) against the CPU attention, on inputs from seed
template <class Forward, class ReplayBackward>
void check_replay(int T, uint32_t seed, const ReplayBackward& replay_backward_of) {
    AttentionInputs in{2, T, 16, 2, 8, random_floats((size_t)2 * T * 3 * 16, seed + T, -2.0f, 2.0f),
                       random_floats((size_t)2 * T * 16, seed + 10 + T), std::vector<float>(8, 0.0f)};
    std::vector<float> out, lse, dqkv, want_out((size_t)in.B * T * in.C), att(cpu::attention_saved_floats(in.B, T, in.NH));
    std::vector<float> want_dqkv(in.qkv.size());
    replay_forward<Forward>(in, &out, &lse);
    cpu::attention_forward(want_out.data(), att.data(), in.qkv.data(), in.B, T, in.C, in.NH);
    EXPECT_LE(tolerance_ratio(out.data(), want_out.data(), out.size(), 1e-5, 1e-5, "replayed forward"), 1.0);
    // lse: the first probability of each row, exp(s_0 * scale - lse), is the CPU's
    std::vector<float> p0(lse.size()), want_p0(lse.size());
    for (int b = 0; b < in.B; b++)
        for (int h = 0; h < in.NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t r = ((size_t)b * in.NH + h) * T + t;
                p0[r] = std::exp(dot(in.row(b, t, 0, h), in.row(b, 0, 1, h), in.hs) / std::sqrt((float)in.hs) - lse[r]);
                want_p0[r] = att[r * T];
            }
    EXPECT_LE(tolerance_ratio(p0.data(), want_p0.data(), p0.size(), 1e-5, 1e-6, "replayed log-sum-exp"), 1.0);
    replay_backward_of(in, want_out, lse, &dqkv);
    cpu::attention_backward(want_dqkv.data(), in.dout.data(), in.qkv.data(), att.data(), in.B, T, in.C, in.NH);
    EXPECT_LE(tolerance_ratio(dqkv.data(), want_dqkv.data(), dqkv.size(), 1e-4, 1e-5, "replayed backward"), 1.0);
}

template <int HS>
void check_attention_replay(int T) {
    using Tiles = attn::FlashTiles<HS>;
    SCOPED_TRACE(testing::Message() << "tile shapes of hs " << HS << ", T=" << T);
    check_replay<typename Tiles::Forward>(T, 70, [](const AttentionInputs& in, const std::vector<float>& out, const std::vector<float>& lse,
                                                    std::vector<float>* dqkv) {
        replay_backward<typename Tiles::BackwardKV, typename Tiles::BackwardQ>(in, out, lse, dqkv);
    });
}

TEST(AttentionTiles, ReplayedScheduleIsCpuAttention) {
    // one row, a tile's edges, several tiles, not a multiple of any tile
    for (int T : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 257}) {
        check_attention_replay<64>(T);
        check_attention_replay<128>(T);
    }
}

// ----------------------------------------------------------------------------
// The Hopper kernels' schedule (kernels/attention_tiles.h's HopperTiles): the forward and the
// dK/dV sums replayed as above; dQ as its ordered accumulation sums it, key blocks from the
// highest down, against the CPU attention.

template <class Bw>
void replay_hopper_dq(const AttentionInputs& in, const std::vector<float>& out, const std::vector<float>& lse,
                      std::vector<float>* dqkv) {
    const int T = in.T, hs = in.hs, C = in.C, BQ = Bw::query_tile, BKV = Bw::key_rows;
    const float sl2 = attn::scale_log2(hs), scale = 1.0f / std::sqrt((float)hs);
    const int key_blocks = (T + BKV - 1) / BKV;
    for (int b = 0; b < in.B; b++)
        for (int h = 0; h < in.NH; h++) {
            const size_t bh = ((size_t)b * in.NH + h) * T;
            for (int i = 0; i < attn::query_tiles(T, BQ); i++) {
                const int q0 = i * BQ, top = attn::dq_last_key_block(i, BQ, BKV);
                std::vector<float> accumulator((size_t)BQ * hs, 0.0f);
                for (int n = top; n >= 0; n--) {
                    ASSERT_LT(n, key_blocks);
                    // key block n visits tile i (its loop runs from its first query tile to the last)
                    ASSERT_LE(attn::first_query_tile(n * BKV, BQ), i);
                    std::vector<float> part((size_t)BQ * hs, 0.0f);
                    for (int q = q0; q < q0 + BQ; q++) {
                        const float lse2 = q < T ? lse[bh + q] * attn::kLog2e : INFINITY;
                        const float delta = q < T ? dot(in.dout_row(b, q, h), out.data() + ((size_t)b * T + q) * C + h * hs, hs) : 0.0f;
                        for (int k = n * BKV; k < n * BKV + BKV; k++) {
                            float p = attn::prob_from_lse(dot(in.row(b, k, 1, h), in.row(b, q, 0, h), hs) * sl2, lse2);
                            if (!attn::key_visible(q, k)) p = 0.0f;
                            const float ds = attn::softmax_grad(p, dot(in.row(b, k, 2, h), in.dout_row(b, q, h), hs), delta);
                            for (int d = 0; d < hs; d++) part[(size_t)(q - q0) * hs + d] += ds * in.row(b, k, 1, h)[d];
                        }
                    }
                    for (size_t e = 0; e < part.size(); e++) accumulator[e] = n == top ? part[e] : accumulator[e] + part[e];
                }
                for (int q = q0; q < q0 + BQ && q < T; q++)
                    for (int d = 0; d < hs; d++)
                        (*dqkv)[((size_t)b * T + q) * 3 * C + h * hs + d] = accumulator[(size_t)(q - q0) * hs + d] * scale;
            }
        }
}

template <int HS>
void check_hopper_attention_replay(int T) {
    using Tiles = attn::HopperTiles<HS>;
    SCOPED_TRACE(testing::Message() << "Hopper tile shapes of hs " << HS << ", T=" << T);
    check_replay<typename Tiles::Forward>(T, 170, [](const AttentionInputs& in, const std::vector<float>& out, const std::vector<float>& lse,
                                                     std::vector<float>* dqkv) {
        // dK and dV from the key blocks' sums (replay_backward's; its dQ overwritten), dQ from the ordered accumulation
        using Bw = typename Tiles::Backward;
        replay_backward<Bw, attn::BackwardQTiles<HS, 1, 16>>(in, out, lse, dqkv);
        replay_hopper_dq<Bw>(in, out, lse, dqkv);
    });
}

TEST(AttentionTiles, ReplayedHopperScheduleIsCpuAttention) {
    for (int T : {1, 63, 64, 65, 127, 128, 129, 200, 257, 300}) {
        check_hopper_attention_replay<64>(T);
        check_hopper_attention_replay<128>(T);
    }
}

// The Hopper backward's blocks, run one step at a time in a random order with a few resident
// at once (launched in grid order, the highest key block of a head first): every block finishes
// (the counters never wait on a block not yet launched), and each query tile's parts are added
// by exactly the key blocks that visit it, once each, from the highest down: the same order,
// whatever the timing.
void check_dq_order(int T, int BQ, int BKV, int heads, int resident, uint32_t seed) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " query tile " << BQ << " key rows " << BKV << ", " << resident << " resident");
    const int tiles = attn::query_tiles(T, BQ), key_blocks = (T + BKV - 1) / BKV;
    struct Block {
        int head, key_block, next_tile;
    };
    std::vector<Block> grid;  // launch order: blockIdx.x within a head, key block gridDim.x - 1 - x
    for (int hd = 0; hd < heads; hd++)
        for (int x = 0; x < key_blocks; x++) {
            const int n = key_blocks - 1 - x;
            grid.push_back({hd, n, attn::first_query_tile(n * BKV, BQ)});
        }
    std::vector<uint32_t> counter((size_t)heads * tiles, 0);
    std::vector<std::vector<int>> adders((size_t)heads * tiles);
    std::vector<Block> running;
    size_t launched = 0;
    std::mt19937 rng(seed);
    while (launched < grid.size() || !running.empty()) {
        while (running.size() < (size_t)resident && launched < grid.size()) running.push_back(grid[launched++]);
        std::vector<size_t> ready;  // blocks whose next add may go now
        for (size_t r = 0; r < running.size(); r++) {
            const Block& blk = running[r];
            const int top = attn::dq_last_key_block(blk.next_tile, BQ, BKV);
            if (counter[(size_t)blk.head * tiles + blk.next_tile] == (uint32_t)attn::dq_adds_before(blk.key_block, top)) ready.push_back(r);
        }
        ASSERT_FALSE(ready.empty()) << "deadlock: every resident block waits";
        Block& blk = running[ready[rng() % ready.size()]];
        const size_t at = (size_t)blk.head * tiles + blk.next_tile;
        adders[at].push_back(blk.key_block);
        counter[at]++;
        if (++blk.next_tile == tiles) running.erase(running.begin() + (&blk - running.data()));
    }
    for (int hd = 0; hd < heads; hd++)
        for (int i = 0; i < tiles; i++) {
            std::vector<int> want;  // the key blocks whose loop visits tile i, highest first
            for (int n = key_blocks - 1; n >= 0; n--)
                if (attn::first_query_tile(n * BKV, BQ) <= i) want.push_back(n);
            EXPECT_EQ(adders[(size_t)hd * tiles + i], want) << "tile " << i;
            EXPECT_EQ(want.front(), attn::dq_last_key_block(i, BQ, BKV));
        }
}

TEST(AttentionTiles, HopperDqOrderFinishesAndIsFixed) {
    for (int T : {1, 64, 65, 128, 129, 1000, 1024})
        for (int resident : {1, 2, 3, 7, 132})
            for (uint32_t seed : {1u, 2u, 3u}) {
                check_dq_order(T, 64, 128, 3, resident, seed);
                check_dq_order(T, 128, 128, 2, resident, seed);
            }
}

// ----------------------------------------------------------------------------
// The Hopper kernels' shared-memory layouts (kernels/wgmma_layout.h) against a model of the
// hardware written from the PTX ISA and CUTLASS's documentation of the canonical layouts, not
// from wgmma_layout.h: the bulk tensor copy's 128-byte swizzle, the descriptor's addressing of
// K-major and MN-major operands, stmatrix, and the accumulator and A-operand fragments. Every
// product the kernels issue is emulated through the model (each thread's registers computed from
// what the descriptors point at) and compared with the product of the matrices as loaded. The
// values are small integers, so the sums are exact and the comparisons too.

namespace hw {
// TMA, SWIZZLE_128B, box rows of 128 bytes: 16-byte chunk c of box row r lands at chunk c ^ (r % 8)
// of its row (the box starts on a 1024-byte boundary); a tile of 64 * blocks columns is `blocks`
// boxes of `rows` rows each, one after the other
size_t tma_byte(int rows, int r, int c) {
    const int box = c / 64, byte = (c % 64) * 2;
    return (size_t)box * rows * 128 + r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
}
struct Desc {
    uint32_t start, leading, stride;  // bytes
    int swizzle;                      // 1: 128 bytes
};
Desc decode(uint64_t d) {
    return {(uint32_t)(d & 0x3FFF) << 4, (uint32_t)((d >> 16) & 0x3FFF) << 4, (uint32_t)((d >> 32) & 0x3FFF) << 4, (int)(d >> 62)};
}
// the byte a wgmma reads for element (mn, k) of an operand (k < 16), in 16-byte units per
// CUTLASS's canonical forms for 16-bit types and 128-byte swizzling:
//   K-major   ((8, m), 2) : ((8, SBO), 1)         mn: 8 rows 128 bytes apart, groups SBO apart
//   MN-major  ((8, m), (8, k)) : ((1, LBO), (8, SBO))  mn: 8 chunks, then LBO; k: rows, then SBO
// then the swizzle, on the address bits: bits 4-6 ^= bits 7-9
size_t operand_byte(uint64_t desc, bool mn_major, int mn, int k) {
    const Desc d = decode(desc);
    EXPECT_EQ(d.swizzle, 1);
    size_t a;
    if (!mn_major) a = d.start + (mn % 8) * 128 + (mn / 8) * d.stride + (k / 8) * 16 + (k % 8) * 2;
    else a = d.start + (mn % 8) * 2 + ((mn / 8) % 8) * 16 + (mn / 64) * d.leading + (k % 8) * 128 + (k / 8) * d.stride;
    return a ^ (((a >> 7) & 7) << 4);
}
// accumulators of an m64nN product (PTX ISA, "wgmma .m64nNk16 register fragment layout for
// accumulator matrix D"): warp w rows 16w..; per 8 columns, {d0, d1} at (lane / 4, 2 (lane % 4) + {0, 1}), {d2, d3} 8 rows lower
int acc_row(int tid, int i) { return 16 * (tid / 32) + (tid % 32) / 4 + ((i % 4) >= 2 ? 8 : 0); }
int acc_col(int tid, int i) { return 8 * (i / 4) + 2 * (tid % 4) + i % 2; }
// A from registers, one k-slice (16 columns): registers {a0, a1, a2, a3} = (row, cols 2t..),
// (row + 8, ...), (row, cols 2t + 8..), (row + 8, cols 2t + 8..)
int a_row(int tid, int j) { return 16 * (tid / 32) + (tid % 32) / 4 + (j % 2) * 8; }
int a_col(int tid, int j, int e) { return (j / 2) * 8 + 2 * (tid % 4) + e; }
}  // namespace hw

using Smem = std::vector<float>;  // bf16 elements by byte offset / 2
std::vector<float> small_ints(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = (float)((int)(rng() % 9) - 4);
    return v;
}
// a rows x cols row-major matrix as the bulk copy loads it
Smem load_tile(const std::vector<float>& m, int rows, int cols) {
    Smem s((size_t)rows * cols, NAN);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) s[hw::tma_byte(rows, r, c) / 2] = m[(size_t)r * cols + c];
    return s;
}
// D (64 x N) of one warpgroup thread's registers, through the model: A(m, k) and B(k, n) read
// from shared memory with the descriptors of each k-slice, or A from registers via a(kk, tid, j, e)
template <class A>
std::vector<float> emulate(int N, int k_slices, const A& a, const Smem& b_smem, const std::function<uint64_t(int)>& b_desc,
                           bool b_mn_major, int tid) {
    std::vector<float> d(N / 2, 0.0f);
    for (int i = 0; i < N / 2; i++)
        for (int kk = 0; kk < k_slices; kk++)
            for (int k = 0; k < 16; k++) d[i] += a(kk, hw::acc_row(tid, i), k) * b_smem[hw::operand_byte(b_desc(kk), b_mn_major, hw::acc_col(tid, i), k) / 2];
    return d;
}
// want (rows x N, row-major) against every thread's emulated registers
void expect_product(const char* what, int N, const std::function<std::vector<float>(int)>& registers_of, const std::vector<float>& want) {
    int wrong = 0;
    for (int tid = 0; tid < 128; tid++) {
        const std::vector<float> d = registers_of(tid);
        for (int i = 0; i < N / 2; i++)
            if (d[i] != want[(size_t)wgmma::acc_row(tid, i) * N + wgmma::acc_col(tid, i)]) wrong++;
    }
    EXPECT_EQ(wrong, 0) << what << ": registers holding the wrong element of the product";
}
// the product a (M x K) b (K x N), row-major, b given as rows of K (transposed) or of N
std::vector<float> product(const std::vector<float>& a, int M, int K, int a_ld, int a_col0, const std::vector<float>& b, int N, bool b_rows_are_n,
                           int b_ld, int b_off_k, int b_off_n) {
    std::vector<float> c((size_t)M * N, 0.0f);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                c[(size_t)m * N + n] += a[(size_t)m * a_ld + a_col0 + k] *
                                        (b_rows_are_n ? b[(size_t)(b_off_n + n) * b_ld + b_off_k + k] : b[(size_t)(b_off_k + k) * b_ld + b_off_n + n]);
    return c;
}

TEST(WgmmaLayout, FragmentsAndTheirOperandForm) {
    for (int tid = 0; tid < 128; tid++)
        for (int i = 0; i < 64; i++) {
            ASSERT_EQ(wgmma::acc_row(tid, i), hw::acc_row(tid, i));
            ASSERT_EQ(wgmma::acc_col(tid, i), hw::acc_col(tid, i));
            // accumulators 2j, 2j + 1 are register j % 4 of k-slice j / 4 of the next A operand
            if (i % 2 == 0) {
                const int j = i / 2;
                ASSERT_EQ(hw::a_row(tid, j % 4), wgmma::acc_row(tid, i));
                for (int e = 0; e < 2; e++) ASSERT_EQ(16 * (j / 4) + hw::a_col(tid, j % 4, e), wgmma::acc_col(tid, i + e));
            }
        }
    for (int r = 0; r < 128; r++)
        for (int c = 0; c < 128; c++) ASSERT_EQ(wgmma::tile_offset(128, r, c), hw::tma_byte(128, r, c));
}

// Every product of the forward (S = Q K^T; O += P V, P from S's registers) and the backward
// (S^T = K Q^T, dP^T = V dO^T; dV += P^T dO, dK += dS^T Q; dQ = dS K, dS^T stored by stmatrix)
template <int HS>
void check_hopper_products() {
    SCOPED_TRACE(testing::Message() << "hs " << HS);
    using F = typename attn::HopperTiles<HS>::Forward;
    using Bw = typename attn::HopperTiles<HS>::Backward;
    const int BQ = F::query_rows, BK = F::key_tile;
    // forward: Q (BQ x HS), K and V (BK x HS) as loaded
    const std::vector<float> q = small_ints((size_t)BQ * HS, 1), k = small_ints((size_t)BK * HS, 2), v = small_ints((size_t)BK * HS, 3);
    const Smem q_s = load_tile(q, BQ, HS), k_s = load_tile(k, BK, HS), v_s = load_tile(v, BK, HS);
    for (int consumer = 0; consumer < 2; consumer++) {
        const int row0 = 64 * consumer;
        const std::vector<float> s_rows = product(std::vector<float>(q.begin() + (size_t)row0 * HS, q.end()), 64, HS, HS, 0, k, BK, true, HS, 0, 0);
        auto q_a = [&](int kk, int m, int kx) { return q_s[hw::operand_byte(wgmma::k_major(0, BQ, row0, 16 * kk), false, m, kx) / 2]; };
        expect_product("S = Q K^T", BK, [&](int tid) {
            return emulate(BK, HS / 16, q_a, k_s, [&](int kk) { return wgmma::k_major(0, BK, 0, 16 * kk); }, false, tid);
        }, s_rows);
        // O = P V with P = S's registers in operand form (here P = S, exact small integers)
        const std::vector<float> o = product(s_rows, 64, BK, BK, 0, v, HS, false, HS, 0, 0);
        expect_product("O += P V", HS, [&](int tid) {
            // the thread's A registers: accumulators 2j, 2j+1 -> register j % 4 of slice j / 4
            auto p_a = [&](int kk, int m, int kx) { return s_rows[(size_t)m * BK + 16 * kk + kx]; };
            // every (m, k) a thread's A registers name must be the product's (row, col) it holds
            for (int j = 0; j < BK / 4; j++)
                for (int e = 0; e < 2; e++)
                    EXPECT_EQ(hw::a_row(tid, j % 4) * BK + 16 * (j / 4) + hw::a_col(tid, j % 4, e),
                              wgmma::acc_row(tid, 2 * j + e) * BK + wgmma::acc_col(tid, 2 * j + e));
            return emulate(HS, BK / 16, p_a, v_s, [&](int kk) { return wgmma::mn_major(0, BK, 16 * kk, 0); }, true, tid);
        }, o);
    }
    // backward: K, V (128 x HS), Q, dO (query_tile x HS)
    const int BKV = Bw::key_rows, BQb = Bw::query_tile;
    const std::vector<float> kb = small_ints((size_t)BKV * HS, 4), vb = small_ints((size_t)BKV * HS, 5);
    const std::vector<float> qb = small_ints((size_t)BQb * HS, 6), dob = small_ints((size_t)BQb * HS, 7);
    const Smem kb_s = load_tile(kb, BKV, HS), vb_s = load_tile(vb, BKV, HS), qb_s = load_tile(qb, BQb, HS), dob_s = load_tile(dob, BQb, HS);
    const std::vector<float> ds = small_ints((size_t)BKV * BQb, 8);  // dS^T (keys x queries), as the consumers hold it
    // dS^T as stmatrix stores it: each consumer's warp w, k-slice m; lane gives row stmatrix_row,
    // columns stmatrix_col.. of the warp's 16 x 16 block; register j of lane L holds (L / 4 + 8 (j & 1),
    // 2 (L % 4) + 8 (j >> 1) + {0, 1}) of the block (an 8x8 matrix each)
    Smem ds_s((size_t)BKV * BQb, NAN);
    for (int consumer = 0; consumer < 2; consumer++)
        for (int w = 0; w < 4; w++)
            for (int m = 0; m < BQb / 16; m++)
                for (int lane = 0; lane < 32; lane++)
                    for (int j = 0; j < 4; j++) {
                        // matrix j's row (lane % 8) is at the address lane 8 j + lane % 8 gives
                        const int giver = 8 * j + lane % 8;
                        const int r = 64 * consumer + 16 * w + wgmma::stmatrix_row(giver), c = 16 * m + wgmma::stmatrix_col(giver);
                        // the elements it receives: register j of lanes 4 (lane % 8) .. + 3
                        for (int t = 0; t < 4; t++)
                            for (int e = 0; e < 2; e++) {
                                const int from = 4 * (lane % 8) + t, tid = 32 * w + from, reg = 2 * (4 * m + j) + e;  // accumulator index
                                const int want_r = 64 * consumer + wgmma::acc_row(tid, reg), want_c = wgmma::acc_col(tid, reg);
                                ds_s[(wgmma::tile_offset(BKV, r, c) + 4 * t + 2 * e) / 2] = ds[(size_t)want_r * BQb + want_c];
                                if (lane % 8 == 0 && t == 0 && e == 0) {
                                    ASSERT_EQ(want_r, r) << "stmatrix row";
                                    ASSERT_EQ(want_c, c) << "stmatrix column";
                                }
                            }
                    }
    for (float x : ds_s) ASSERT_FALSE(std::isnan(x)) << "an element of the dS^T tile never stored";
    for (int r = 0; r < BKV; r++)
        for (int c = 0; c < BQb; c++) ASSERT_EQ(ds_s[wgmma::tile_offset(BKV, r, c) / 2], ds[(size_t)r * BQb + c]);
    for (int consumer = 0; consumer < 2; consumer++) {
        const int key0 = 64 * consumer;
        auto own = [&](const Smem& tile) {
            return [&, key0](int kk, int m, int kx) { return tile[hw::operand_byte(wgmma::k_major(0, BKV, key0, 16 * kk), false, m, kx) / 2]; };
        };
        const std::vector<float> k_rows(kb.begin() + (size_t)key0 * HS, kb.begin() + (size_t)(key0 + 64) * HS);
        expect_product("S^T = K Q^T", BQb, [&](int tid) {
            return emulate(BQb, HS / 16, own(kb_s), qb_s, [&](int kk) { return wgmma::k_major(0, BQb, 0, 16 * kk); }, false, tid);
        }, product(k_rows, 64, HS, HS, 0, qb, BQb, true, HS, 0, 0));
        const std::vector<float> pt(ds.begin() + (size_t)key0 * BQb, ds.begin() + (size_t)(key0 + 64) * BQb);  // any 64 x BQ
        expect_product("dV += P^T dO", HS, [&](int tid) {
            auto a = [&](int kk, int m, int kx) { return pt[(size_t)m * BQb + 16 * kk + kx]; };
            return emulate(HS, BQb / 16, a, dob_s, [&](int kk) { return wgmma::mn_major(0, BQb, 16 * kk, 0); }, true, tid);
        }, product(pt, 64, BQb, BQb, 0, dob, HS, false, HS, 0, 0));
        // dQ (64 queries x 64 columns 64 cb..) = dS (queries x keys) K over keys dq_keys0.. (the kernel's choice)
        const bool split_keys = HS == 64;
        const int cb = split_keys ? 0 : consumer, keys0 = split_keys ? key0 : 0, keys = split_keys ? 64 : BKV;
        std::vector<float> dsq((size_t)BQb * BKV);  // dS = (dS^T)^T
        for (int r = 0; r < BKV; r++)
            for (int c = 0; c < BQb; c++) dsq[(size_t)c * BKV + r] = ds[(size_t)r * BQb + c];
        expect_product("dQ = dS K", 64, [&](int tid) {
            auto a = [&](int kk, int m, int kx) { return ds_s[hw::operand_byte(wgmma::mn_major(0, BKV, keys0 + 16 * kk, 0), true, m, kx) / 2]; };
            return emulate(64, keys / 16, a, kb_s, [&](int kk) { return wgmma::mn_major(0, BKV, keys0 + 16 * kk, 64 * cb); }, true, tid);
        }, product(dsq, 64, keys, BKV, keys0, kb, 64, false, HS, keys0, 64 * cb));
    }
}

TEST(WgmmaLayout, EveryProductReadsWhatWasLoaded) {
    check_hopper_products<64>();
    check_hopper_products<128>();
}

// dQ's staging tile: a permutation of each row, the kernel's per-register form of it the same,
// and each float2 store of a warp's accumulators conflict-free in each half-warp (32 banks)
TEST(WgmmaLayout, DqStagingIsAConflictFreePermutation) {
    for (int hs : {64, 128}) {
        SCOPED_TRACE(testing::Message() << "hs " << hs);
        for (int row = 0; row < 64; row++) {
            std::vector<int> seen(hs, 0);
            for (int col = 0; col < hs; col++) {
                const int at = wgmma::dq_stage_index(hs, row, col);
                ASSERT_GE(at, row * hs);
                ASSERT_LT(at, (row + 1) * hs);
                seen[at - row * hs]++;
            }
            for (int x : seen) ASSERT_EQ(x, 1);
        }
        for (int cb = 0; cb < hs / 64; cb++)
            for (int buf = 0; buf < 2; buf++)
                for (int tid = 0; tid < 128; tid++) {
                    const int first = buf * 64 * hs + wgmma::dq_stage_index(hs, wgmma::acc_row(tid, 0), 64 * cb + wgmma::acc_col(tid, 0));
                    for (int i = 0; i < 32; i += 2)
                        ASSERT_EQ(wgmma::dq_stage_of(first, hs, i),
                                  buf * 64 * hs + wgmma::dq_stage_index(hs, wgmma::acc_row(tid, i), 64 * cb + wgmma::acc_col(tid, i)))
                            << "tid " << tid << " i " << i;
                }
        for (int w = 0; w < 4; w++)
            for (int i = 0; i < 32; i += 2)
                for (int half = 0; half < 2; half++) {
                    std::vector<int> banks(32, 0);
                    for (int lane = 16 * half; lane < 16 * half + 16; lane++) {
                        const int at = wgmma::dq_stage_index(hs, wgmma::acc_row(32 * w + lane, i), wgmma::acc_col(32 * w + lane, i));
                        banks[at % 32]++;
                        banks[(at + 1) % 32]++;
                    }
                    for (int x : banks) ASSERT_EQ(x, 1) << "warp " << w << " register " << i;
                }
    }
}

// The attention check of test_kernels_cuda.cu (closeness with the floor of attention_scales), on
// what the first GPU run recorded (../shared/gpu_baseline.md): at T = 1 the reference dq is exactly
// 0 and a correct kernel gave -8.73e-09 (bf16 build) or up to 5.7e-08 (fp32). A tolerance scaled
// to the reference alone fails them; the floor passes them and still fails a wrong dq (here:
// the softmax's backward without its row term D, which at T = 1 is the whole of dP).
TEST(AttentionTiles, CheckFloorPassesRoundingAndFailsAWrongDq) {
    const int B = 2, T = 1, C = 64, NH = 4, hs = C / NH;
    const float bf16_atol = 5e-2f, bf16_rtol = 3e-2f, fp32_atol = 1e-4f, fp32_rtol = 1e-4f;  // kAttention
    std::vector<float> qkv = random_floats((size_t)B * T * 3 * C, 90, -1.0f, 1.0f), dout = random_floats((size_t)B * T * C, 91, -1.0f, 1.0f);
    std::vector<float> out((size_t)B * T * C), att(cpu::attention_saved_floats(B, T, NH)), dqkv(qkv.size());
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    std::vector<float> want_dq((size_t)B * T * C), wrong_dq(want_dq.size());
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            want_dq[b * C + c] = dqkv[(size_t)b * 3 * C + c];
            const int h = c / hs;  // dq without D: scale * (dout . v) * k
            const float* q = qkv.data() + (size_t)b * 3 * C + h * hs;
            wrong_dq[b * C + c] = dot(dout.data() + (size_t)b * C + h * hs, q + 2 * C, hs) / std::sqrt((float)hs) * q[C + c % hs];
        }
    for (float x : want_dq) ASSERT_EQ(x, 0.0f) << "the reference dq at T = 1 should be exactly 0";
    const float floor = attention_scales(qkv, dout, C).dq;
    const std::vector<float> bf16_got(want_dq.size(), -8.73e-09f), fp32_got(want_dq.size(), 5.7e-08f);
    EXPECT_FALSE(closeness(bf16_got, want_dq, bf16_atol, bf16_rtol).failing.empty()) << "without the floor, rounding fails";
    EXPECT_TRUE(closeness(bf16_got, want_dq, bf16_atol, bf16_rtol, floor).failing.empty());
    EXPECT_TRUE(closeness(fp32_got, want_dq, fp32_atol, fp32_rtol, floor).failing.empty());
    EXPECT_GE(closeness(wrong_dq, want_dq, bf16_atol, bf16_rtol, floor).failing.size(), wrong_dq.size() * 3 / 4)
        << "a wrong dq must fail on most elements";
}

TEST(Ops, FusedClassifier) {
    const int N = 5, V = 11, Vp = 16;
    auto logits = random_floats((size_t)N * Vp, 27, -4.0f, 4.0f);  // padded columns hold values too
    const std::vector<int> targets = {0, 10, 3, 3, 7};
    // loss_i = log sum_{j < V} exp(logit_ij) - logit_i,target_i; columns V..Vp-1 take no part
    auto reference = [&](const Vec& l) {
        Vec loss(N);
        for (int i = 0; i < N; i++) {
            double sum = 0;
            for (int j = 0; j < V; j++) sum += std::exp(l[(size_t)i * Vp + j]);
            loss[i] = std::log(sum) - l[(size_t)i * Vp + targets[i]];
        }
        return loss;
    };
    const Vec x = widen(logits);
    std::vector<float> losses(N), kept = logits;
    cpu::fused_classifier(kept.data(), losses.data(), targets.data(), 0.0f, N, V, Vp);
    expect_close("classifier loss (inference)", losses, reference(x), 1e-6, 1e-6);
    EXPECT_EQ(kept, logits) << "without a gradient the logits are left as they are";

    const float dloss = 1.0f / 7;
    std::vector<float> dlogits = logits;
    cpu::fused_classifier(dlogits.data(), losses.data(), targets.data(), dloss, N, V, Vp);
    expect_close("classifier loss", losses, reference(x), 1e-6, 1e-6);
    // dlogit_ij = dloss (softmax_ij - [j == target_i]) for j < V, 0 in the padding
    Vec want(x.size(), 0.0);
    for (int i = 0; i < N; i++) {
        double sum = 0;
        for (int j = 0; j < V; j++) sum += std::exp(x[(size_t)i * Vp + j]);
        for (int j = 0; j < V; j++) want[(size_t)i * Vp + j] = dloss * (std::exp(x[(size_t)i * Vp + j]) / sum - (j == targets[i]));
    }
    expect_close("classifier dlogits", dlogits, want, 1e-6, 1e-8);
    expect_close("classifier dlogits vs finite differences", dlogits, numeric_grad(reference, x, Vec(N, dloss)), 1e-6, 1e-8);
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++) EXPECT_EQ(dlogits[(size_t)i * Vp + j], 0.0f) << "padded column " << j << " of row " << i;
}

// three tensors of one shard table, weight decay on the first and last, each at its own place
// in the parameter, gradient and state buffers
TEST(Ops, AdamW) {
    const size_t n = 50, P = 100, G = 200;
    auto param = random_floats(P + n, 28), grad = random_floats(G + n, 29), m = random_floats(n, 30, -0.1f, 0.1f),
         v = random_floats(n, 31, 0.0f, 0.01f);
    const std::vector<ShardTensor> table = {{0, 20, P + 30, G + 30, 30, 0, 1}, {20, 10, P + 20, G, 20, 0, 0}, {30, 20, P, G + 10, 0, 0, 1}};
    const AdamWStep s{1e-2f, 0.9f, 0.95f, 1e-6f, 0.1f, 0.5f, 3, 0};
    Vec want_p = widen(param), want_m = widen(m), want_v = widen(v);
    // g = scale grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
    for (const ShardTensor& e : table)
        for (size_t i = 0; i < e.n; i++) {
            const size_t k = e.state_offset + i, p = e.param_offset + i;
            const double g = (double)s.grad_scale * grad[e.grad_offset + i], wd = e.decay ? s.weight_decay : 0.0;
            want_m[k] = (double)s.beta1 * m[k] + (1.0 - s.beta1) * g;
            want_v[k] = (double)s.beta2 * v[k] + (1.0 - s.beta2) * g * g;
            const double mhat = want_m[k] / (1.0 - std::pow((double)s.beta1, s.t)), vhat = want_v[k] / (1.0 - std::pow((double)s.beta2, s.t));
            want_p[p] = param[p] - (double)s.lr * (mhat / (std::sqrt(vhat) + s.eps) + wd * param[p]);
        }
    cpu::adamw_update(param.data(), (float*)nullptr, grad.data(), m.data(), v.data(), table.data(), 3, s);
    expect_close("adamw m", m, want_m, 1e-6, 1e-9);
    expect_close("adamw v", v, want_v, 1e-6, 1e-9);
    expect_close("adamw parameters", param, want_p, 1e-6, 1e-9);
}

// The host update of ZeRO-Offload with bf16 parameters and gradients (uint16_t bits) in one
// staging buffer: master, m and v exactly as the fp32 update makes them from the same gradients;
// the parameters master rounded to one of its two neighbouring bf16 values, up about as often as
// master lies towards the upper one; the random bits follow each element's place in the model
// (here across 2^32, where the hashed index changes its high half), not its place in the table,
// nor the thread count.
TEST(Ops, AdamWBf16ParametersRoundStochastically) {
    const size_t n = 20000, a = 7000;
    auto master = random_floats(n, 40), m = random_floats(n, 42, -0.1f, 0.1f), v = random_floats(n, 43, 0.0f, 0.01f);
    std::vector<uint16_t> grad16(n);
    std::vector<float> grad(n);
    for (size_t i = 0; i < n; i++) {
        grad16[i] = (uint16_t)(0x3c00 + i * 7919 % 0x800);  // 2^-7 .. 2^-5, signs both ways below
        if (i % 3 == 0) grad16[i] |= 0x8000;
        grad[i] = cpu::param_to_float(grad16[i]);
    }
    const uint64_t flat = (1ull << 32) - 5000;  // the first tensor's place: it crosses 2^32
    const std::vector<ShardTensor> table = {{0, a, 0, 0, 0, flat, 1}, {a, n - a, a, a, a, flat + a, 0}};
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3, 1234};
    std::vector<float> want_master = master, want_m = m, want_v = v;
    cpu::adamw_update(want_master.data(), (float*)nullptr, grad.data(), want_m.data(), want_v.data(), table.data(), 2, s);
    auto update = [&](const std::vector<ShardTensor>& t, int threads, std::vector<float>* master_out) {
        std::vector<uint16_t> staging = grad16;
        std::vector<float> mw = master, mm = m, vv = v;
        const int before = omp_get_max_threads();
        omp_set_num_threads(threads);
        cpu::adamw_update(staging.data(), mw.data(), staging.data(), mm.data(), vv.data(), t.data(), (int)t.size(), s);
        omp_set_num_threads(before);
        EXPECT_TRUE(mm == want_m && vv == want_v) << "moments differ from the fp32 update's";
        if (master_out) *master_out = mw;
        return staging;
    };
    std::vector<float> got_master;
    const std::vector<uint16_t> params = update(table, 2, &got_master);
    EXPECT_TRUE(got_master == want_master) << "master differs from the fp32 update's";
    size_t bad = 0, ups = 0, inexact = 0, near_top_up = 0, near_top = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &got_master[i], 4);
        const uint16_t down = (uint16_t)(bits >> 16);
        const uint32_t below = bits & 0xffff;  // how far towards the next bf16, in 1/65536
        bad += params[i] != down && params[i] != down + 1;
        if (below == 0) {
            bad += params[i] != down;
            continue;
        }
        inexact++;
        ups += params[i] == down + 1;
        if (below > 0xe000) near_top++, near_top_up += params[i] == down + 1;
    }
    EXPECT_EQ(bad, 0u) << "a parameter is not master rounded to a neighbouring bf16";
    // with the random bits the GPU's kernel draws for the element (kernels/cuda/common.cuh)
    size_t not_as_gpu = 0;
    for (const ShardTensor& e : table)
        for (size_t i = 0; i < e.n; i++) {
            uint32_t bits;
            memcpy(&bits, &got_master[e.state_offset + i], 4);
            not_as_gpu += params[e.param_offset + i] != bf16_round_stochastic(bits, random_u32(s.seed, rounding_index(e, i)));
        }
    EXPECT_EQ(not_as_gpu, 0u) << "rounded with other random bits than the GPU's kernel";
    EXPECT_GT(ups, inexact * 2 / 5) << "rounds up too rarely";
    EXPECT_LT(ups, inexact * 3 / 5) << "rounds up too often";
    EXPECT_GT(near_top_up, near_top * 4 / 5) << "values just below the next bf16 do not round up mostly";
    // the same elements as three entries in another order (with the decay flags they had)
    const std::vector<ShardTensor> reordered = {{0, n - a, a, a, a, flat + a, 0}, {n - a, 4000, 0, 0, 0, flat, 1},
                                                {n - a + 4000, a - 4000, 4000, 4000, 4000, flat + 4000, 1}};
    EXPECT_TRUE(update(reordered, 2, nullptr) == params) << "rounding depends on the table, not the place in the model";
    EXPECT_TRUE(update(table, 1, nullptr) == params && update(table, 3, nullptr) == params) << "rounding depends on the thread count";
}

TEST(Ops, SumSquares) {
    auto x = random_floats(1001, 32);
    double want = 0;
    for (float v : x) want += (double)v * v;
    EXPECT_NEAR(cpu::sum_squares(x.data(), x.size()), want, 1e-12 * want);
}

// ----------------------------------------------------------------------------
// fp8 (common/fp8.h, kernels/fp8_scaling.h, kernels/cpu/fp8.h) against the formats as defined:
// each code's value from its sign, exponent and mantissa fields, rounding as the nearest of those
// values found by search, the scale by doubling. Exact: every value here is exact in double.

struct Fp8Definition {
    int exponent_bits, mantissa_bits, bias;
    bool ieee_specials;  // e5m2: the top exponent holds infinity and NaNs; e4m3: only S.1111.111, a NaN
};
Fp8Definition definition(Fp8Format f) { return f == Fp8Format::E4M3 ? Fp8Definition{4, 3, 7, false} : Fp8Definition{5, 2, 15, true}; }

double defined_value(uint8_t code, Fp8Format f) {
    const Fp8Definition d = definition(f);
    const int e = (code >> d.mantissa_bits) & ((1 << d.exponent_bits) - 1), m = code & ((1 << d.mantissa_bits) - 1);
    const int top = (1 << d.exponent_bits) - 1;
    double v;
    if (d.ieee_specials && e == top) v = m == 0 ? INFINITY : NAN;
    else if (!d.ieee_specials && e == top && m == (1 << d.mantissa_bits) - 1) v = NAN;
    else if (e == 0) v = std::ldexp((double)m, 1 - d.bias - d.mantissa_bits);
    else v = std::ldexp(1.0 + std::ldexp((double)m, -d.mantissa_bits), e - d.bias);
    return code & 0x80 ? -v : v;
}

// the finite non-negative values and their codes, ascending
std::vector<std::pair<double, uint8_t>> finite_values(Fp8Format f) {
    std::vector<std::pair<double, uint8_t>> v;
    for (int c = 0; c < 128; c++)
        if (std::isfinite(defined_value((uint8_t)c, f))) v.push_back({defined_value((uint8_t)c, f), (uint8_t)c});
    std::sort(v.begin(), v.end());
    return v;
}

// the code of the nearest value, a tie to the even code; beyond the largest finite value (and
// infinities) the largest; NaN 0x7F; the sign kept, at zero too
uint8_t defined_rounding(float x, Fp8Format f) {
    if (std::isnan(x)) return 0x7F;
    const auto values = finite_values(f);
    const double ax = std::fabs((double)x);
    uint8_t code = values.back().second;
    if (ax < values.back().first) {
        size_t hi = 0;
        while (values[hi].first < ax) hi++;
        const size_t lo = values[hi].first == ax ? hi : hi - 1;
        const double below = ax - values[lo].first, above = values[hi].first - ax;
        code = below < above ? values[lo].second : above < below ? values[hi].second : (values[lo].second % 2 == 0 ? values[lo].second : values[hi].second);
    }
    return (uint8_t)(code | (std::signbit(x) ? 0x80 : 0));
}

// the largest 2^k, k in [-126, 126], with amax 2^k <= the largest finite value
double defined_scale(double amax, Fp8Format f) {
    const double largest = finite_values(f).back().first;
    int k = 0;
    while (k < 126 && amax * std::ldexp(1.0, k + 1) <= largest) k++;
    while (k > -126 && amax * std::ldexp(1.0, k) > largest) k--;
    return std::ldexp(1.0, k);
}

const Fp8Format kFp8Formats[] = {Fp8Format::E4M3, Fp8Format::E5M2};
const char* name_of(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

TEST(Fp8, EveryCodeIsItsFormatsValue) {
    for (Fp8Format f : kFp8Formats) {
        int nans = 0;
        for (int c = 0; c < 256; c++) {
            const double want = defined_value((uint8_t)c, f);
            const float got = fp8_to_float((uint8_t)c, f);
            nans += std::isnan(want);
            if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << name_of(f) << " code " << c;
            else EXPECT_EQ(float_bits(got), float_bits((float)want)) << name_of(f) << " code " << c << ": " << got << ", expected " << want;
        }
        EXPECT_EQ(nans, f == Fp8Format::E4M3 ? 2 : 6) << name_of(f);
        EXPECT_EQ(finite_values(f).back().first, fp8_layout(f).largest) << name_of(f);
        EXPECT_EQ(finite_values(f).back().second, fp8_layout(f).largest_code) << name_of(f);
    }
    EXPECT_EQ(fp8_layout(Fp8Format::E4M3).largest, 448.0f);
    EXPECT_EQ(fp8_layout(Fp8Format::E5M2).largest, 57344.0f);
}

// every code back to itself; midpoints between neighbours to the even one, a float either side
// to the nearer; every bf16 (zeros, subnormals, infinities, NaNs, the whole range) and random
// floats as the defined rounding makes them
TEST(Fp8, RoundsToNearestEvenAndSaturates) {
    for (Fp8Format f : kFp8Formats) {
        const auto values = finite_values(f);
        std::vector<float> inputs;
        for (int c = 0; c < 256; c++) {
            const float v = fp8_to_float((uint8_t)c, f);
            if (std::isnan(v)) {
                EXPECT_EQ(fp8_from_float(v, f), 0x7F) << name_of(f) << " NaN code " << c;
            } else if (std::isinf(v)) {
                EXPECT_EQ(fp8_from_float(v, f), (uint8_t)(fp8_layout(f).largest_code | (c & 0x80))) << name_of(f) << " infinity saturates";
            } else {
                EXPECT_EQ(fp8_from_float(v, f), c) << name_of(f) << " code " << c << " (" << v << ") does not round-trip";
            }
        }
        int ties = 0;
        for (size_t i = 0; i + 1 < values.size(); i++)
            for (float sign : {1.0f, -1.0f}) {
                const float mid = sign * (float)((values[i].first + values[i + 1].first) / 2);
                ASSERT_EQ((double)std::fabs(mid), (values[i].first + values[i + 1].first) / 2) << "a midpoint is exact in fp32";
                inputs.insert(inputs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, sign * INFINITY)});
                const uint8_t even = values[i].second % 2 == 0 ? values[i].second : values[i + 1].second;
                EXPECT_EQ(fp8_from_float(mid, f), (uint8_t)(even | (sign < 0 ? 0x80 : 0))) << name_of(f) << " tie at " << mid;
                ties++;
            }
        const float largest = fp8_layout(f).largest;
        for (float big : {largest, std::nextafter(largest, INFINITY), largest * 1.0625f, largest * 2.0f, 3e38f, INFINITY}) {
            EXPECT_EQ(fp8_from_float(big, f), fp8_layout(f).largest_code) << name_of(f) << " " << big;
            EXPECT_EQ(fp8_from_float(-big, f), fp8_layout(f).largest_code | 0x80) << name_of(f) << " " << -big;
        }
        for (uint32_t b = 0; b < 65536; b++) inputs.push_back(bits_float(b << 16));
        std::mt19937 rng(71);
        for (int i = 0; i < 20000; i++)  // 2^-30 .. 2^20 in magnitude, any mantissa, either sign
            inputs.push_back(bits_float((rng() & 0x807fffffu) | (uint32_t)(97 + rng() % 51) << 23));
        int wrong = 0;
        for (float x : inputs) {
            const uint8_t got = fp8_from_float(x, f), want = defined_rounding(x, f);
            if (got != want && ++wrong <= 5) ADD_FAILURE() << name_of(f) << " " << x << " (bits " << std::hex << float_bits(x) << "): code " << (int)got << ", expected " << (int)want << std::dec;
        }
        EXPECT_EQ(wrong, 0) << name_of(f) << ": of " << inputs.size() << " inputs";
        EXPECT_EQ(ties, 2 * (int)(values.size() - 1));
    }
}

TEST(Fp8, ScaleIsTheLargestPowerOfTwoThatFits) {
    std::vector<float> amaxes = {1.0f, 448.0f, 448.00003f, 447.99997f, 57344.0f, 57344.01f, 1e-3f, 3e-20f, 1e30f, 3.4e38f, 1.2e-38f, 1e-40f, 1e-45f};
    std::mt19937 rng(5);
    for (int i = 0; i < 2000; i++) amaxes.push_back(bits_float((rng() & 0x007fffffu) | (uint32_t)(1 + rng() % 254) << 23));
    for (Fp8Format f : kFp8Formats)
        for (float amax : amaxes) {
            const uint32_t bits = abs_bits(amax);
            const float scale = fp8_scale(bits, f);
            EXPECT_EQ((double)scale, defined_scale(amax, f)) << name_of(f) << " amax " << amax;
            EXPECT_EQ(fp8_descale(bits, f) * scale, 1.0f) << name_of(f) << " amax " << amax << ": 1 / scale is not exact";
            EXPECT_FALSE(amax_nonfinite(bits));
        }
    for (Fp8Format f : kFp8Formats)
        for (float amax : {0.0f, INFINITY, NAN}) {
            EXPECT_EQ(fp8_scale(abs_bits(amax), f), 1.0f) << name_of(f) << " amax " << amax;
            EXPECT_EQ(fp8_descale(abs_bits(amax), f), 1.0f) << name_of(f) << " amax " << amax;
            EXPECT_EQ(amax_nonfinite(abs_bits(amax)), amax != 0.0f);
        }
    EXPECT_TRUE(amax_nonfinite(abs_bits(-NAN)) && amax_nonfinite(abs_bits(-INFINITY)));
}

// A tensor's cast: the amax it notes (a NaN or infinity anywhere seen and counted, though the
// values saturate), zeros kept, every value the defined rounding at the defined scale
TEST(Fp8, CastNotesItsAmaxAndSeesNonFiniteValues) {
    for (Fp8Format f : kFp8Formats) {
        Fp8Scale noted{};
        unsigned nonfinite = 0;
        std::vector<float> zeros(64, 0.0f), out(64, 1.0f);
        cpu::fp8_round_trip(out.data(), zeros.data(), zeros.size(), f, &noted, &nonfinite);
        EXPECT_EQ(noted.amax_bits, 0u);
        EXPECT_EQ(noted.descale, 1.0f);
        EXPECT_EQ(out, zeros);
        EXPECT_EQ(nonfinite, 0u);

        std::vector<float> x = random_floats(1000, 9, -3.0f, 3.0f);
        x[17] = -700.0f;  // the amax: a scale below 1 for e4m3
        x[18] = 1e-30f;   // underflows to zero
        cpu::fp8_round_trip(out.data(), x.data(), 64, f, &noted, &nonfinite);  // the first 64 only
        EXPECT_EQ(noted.amax_bits, abs_bits(700.0f));
        const double scale = defined_scale(700.0, f);
        EXPECT_EQ(noted.descale, (float)(1.0 / scale));
        for (size_t i = 0; i < 64; i++)
            EXPECT_EQ(out[i], (float)(defined_value(defined_rounding((float)(x[i] * scale), f), f) / scale)) << name_of(f) << " " << x[i];
        EXPECT_EQ(nonfinite, 0u);

        for (float bad : {INFINITY, -INFINITY, NAN}) {
            std::vector<float> y(x.begin(), x.begin() + 64);
            y[40] = bad;
            nonfinite = 0;
            cpu::fp8_round_trip(out.data(), y.data(), y.size(), f, &noted, &nonfinite);
            EXPECT_EQ(nonfinite, 1u) << name_of(f) << " " << bad << " went unnoticed";
            EXPECT_TRUE(amax_nonfinite(noted.amax_bits));
            if (std::isnan(bad)) EXPECT_TRUE(std::isnan(out[40]));
            else EXPECT_EQ(out[40], std::copysign(fp8_layout(f).largest, bad)) << "saturated at scale 1: it would hide the overflow";
        }
    }
}

// The CPU backend's fp8 matmuls against GEMMs in double of operands rounded here: inputs and
// weights e4m3, output gradients e5m2, each at its tensor's scale; bias gradients of the output
// gradient as it is. Tolerance: fp32 accumulation, (K + 2) u sum |terms| (u = 2^-24; any order
// of summing K products and a bias, or of adding to what dweight held). The operands are rounded
// for real: the unrounded matmul lies outside that tolerance.
TEST(Fp8, EmulatedMatmulsAreGemmsOfRoundedOperands) {
    const int N = 24, C = 32, OC = 48;
    std::vector<float> inp = random_floats((size_t)N * C, 41, -2.0f, 2.0f), w = random_floats((size_t)OC * C, 42, -0.05f, 0.05f),
                       bias = random_floats(OC, 43), dout = random_floats((size_t)N * OC, 44, -1e-3f, 1e-3f);
    inp[5] = 900.0f;  // an outlier row: a scale below 1
    auto rounded = [](const std::vector<float>& x, Fp8Format f) {
        double amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs((double)v));
        const double s = defined_scale(amax, f);
        Vec q(x.size());
        for (size_t i = 0; i < x.size(); i++) q[i] = defined_value(defined_rounding((float)(x[i] * s), f), f) / s;
        return q;
    };
    const Vec qi = rounded(inp, Fp8Format::E4M3), qw = rounded(w, Fp8Format::E4M3), qd = rounded(dout, Fp8Format::E5M2);
    // d (rows x cols) = a (rows x K, stride sa) . b, with tolerance (K + 2) u sum |terms|
    auto product = [](int rows, int cols, int K, auto a, auto b, const Vec* add, Vec* tol) {
        Vec d((size_t)rows * cols);
        tol->assign(d.size(), 0.0);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                double sum = add ? (*add)[(size_t)r * cols + c] : 0.0, mag = std::fabs(sum);
                for (int k = 0; k < K; k++) sum += a(r, k) * b(k, c), mag += std::fabs(a(r, k) * b(k, c));
                d[(size_t)r * cols + c] = sum;
                (*tol)[(size_t)r * cols + c] = (K + 2) * std::ldexp(mag, -24);
            }
        return d;
    };
    Fp8Workspace<float> f;
    std::vector<float> rows((size_t)N * OC), other((size_t)N * C), weight((size_t)OC * C);
    Fp8Scale scales[kFp8Operands];
    unsigned nonfinite = 0;
    f.rows = rows.data(), f.other = other.data(), f.weight = weight.data(), f.scales = scales, f.nonfinite_amaxes = &nonfinite;

    Vec tol;
    const Vec bias_rows = [&] { Vec b((size_t)N * OC); for (size_t i = 0; i < b.size(); i++) b[i] = bias[i % OC]; return b; }();
    const Vec want_out = product(N, OC, C, [&](int r, int k) { return qi[(size_t)r * C + k]; }, [&](int k, int c) { return qw[(size_t)c * C + k]; },
                                 &bias_rows, &tol);
    std::vector<float> out((size_t)N * OC), pre((size_t)N * OC), gelu((size_t)N * OC), want_gelu((size_t)N * OC);
    CpuBackend::fp8_matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC, f);
    expect_close("fp8 matmul forward", out, want_out, 0.0, tol);
    EXPECT_EQ(scales[kFp8Input].amax_bits, abs_bits(900.0f));
    CpuBackend::fp8_matmul_gelu_forward(gelu.data(), pre.data(), inp.data(), w.data(), bias.data(), N, C, OC, f);
    EXPECT_EQ(pre, out) << "the GELU matmul's pre-GELU output is the plain one's";
    cpu::gelu_forward(want_gelu.data(), pre.data(), pre.size());
    EXPECT_EQ(gelu, want_gelu);
    std::vector<float> unrounded((size_t)N * OC);
    cpu::matmul_forward(unrounded.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    double worst = 0;
    for (size_t i = 0; i < out.size(); i++) worst = std::max(worst, std::fabs(unrounded[i] - want_out[i]) / tol[i]);
    EXPECT_GT(worst, 100.0) << "the operands' rounding changes the product by too little for this test to see it";

    std::vector<float> dinp((size_t)N * C), dw = random_floats(w.size(), 45), db = random_floats(OC, 46);
    const Vec dw0 = widen(dw);
    Vec tol_dinp, tol_dw;
    const Vec want_dinp = product(N, C, OC, [&](int r, int k) { return qd[(size_t)r * OC + k]; }, [&](int k, int c) { return qw[(size_t)k * C + c]; },
                                  nullptr, &tol_dinp);
    const Vec want_dw = product(OC, C, N, [&](int r, int k) { return qd[(size_t)k * OC + r]; }, [&](int k, int c) { return qi[(size_t)k * C + c]; },
                                &dw0, &tol_dw);
    Vec want_db = widen(db), tol_db(OC, 0.0);
    for (int j = 0; j < OC; j++) {
        double mag = std::fabs(want_db[j]);
        for (int n = 0; n < N; n++) want_db[j] += dout[(size_t)n * OC + j], mag += std::fabs(dout[(size_t)n * OC + j]);
        tol_db[j] = (N + 2) * std::ldexp(mag, -24);
    }
    CpuBackend::fp8_matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC, false, f);
    expect_close("fp8 matmul dinp", dinp, want_dinp, 0.0, tol_dinp);
    expect_close("fp8 matmul dweight", dw, want_dw, 0.0, tol_dw);
    expect_close("fp8 matmul dbias (of the unrounded gradient)", db, want_db, 0.0, tol_db);
    double dout_amax = 0;
    for (float v : dout) dout_amax = std::max(dout_amax, std::fabs((double)v));
    EXPECT_EQ(scales[kFp8Gradient].descale, (float)(1.0 / defined_scale(dout_amax, Fp8Format::E5M2)));
    EXPECT_EQ(nonfinite, 0u);
}

}  // namespace
