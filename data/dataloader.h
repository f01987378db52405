// Token shards in llm.c's format: int32 header[256] (magic 20240520, version 1, token count),
// then uint16 tokens. Files matching a glob pattern are read in sorted order as one stream.
//
// The stream is cut into windows of B*T tokens (+1 for the targets) that never cross a file
// boundary. With R ranks, rank r reads window k*R + r at its k-th call, wrapping around after the
// last window. R ranks with accumulation A therefore see exactly the windows that one rank with
// accumulation R*A sees, in the same steps, also across file boundaries and epochs.
//
// Shuffled (training data, as llm.c's loader): each epoch reads the shards in a permuted order
// and the windows within each shard in a permuted order. The window numbering above then runs
// over that order, so the guarantee across ranks still holds. The order of epoch e is drawn
// from (seed, e) alone: every rank derives it without talking, and any position can be sought.
// It is std::mt19937_64 seeded with seed ^ (0x9E3779B97F4A7C15 * (e + 1)), shuffling by
// Fisher-Yates (permute() below) first the shards, then each shard's windows in the new order.
// state()/restore() carry the position and the current epoch's order through the state file.
#pragma once
#include <glob.h>

#include <algorithm>
#include <random>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/io.h"

constexpr int kShardMagic = 20240520;
constexpr int kShardVersion = 1;
constexpr FileFormat kShardFormat{"token shard", "the shard header", kShardMagic, kShardVersion};

// Checks the header and that the file holds exactly the tokens it announces; returns the count.
inline size_t validate_shard(const std::string& path) {
    FILE* f = open_file(path, "rb");
    const FileHeader header = read_header(f, path, kShardFormat);
    size_t tokens = (size_t)(uint32_t)header[2];
    size_t expected = kHeaderBytes + tokens * sizeof(uint16_t), actual = file_size(f);
    fclose(f);
    if (actual != expected)
        fatal(1, "%s: file is %zu bytes but its header announces %zu tokens (%zu bytes)", path.c_str(), actual, tokens, expected);
    return tokens;
}

// where a loader is: what the state file keeps of it
struct LoaderState {
    uint64_t position = 0;      // windows read by all ranks together
    uint64_t window = 0;        // tokens per window, B*T
    uint64_t windows = 0;       // windows per epoch
    uint64_t seed = 0;          // shuffle seed
    int shuffled = 0;
    std::vector<uint32_t> order;  // shuffled: the current epoch's windows in reading order
};

// Fisher-Yates with std::mt19937_64, whose output the standard fixes (std::shuffle's is not)
inline void permute(std::vector<uint32_t>& v, std::mt19937_64& rng) {
    for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[rng() % i]);
}

class DataLoader {
public:
    // vocab: every token must be below it (the model's vocabulary), checked as it is read
    DataLoader(const std::string& pattern, int B, int T, int rank, int world, int vocab)
        : window_((size_t)B * T), rank_(rank), world_(world), vocab_(vocab) {
        glob_t g;
        if (glob(pattern.c_str(), 0, nullptr, &g) != 0 || g.gl_pathc == 0)
            fatal(1, "no token shard matches %s", pattern.c_str());
        for (size_t i = 0; i < g.gl_pathc; i++) files_.push_back(g.gl_pathv[i]);
        globfree(&g);
        for (const auto& f : files_) {
            size_t n = validate_shard(f);
            if (n < window_ + 1) fatal(1, "%s: %zu tokens, too few for one window of B*T+1 = %zu", f.c_str(), n, window_ + 1);
            sizes_.push_back(n);
            first_window_.push_back(total_windows_);
            total_windows_ += windows_in(sizes_.size() - 1);
            total_tokens_ += n;
        }
        buf_.resize(window_ + 1);
    }
    ~DataLoader() { if (file_) fclose(file_); }
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    size_t total_tokens() const { return total_tokens_; }
    size_t windows() const { return total_windows_; }  // per epoch
    const std::vector<std::string>& files() const { return files_; }
    const std::vector<size_t>& sizes() const { return sizes_; }

    void reset() { calls_ = 0; }

    // from now on every epoch is read in the order drawn from (seed, epoch)
    void shuffle(uint64_t seed) {
        shuffled_ = true;
        seed_ = seed;
        order_epoch_ = -1;
    }
    // Shard order, then each shard's windows, of epoch e: global window numbers in reading order.
    std::vector<uint32_t> epoch_order(uint64_t e) const {
        std::mt19937_64 rng(seed_ ^ (0x9E3779B97F4A7C15ull * (e + 1)));
        std::vector<uint32_t> shards(files_.size()), order;
        for (size_t i = 0; i < shards.size(); i++) shards[i] = (uint32_t)i;
        permute(shards, rng);
        for (uint32_t s : shards) {
            const size_t first = first_window_[s], n = windows_in(s);
            std::vector<uint32_t> windows(n);
            for (size_t i = 0; i < n; i++) windows[i] = (uint32_t)(first + i);
            permute(windows, rng);
            order.insert(order.end(), windows.begin(), windows.end());
        }
        return order;
    }

    // Between steps (every rank has read as many windows): the position and, shuffled, the
    // current epoch's order.
    LoaderState state() {
        LoaderState s{calls_ * world_, window_, total_windows_, seed_, shuffled_ ? 1 : 0, {}};
        if (shuffled_) s.order = order_of(s.position / total_windows_);
        return s;
    }
    // Continues from a state: the same windows, in the same order, at any number of ranks.
    void restore(const LoaderState& s) {
        if (s.window != window_ || s.windows != total_windows_)
            fatal(1, "-y 1: the state's data is %llu windows of %llu tokens, this run's is %zu windows of B*T = %zu (keep B*T and the data)",
                  (unsigned long long)s.windows, (unsigned long long)s.window, total_windows_, window_);
        if (s.shuffled != (shuffled_ ? 1 : 0))
            fatal(1, "-y 1: the state was written with shuffling %s, this run has it %s (--shuffle)", s.shuffled ? "on" : "off", shuffled_ ? "on" : "off");
        if (s.position % world_ != 0)
            fatal(1, "-y 1: the state's position of %llu windows does not divide among %d ranks", (unsigned long long)s.position, world_);
        calls_ = s.position / world_;
        if (!shuffled_) return;
        if (s.order.size() != total_windows_) fatal(1, "-y 1: the state's window order has %zu entries, expected %zu", s.order.size(), total_windows_);
        std::vector<bool> seen(total_windows_);
        for (uint32_t w : s.order) {
            if (w >= total_windows_ || seen[w]) fatal(1, "-y 1: the state's window order is not a permutation of the %zu windows (window %u)", total_windows_, w);
            seen[w] = true;
        }
        seed_ = s.seed;
        order_ = s.order;
        order_epoch_ = (int64_t)(s.position / total_windows_);
    }

    // Fills inputs and targets (B*T each) with this rank's next window.
    void next_batch(int* inputs, int* targets) {
        const size_t g = calls_++ * world_ + rank_, i = g % total_windows_;
        const size_t w = shuffled_ ? order_of(g / total_windows_)[i] : i;
        size_t shard = std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin() - 1;
        if (file_ == nullptr || shard != shard_) {
            if (file_) fclose(file_);
            file_ = open_file(files_[shard], "rb");
            shard_ = shard;
        }
        const size_t position = (w - first_window_[shard]) * window_;
        fseek(file_, (long)(kHeaderBytes + position * sizeof(uint16_t)), SEEK_SET);
        read_exact(buf_.data(), buf_.size() * sizeof(uint16_t), file_, files_[shard], "tokens");
        for (size_t i = 0; i <= window_; i++)
            if (buf_[i] >= vocab_)
                fatal(1, "%s: token %d at position %zu is outside the model's vocabulary of %d", files_[shard].c_str(), buf_[i], position + i, vocab_);
        for (size_t i = 0; i < window_; i++) {
            inputs[i] = buf_[i];
            targets[i] = buf_[i + 1];
        }
    }

private:
    size_t windows_in(size_t shard) const { return (sizes_[shard] - 1) / window_; }
    const std::vector<uint32_t>& order_of(uint64_t epoch) {
        if ((int64_t)epoch != order_epoch_) {
            order_ = epoch_order(epoch);
            order_epoch_ = (int64_t)epoch;
        }
        return order_;
    }

    size_t window_;
    int rank_, world_, vocab_;
    std::vector<std::string> files_;
    std::vector<size_t> sizes_, first_window_;
    size_t total_tokens_ = 0, total_windows_ = 0, calls_ = 0, shard_ = 0;
    FILE* file_ = nullptr;
    std::vector<uint16_t> buf_;
    bool shuffled_ = false;
    uint64_t seed_ = 0;
    int64_t order_epoch_ = -1;  // the epoch order_ belongs to
    std::vector<uint32_t> order_;
};
