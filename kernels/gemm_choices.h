// Which of cuBLASLt's algorithms each GEMM shape runs, where not the heuristic's first: the table
// that scripts/bench_gemm --write makes by timing every algorithm the heuristic offers on one GPU,
// and train_gpt --gemm-algos reads. Choosing by timing inside a run could choose differently from
// run to run; a table chooses the same each time, so runs that read it are as reproducible as runs
// without one. An algorithm is named by its configuration as cuBLASLt reports it (its id, tile,
// stages, split-K, reduction, swizzling, custom option, inner and cluster shape), and a run takes
// it from among those the heuristic offers for the shape; the GPU (name and SM count), cuBLASLt
// version, workspace and precision the table was timed with are named too, and a run with others
// refuses it. Host code only (no CUDA): the CUDA backend applies it (kernels/cuda/matmul.cuh).
//
// The text, one item a line, '#' lines ignored:
//   gpu NVIDIA H200
//   sms 132
//   cublaslt 130100
//   workspace 33554432
//   precision bf16
//   gemm <m> <n> <k> <lda> <ldb> <ldd> <transa 0|1> <transb 0|1> <epilogue> <alignment> <algorithm>
// where the ten fields before the algorithm are kernels/cuda/matmul.cuh's GemmKey and the
// algorithm is its nine configuration numbers joined by ':'.
#pragma once
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../common/io.h"

// the epilogues a GemmKey can have, as the table spells them (matmul.cuh's kGemmEpilogues, in order)
inline constexpr const char* kGemmEpilogueNames[] = {"none", "BIAS", "GELU_AUX_BIAS", "DGELU", "DGELU_BGRAD", "BGRADB"};
constexpr int kGemmAlgorithmConfigs = 9;  // the numbers that name an algorithm
// How many algorithms the heuristic is asked for where a table names one: as many as bench_gemm
// timed, so that the algorithm it chose is among them.
constexpr int kGemmAlgorithmsAsked = 16;

struct GemmChoices {
    std::string gpu;            // cudaDeviceProp::name
    long sms = 0;               // its multiprocessors: a part with the same name and fewer gets other algorithms
    long cublaslt_version = 0;  // cublasLtGetVersion()
    long workspace = 0;         // bytes of cuBLASLt workspace the heuristic was allowed
    std::string precision;      // bf16 | fp32: the build's
    std::map<std::string, std::string> algorithm;  // gemm_shape_text -> the algorithm's configuration
};

// a GemmKey's fields as the table writes them (its map key)
inline std::string gemm_shape_text(int m, int n, int k, int lda, int ldb, int ldd, bool trans_a, bool trans_b,
                                   const std::string& epilogue, int align) {
    std::ostringstream s;
    s << m << ' ' << n << ' ' << k << ' ' << lda << ' ' << ldb << ' ' << ldd << ' ' << (trans_a ? 1 : 0) << ' '
      << (trans_b ? 1 : 0) << ' ' << epilogue << ' ' << align;
    return s.str();
}

inline std::string format_gemm_choices(const GemmChoices& t) {
    std::ostringstream s;
    s << "# GEMM algorithms for train_gpt --gemm-algos (scripts/bench_gemm --write): for each shape, the\n"
         "# configuration of the fastest algorithm cuBLASLt's heuristic offered, as timed on this GPU\n"
         "# gemm m n k lda ldb ldd transa transb epilogue alignment id:tile:stages:splitk:reduction:swizzle:custom:inner:cluster\n";
    s << "gpu " << t.gpu << "\nsms " << t.sms << "\ncublaslt " << t.cublaslt_version << "\nworkspace " << t.workspace
      << "\nprecision " << t.precision << "\n";
    for (const auto& [shape, algorithm] : t.algorithm) s << "gemm " << shape << ' ' << algorithm << "\n";
    return s.str();
}

// The table in `text`, or "" into *error: the line and what was expected there.
inline GemmChoices parse_gemm_choices(const std::string& text, std::string* error) {
    GemmChoices t;
    std::istringstream lines(text);
    std::string line;
    int number = 0;
    auto fail = [&](const std::string& what) {
        *error = "line " + std::to_string(number) + ": " + what;
        return GemmChoices{};
    };
    error->clear();
    std::map<std::string, int> said;  // header item -> its line
    while (std::getline(lines, line)) {
        number++;
        if (line.empty() || line[0] == '#') continue;
        const size_t space = line.find(' ');
        const std::string item = line.substr(0, space), rest = space == std::string::npos ? "" : line.substr(space + 1);
        if (item != "gemm" && !said.emplace(item, number).second)
            return fail(item + " given twice (first at line " + std::to_string(said[item]) + ")");
        if (item == "gpu") {
            if (rest.empty()) return fail("gpu without a name");
            t.gpu = rest;
        } else if (item == "sms") {
            if (!parse_whole_number(rest, 1, INT_MAX, &t.sms)) return fail("expected the GPU's multiprocessor count, not '" + rest + "'");
        } else if (item == "cublaslt") {
            if (!parse_whole_number(rest, 1, LONG_MAX, &t.cublaslt_version)) return fail("expected cuBLASLt's version number, not '" + rest + "'");
        } else if (item == "workspace") {
            if (!parse_whole_number(rest, 0, LONG_MAX, &t.workspace)) return fail("expected the workspace's bytes, not '" + rest + "'");
        } else if (item == "precision") {
            if (rest != "bf16" && rest != "fp32") return fail("expected precision bf16 or fp32, not '" + rest + "'");
            t.precision = rest;
        } else if (item == "gemm") {
            std::istringstream fields(rest);
            std::vector<std::string> f;
            for (std::string w; fields >> w;) f.push_back(w);
            if (f.size() != 11)
                return fail("expected 11 fields after gemm (m n k lda ldb ldd transa transb epilogue alignment algorithm), found " +
                            std::to_string(f.size()));
            long v[10];
            for (int i = 0; i < 6; i++)
                if (!parse_whole_number(f[i], 1, INT_MAX, &v[i])) return fail("expected a positive size, not '" + f[i] + "'");
            for (int i = 6; i < 8; i++)
                if (!parse_whole_number(f[i], 0, 1, &v[i])) return fail("expected transa and transb 0 or 1, not '" + f[i] + "'");
            bool known = false;
            for (const char* name : kGemmEpilogueNames) known = known || f[8] == name;
            if (!known) return fail("unknown epilogue '" + f[8] + "'");
            if (!parse_whole_number(f[9], 1, 16, &v[9])) return fail("expected an alignment of 1 to 16 bytes, not '" + f[9] + "'");
            // the algorithm: its configuration numbers, written back without leading zeros or signs
            std::istringstream parts(f[10]);
            std::string part, algorithm;
            int count = 0;
            for (long x; std::getline(parts, part, ':'); count++) {
                if (!parse_whole_number(part, 0, UINT_MAX, &x)) break;
                algorithm += (count ? ":" : "") + std::to_string(x);
            }
            if (count != kGemmAlgorithmConfigs || f[10].back() == ':')
                return fail("expected the algorithm as " + std::to_string(kGemmAlgorithmConfigs) +
                            " numbers joined by ':' (id:tile:stages:splitk:reduction:swizzle:custom:inner:cluster), not '" + f[10] + "'");
            const std::string shape = gemm_shape_text((int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5], v[6] == 1,
                                                      v[7] == 1, f[8], (int)v[9]);
            if (!t.algorithm.emplace(shape, algorithm).second) return fail("shape '" + shape + "' given twice");
        } else {
            return fail("expected gpu, sms, cublaslt, workspace, precision or gemm, not '" + item + "'");
        }
    }
    if (said.size() != 5) {
        number = 0;
        return fail("expected gpu, sms, cublaslt, workspace and precision lines: a table names what it was timed on");
    }
    return t;
}

// The table in file `path`; a file that cannot be read or parsed stops the run with one line.
inline GemmChoices read_gemm_choices(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) fatal(2, "--gemm-algos %s: cannot open: %s (scripts/bench_gemm --write makes one)", path.c_str(), strerror(errno));
    std::string text;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
    const int read_error = ferror(f) ? errno : 0;
    fclose(f);
    if (read_error != 0) fatal(2, "--gemm-algos %s: cannot read: %s", path.c_str(), strerror(read_error));
    std::string error;
    GemmChoices t = parse_gemm_choices(text, &error);
    if (!error.empty()) fatal(2, "--gemm-algos %s: %s", path.c_str(), error.c_str());
    return t;
}
