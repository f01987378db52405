// HellaSwag, scored completion-style as llm.c does: each example (data/hellaswag.h reads the
// file) is a context and 4 endings; the model's prediction is the ending whose tokens have the
// lowest mean loss after the context (acc_norm).
//
// Ranks split the examples as llm.c does: ceil(n / world) each, in file order, the last ranks
// fewer (or none). Every rank runs the same number of forward passes, since at ZeRO stage 3 a
// forward is a collective.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../common/io.h"
#include "../data/hellaswag.h"
#include "../zero/comm.h"

struct HellaSwagScore {
    int correct = 0, total = 0;
    // on rank 0: per example the mean loss of each ending, kEndings floats per example
    std::vector<float> ending_losses;
    double accuracy() const { return total > 0 ? (double)correct / total : 0.0; }
};

class HellaSwag {
public:
    // B, T: the model's batch; B/4 examples go through one forward pass
    HellaSwag(const std::string& path, int vocab, int B, int T, int rank, int world)
        : examples_(read_eval_file(path, vocab)), B_(B), rank_(rank) {
        if (B < kEndings) fatal(2, "-h 1 needs -b %d or more: an example's %d endings share one batch", kEndings, kEndings);
        for (size_t i = 0; i < examples_.size(); i++) {
            const int tokens = examples_[i].tokens();
            if (tokens > T)
                fatal(2, "%s: example %zu needs %d tokens (context and longest ending), more than -t %d", path.c_str(), i, tokens, T);
            T_ = std::max(T_, tokens);  // the forward pass needs no more
        }
        per_rank_ = ((int)examples_.size() + world - 1) / world;
        batches_ = (per_rank_ + B / kEndings - 1) / (B / kEndings);
    }
    int size() const { return (int)examples_.size(); }

    // Scores every example (this rank's share, counts summed over ranks). Model: forward(inputs,
    // targets, B, T, dloss) and losses(), the per-position losses of the last forward.
    template <class Model>
    HellaSwagScore evaluate(Model& model, Communicator& comm) {
        const int per_batch = B_ / kEndings, rows = per_batch * kEndings, begin = rank_ * per_rank_;
        const int end = std::min(begin + per_rank_, size());
        std::vector<int> inputs((size_t)rows * T_), targets((size_t)rows * T_);
        std::vector<float> mine((size_t)per_rank_ * kEndings, NAN);  // NAN: a slot past the last example
        int correct = 0;
        for (int batch = 0; batch < batches_; batch++) {
            std::fill(inputs.begin(), inputs.end(), 0);
            std::fill(targets.begin(), targets.end(), 0);
            const int first = begin + batch * per_batch, last = std::min(first + per_batch, end);
            for (int e = first; e < last; e++)
                for (int c = 0; c < kEndings; c++) {
                    const size_t row = ((size_t)(e - first) * kEndings + c) * T_;
                    fill_row(examples_[e], c, &inputs[row], &targets[row]);
                }
            model.forward(inputs.data(), targets.data(), rows, T_, 0.0f);
            const float* losses = model.losses();
            for (int e = first; e < last; e++) {
                const EvalExample& ex = examples_[e];
                float* mean = &mine[(size_t)(e - begin) * kEndings];
                int best = 0;
                for (int c = 0; c < kEndings; c++) {
                    // the loss at position ctx+j-1 is the loss of the ending's token j
                    const float* row = losses + ((size_t)(e - first) * kEndings + c) * T_ + ex.context.size() - 1;
                    double sum = 0.0;
                    for (size_t j = 0; j < ex.endings[c].size(); j++) sum += row[j];
                    mean[c] = (float)(sum / ex.endings[c].size());
                    if (mean[c] < mean[best]) best = c;
                }
                correct += best == ex.label;
            }
        }
        HellaSwagScore score;
        score.correct = (int)lround(comm.all_reduce_host(correct));
        score.total = size();
        if (comm.rank() == 0) score.ending_losses.resize(mine.size() * comm.world());
        comm.gather_host(mine.data(), score.ending_losses.data(), mine.size() * sizeof(float), 0);
        if (comm.rank() == 0) score.ending_losses.resize((size_t)size() * kEndings);
        return score;
    }

    // one line per example: index, label, then each ending's mean loss
    void write_losses(const std::string& path, const HellaSwagScore& score) const {
        AtomicFile f(path);
        for (int i = 0; i < size(); i++) {
            char line[160];
            int n = snprintf(line, sizeof(line), "%d %d", i, examples_[i].label);
            for (int c = 0; c < kEndings; c++) n += snprintf(line + n, sizeof(line) - n, " %.9g", score.ending_losses[(size_t)i * kEndings + c]);
            line[n++] = '\n';
            f.write(line, n);
        }
        f.commit();
    }

private:
    // row c of an example: context, then ending c; targets are the next tokens
    static void fill_row(const EvalExample& ex, int c, int* inputs, int* targets) {
        std::vector<int> row = ex.context;
        row.insert(row.end(), ex.endings[c].begin(), ex.endings[c].end());
        std::copy(row.begin(), row.end(), inputs);
        std::copy(row.begin() + 1, row.end(), targets);
    }

    std::vector<EvalExample> examples_;
    int B_, rank_, T_ = 0, per_rank_ = 0, batches_ = 0;
};
