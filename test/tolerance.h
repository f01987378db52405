// How the C++ tests compare numbers: tolerance checks that note the comparison nearest its limit
// (for scripts/gpu_check.sh's summary), and the kernel tests' closeness rule. No trainer code, so
// test_ops.cpp can use it without building the trainer.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

// Each test's worst error against its tolerance, for scripts/gpu_check.sh's summary: every
// tolerance check notes the comparison nearest its limit in worst_error(), and a test watched
// by a WorstErrorPrinter ends with one line, e.g.
//   worst-error PASS Cuda.Matmul: 1.2e-03 vs tolerance 4.1e-03 (0.29 of it) in matmul_backward dweight
//   worst-error PASS Cuda.LaunchesPerStep: exact (no tolerance checked)
struct WorstError {
    double error = 0, tolerance = 0;
    std::string what;
    bool noted = false;

    double ratio() const { return error == 0 ? 0 : error / tolerance; }  // NaN stays NaN
    // keeps the comparison with the larger error / tolerance; a NaN error is the worst of all
    void note(double err, double tol, const char* check) {
        const WorstError candidate{err, tol, "", true};
        if (noted && (std::isnan(ratio()) || candidate.ratio() <= ratio())) return;
        *this = candidate;
        if (check) what = check;
    }
};
inline WorstError& worst_error() {
    static WorstError w;
    return w;
}

// Prints the line above when a test ends (not for skipped tests). `combine` merges what the
// ranks noted (test/test_zero.cpp), on every rank; `print` is false on the quiet ones.
class WorstErrorPrinter : public testing::EmptyTestEventListener {
public:
    explicit WorstErrorPrinter(std::function<WorstError(const WorstError&)> combine = nullptr, bool print = true)
        : combine_(std::move(combine)), print_(print) {}
    void OnTestStart(const testing::TestInfo&) override { worst_error() = WorstError(); }
    void OnTestEnd(const testing::TestInfo& test) override {
        const WorstError w = combine_ ? combine_(worst_error()) : worst_error();
        if (!print_ || test.result()->Skipped()) return;
        printf("worst-error %s %s.%s: ", test.result()->Passed() ? "PASS" : "FAIL", test.test_suite_name(), test.name());
        if (!w.noted) printf("exact (no tolerance checked)\n");
        else printf("%.2g vs tolerance %.2g (%.2f of it)%s%s\n", w.error, w.tolerance, w.ratio(), w.what.empty() ? "" : " in ", w.what.c_str());
        fflush(stdout);
    }

private:
    std::function<WorstError(const WorstError&)> combine_;
    bool print_;
};

// Largest |a-b| / (atol + rtol*|b|), NaN if any a is NaN; at most 1 means every element is
// within tolerance. Noted in worst_error() as `what`.
inline double tolerance_ratio(const float* a, const float* b, size_t n, double rtol, double atol, const char* what = nullptr) {
    WorstError nearest;
    for (size_t i = 0; i < n; i++) nearest.note(std::fabs((double)a[i] - b[i]), atol + rtol * std::fabs((double)b[i]), nullptr);
    worst_error().note(nearest.error, nearest.tolerance, what);
    return nearest.ratio();
}

// The kernel tests' tolerance (test_kernels_cuda.cu): element i passes when
// |got - want| <= atol * scale + rtol * |want_i|, scale = rms(want) (one small element next to
// large ones is judged by the tensor's magnitude, as its error is), or scale_floor where that is
// larger: a reference that is ~0 where the computation is not exactly (attention at T = 1) is
// judged by the magnitude of its inputs. allowance, where given, widens each element's limit by
// its own amount (a long fp32 sum's rounding, fp32_sum_allowance). NaN fails.
struct Closeness {
    float scale = 0.0f, worst = 0.0f;  // worst: the largest error among the failing elements
    std::vector<size_t> failing;       // their indices
    WorstError nearest;                // the comparison nearest its limit
};
inline Closeness closeness(const std::vector<float>& got, const std::vector<float>& want, float atol, float rtol,
                           float scale_floor = 0.0f, const std::vector<float>* allowance = nullptr) {
    Closeness c;
    double ss = 0.0;
    for (float w : want) ss += (double)w * w;
    c.scale = std::max(want.empty() ? 0.0f : (float)std::sqrt(ss / want.size()), scale_floor);
    for (size_t i = 0; i < got.size() && i < want.size(); i++) {
        const float err = std::fabs(got[i] - want[i]),
                    lim = atol * c.scale + rtol * std::fabs(want[i]) + (allowance ? (*allowance)[i] : 0.0f);
        c.nearest.note(err, lim, nullptr);
        if (!(err <= lim)) {
            c.failing.push_back(i);
            c.worst = std::max(c.worst, err);
        }
    }
    return c;
}

// How far an fp32 sum of n terms may land from another fp32 sum of the same terms in another
// order: a sequential sum (the CPU backend's) drifts by up to about u sqrt(n) times the terms'
// root sum of squares (u = 2^-24; measured: 1.1 u sqrt(n) over 40 sums of 65,536 uniform terms),
// a blocked one by far less. Four times that, so that a long run's sum is judged by its own
// rounding, not by a tolerance fitted to short ones.
inline float fp32_sum_allowance(size_t n, double sum_of_squares) {
    return (float)(4.0 * std::ldexp(1.0, -24) * std::sqrt((double)n) * std::sqrt(sum_of_squares));
}

// The attention outputs' natural magnitudes from the inputs alone, as closeness()'s scale_floor.
// One term of each sum sets it: dP = dout . v ~ sqrt(hs) rms(dout) rms(v), times 1/sqrt(hs) and
// a k (for dq) or q (for dk); dv = sum of P dout with P <= 1; out = sum of P v.
struct AttentionScales {
    float out, dq, dk, dv;
};
inline AttentionScales attention_scales(const std::vector<float>& qkv, const std::vector<float>& dout, int C) {
    double ss[4] = {0, 0, 0, 0};  // q, k, v, dout
    for (size_t i = 0; i < qkv.size(); i++) ss[(i / C) % 3] += (double)qkv[i] * qkv[i];
    for (float x : dout) ss[3] += (double)x * x;
    float rms[4];
    for (int p = 0; p < 3; p++) rms[p] = (float)std::sqrt(ss[p] * 3 / std::max<size_t>(qkv.size(), 1));
    rms[3] = (float)std::sqrt(ss[3] / std::max<size_t>(dout.size(), 1));
    return {rms[2], rms[3] * rms[2] * rms[1], rms[3] * rms[2] * rms[0], rms[3]};
}

