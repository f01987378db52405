// Token shards in llm.c's format: int32 header[256] (magic 20240520, version 1, token count),
// then uint16 tokens. Files matching a glob pattern are read in sorted order as one stream.
//
// The stream is cut into windows of B*T tokens (+1 for the targets) that never cross a file
// boundary. With R ranks, rank r reads window k*R + r at its k-th call, wrapping around after the
// last window. R ranks with accumulation A therefore see exactly the windows that one rank with
// accumulation R*A sees, in the same steps, also across file boundaries and epochs.
#pragma once
#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "io.h"

constexpr int kShardMagic = 20240520;
constexpr int kShardVersion = 1;

// Checks the header and that the file holds exactly the tokens it announces; returns the count.
inline size_t validate_shard(const std::string& path) {
    FILE* f = open_file(path, "rb");
    int32_t header[256];
    read_exact(header, sizeof(header), f, path, "the shard header");
    if (header[0] != kShardMagic) fatal(1, "%s: bad magic %d in token shard (expected %d)", path.c_str(), header[0], kShardMagic);
    if (header[1] != kShardVersion) fatal(1, "%s: unsupported token shard version %d (expected %d)", path.c_str(), header[1], kShardVersion);
    size_t tokens = (size_t)(uint32_t)header[2];
    size_t expected = sizeof(header) + tokens * sizeof(uint16_t), actual = file_size(f);
    fclose(f);
    if (actual != expected)
        fatal(1, "%s: file is %zu bytes but its header announces %zu tokens (%zu bytes)", path.c_str(), actual, tokens, expected);
    return tokens;
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
            total_windows_ += (n - 1) / window_;
            total_tokens_ += n;
        }
        buf_.resize(window_ + 1);
    }
    ~DataLoader() { if (file_) fclose(file_); }
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    size_t total_tokens() const { return total_tokens_; }
    const std::vector<std::string>& files() const { return files_; }
    const std::vector<size_t>& sizes() const { return sizes_; }

    void reset() { calls_ = 0; }
    // as if next_batch had been called `calls` times since reset()
    void seek(size_t calls) { calls_ = calls; }

    // Fills inputs and targets (B*T each) with this rank's next window.
    void next_batch(int* inputs, int* targets) {
        const size_t w = (calls_++ * world_ + rank_) % total_windows_;
        size_t shard = std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin() - 1;
        if (file_ == nullptr || shard != shard_) {
            if (file_) fclose(file_);
            file_ = open_file(files_[shard], "rb");
            shard_ = shard;
        }
        const size_t position = (w - first_window_[shard]) * window_;
        fseek(file_, (long)(1024 + position * sizeof(uint16_t)), SEEK_SET);
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
    size_t window_;
    int rank_, world_, vocab_;
    std::vector<std::string> files_;
    std::vector<size_t> sizes_, first_window_;
    size_t total_tokens_ = 0, total_windows_ = 0, calls_ = 0, shard_ = 0;
    FILE* file_ = nullptr;
    std::vector<uint16_t> buf_;
};
