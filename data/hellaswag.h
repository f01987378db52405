// The HellaSwag eval file, llm.c's eval format, written by data/hellaswag.py (train/hellaswag_eval.h
// scores it): int32 header[256] (magic 20240522, version 1, number of examples, longest example
// in bytes), then per example a uint16 stream: 65535, the example's bytes, its index, the label,
// the number of endings, then the context and each ending as a length followed by that many
// tokens.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/io.h"

constexpr FileFormat kEvalFormat{"HellaSwag file", "the HellaSwag header", 20240522, 1};
constexpr int kEvalExampleStart = 65535;
constexpr int kEndings = 4;  // llm.c's ASSUMED_NUM_COMPLETIONS
// marker, bytes, index, label, endings, then the context and each ending of one token: length + token
constexpr int kMinExampleBytes = 2 * (3 + 2 + 2 * (1 + kEndings));

struct EvalExample {
    int label = 0;
    std::vector<int> context;
    std::vector<int> endings[kEndings];
    int tokens() const {  // context plus the longest ending: the rows it needs
        size_t longest = 0;
        for (const auto& e : endings) longest = std::max(longest, e.size());
        return (int)(context.size() + longest);
    }
};

// Every example, checked field by field; any fault is one line naming the file and the example.
inline std::vector<EvalExample> read_eval_file(const std::string& path, int vocab) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) fatal(1, "cannot open HellaSwag file %s (data/hellaswag.py writes it)", path.c_str());
    const FileHeader h = read_header(f, path, kEvalFormat);
    const int count = h[2], longest = h[3];
    if (count <= 0 || count >= 65536 || longest <= 0 || longest >= 65536)
        fatal(1, "%s: inconsistent HellaSwag header (%d examples, longest %d bytes; expected both in 1..65535)", path.c_str(), count, longest);
    // the smallest example takes kMinExampleBytes: the file's size bounds the count
    if (!fits_in((uint64_t)count, kMinExampleBytes, file_size(f) - kHeaderBytes))
        fatal(1, "%s: header announces %d examples, more than the file's %zu bytes after it can hold (%d bytes each at least)", path.c_str(),
              count, file_size(f) - kHeaderBytes, kMinExampleBytes);
    std::vector<EvalExample> examples(count);
    std::vector<uint16_t> buf(longest / 2 + 1);
    for (int i = 0; i < count; i++) {
        uint16_t head[3];  // start marker, bytes, index
        read_exact(head, sizeof(head), f, path, "an example header");
        if (head[0] != kEvalExampleStart)
            fatal(1, "%s: example %d starts with %d, expected the marker %d", path.c_str(), i, head[0], kEvalExampleStart);
        if (head[2] != i) fatal(1, "%s: example %d has index %d, expected %d", path.c_str(), i, head[2], i);
        if (head[1] % 2 != 0 || head[1] < kMinExampleBytes || head[1] > longest)
            fatal(1, "%s: example %d claims %d bytes, expected an even size from %d to the header's longest %d", path.c_str(), i,
                  head[1], kMinExampleBytes, longest);
        const size_t n = head[1] / 2 - 3;
        read_exact(buf.data(), n * 2, f, path, "an example");
        EvalExample& ex = examples[i];
        ex.label = buf[0];
        if (buf[1] != kEndings) fatal(1, "%s: example %d has %d endings, expected %d", path.c_str(), i, buf[1], kEndings);
        if (ex.label >= kEndings) fatal(1, "%s: example %d has label %d, expected 0..%d", path.c_str(), i, ex.label, kEndings - 1);
        size_t at = 2;
        for (int part = 0; part <= kEndings; part++) {
            std::vector<int>& tokens = part == 0 ? ex.context : ex.endings[part - 1];
            const size_t len = at < n ? buf[at] : 0;
            if (len == 0 || at + 1 + len > n)
                fatal(1, "%s: example %d: part %d (0: context, 1-4: endings) is empty or runs past the example's %d bytes",
                      path.c_str(), i, part, head[1]);
            for (size_t t = at + 1; t <= at + len; t++) {
                if (buf[t] >= vocab)
                    fatal(1, "%s: example %d: token %d is outside the model's vocabulary of %d", path.c_str(), i, buf[t], vocab);
                tokens.push_back(buf[t]);
            }
            at += 1 + len;
        }
        if (at != n) fatal(1, "%s: example %d has %zu bytes after its last ending", path.c_str(), i, 2 * (n - at));
    }
    if (file_size(f) != (size_t)ftell(f))
        fatal(1, "%s: %zu bytes after the last of the header's %d examples", path.c_str(), file_size(f) - (size_t)ftell(f), count);
    fclose(f);
    return examples;
}
