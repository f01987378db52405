// Token shards in llm.c's format: int32 header[256] (magic 20240520, version 1, token count),
// then uint16 tokens. Files matching a glob pattern are read in sorted order as one stream.
//
// With R ranks, micro-batch B and sequence length T, rank r reads window k*R + r of B*T (+1 for
// the targets) tokens at its k-th call. R ranks with accumulation A therefore see exactly the
// sequences that one rank with accumulation R*A sees, in the same step.
#pragma once
#include <glob.h>

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
    DataLoader(const std::string& pattern, int B, int T, int rank, int world)
        : B_(B), T_(T), rank_(rank), world_(world) {
        glob_t g;
        if (glob(pattern.c_str(), 0, nullptr, &g) != 0 || g.gl_pathc == 0)
            fatal(1, "no token shard matches %s", pattern.c_str());
        for (size_t i = 0; i < g.gl_pathc; i++) files_.push_back(g.gl_pathv[i]);
        globfree(&g);
        const size_t need = (size_t)world * B * T + 1;
        for (const auto& f : files_) {
            size_t n = validate_shard(f);
            if (n < need)
                fatal(1, "%s: %zu tokens, too few for %d rank(s) x B=%d x T=%d (need %zu)", f.c_str(), n, world, B, T, need);
            sizes_.push_back(n);
            total_tokens_ += n;
        }
        buf_.resize((size_t)B * T + 1);
        reset();
    }
    ~DataLoader() { if (file_) fclose(file_); }
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    size_t total_tokens() const { return total_tokens_; }
    const std::vector<std::string>& files() const { return files_; }
    const std::vector<size_t>& sizes() const { return sizes_; }

    void reset() { open_shard(0); }

    // Fills inputs and targets (B*T each) with this rank's next window, moving to the next shard
    // (and back to the first after the last) when the current one has no full window left.
    void next_batch(int* inputs, int* targets) {
        const size_t window = (size_t)B_ * T_;
        if (position_ + window + 1 > sizes_[shard_]) open_shard((shard_ + 1) % files_.size());
        fseek(file_, (long)(1024 + position_ * sizeof(uint16_t)), SEEK_SET);
        read_exact(buf_.data(), buf_.size() * sizeof(uint16_t), file_, files_[shard_], "tokens");
        for (size_t i = 0; i < window; i++) {
            inputs[i] = buf_[i];
            targets[i] = buf_[i + 1];
        }
        position_ += window * world_;
    }

private:
    void open_shard(size_t index) {
        if (file_) fclose(file_);
        shard_ = index;
        file_ = open_file(files_[shard_], "rb");
        position_ = (size_t)rank_ * B_ * T_;
    }

    int B_, T_, rank_, world_;
    std::vector<std::string> files_;
    std::vector<size_t> sizes_;
    size_t total_tokens_ = 0;
    size_t shard_ = 0, position_ = 0;
    FILE* file_ = nullptr;
    std::vector<uint16_t> buf_;
};
