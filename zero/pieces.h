// A group's shard as the collectives cut it, and the copies that fill and empty their buffers.
//
// A collective moves one piece: at most the largest layer's shard per rank, so that a larger
// group (the embedding) goes in several and the buffers are sized by a layer, not by the
// vocabulary. What it moves is this rank's piece (its chunks of the group's tensors) or a
// rank-major buffer, whose row r holds rank r's piece.
#pragma once
#include <algorithm>
#include <cstddef>

#include "partition.h"

// values [lo, hi) of group `group`'s part of a rank's shard (group -1: none)
struct Piece {
    int group = -1;
    size_t lo = 0, hi = 0;
    size_t size() const { return hi - lo; }
    bool operator==(const Piece& o) const { return group == o.group && lo == o.lo && hi == o.hi; }
    bool operator!=(const Piece& o) const { return !(*this == o); }
};

template <class Backend>
class Pieces {
public:
    using floatX = typename Backend::floatX;

    // rank: the rank whose chunks "my piece" means
    Pieces(const PartitionPlan& plan, int rank) : plan_(plan), rank_(rank) {
        const int last = plan.num_groups() - 1;
        for (int g = 1; g < last; g++) max_ = std::max(max_, plan.group(g).shard_size);
        if (max_ == 0) max_ = std::max(plan.group(0).shard_size, plan.group(last).shard_size);
    }
    const PartitionPlan& plan() const { return plan_; }
    // elements per rank a collective moves at most
    size_t max() const { return max_; }
    bool one_piece(int g) const { return plan_.group(g).shard_size <= max_; }
    // f(piece) for each piece of group g, in order
    template <class F>
    void for_each(int g, F f) const {
        const size_t n = plan_.group(g).shard_size;
        for (size_t lo = 0; lo < n; lo += max_) f(Piece{g, lo, std::min(n, lo + max_)});
    }
    // which of its group's pieces p is
    size_t index(const Piece& p) const { return p.lo / max_; }

    // f(t, c0, at, len) for each tensor t of the group overlapping piece p: the overlap starts at
    // c0 within t's chunk and at `at` within the piece
    template <class F>
    void for_each_tensor(const Piece& p, F f) const {
        const PartitionPlan::Group& g = plan_.group(p.group);
        for (const auto& t : g.tensors) {
            const size_t t_lo = t.shard_offset - g.shard_offset;
            const size_t a = std::max(p.lo, t_lo), b = std::min(p.hi, t_lo + t.chunk);
            if (a < b) f(t, a - t_lo, a - p.lo, b - a);
        }
    }

    // Tensors of the group (tensor t at base + offset_of(t)) -> rank-major buffer holding, row by
    // row, every rank's piece p, padding zeroed
    template <class OffsetOf>
    void pack(floatX* rank_major, const floatX* base, OffsetOf offset_of, const Piece& p) const {
        const size_t X = sizeof(floatX), w = p.size();
        for_each_tensor(p, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            floatX* dst = rank_major + at;
            const floatX* src = base + offset_of(t) + c0;
            for_rows(t, c0, len, [&](int r0, int rows, size_t valid) {
                if (valid > 0) Backend::copy2d(dst + r0 * w, w * X, src + r0 * t.chunk, t.chunk * X, valid * X, rows);
                if (valid < len) Backend::zero(dst + r0 * w + valid, (len - valid) * X);
            });
        });
    }
    // ... and back
    template <class OffsetOf>
    void unpack(floatX* base, const floatX* rank_major, OffsetOf offset_of, const Piece& p) const {
        const size_t X = sizeof(floatX), w = p.size();
        for_each_tensor(p, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            const floatX* src = rank_major + at;
            floatX* dst = base + offset_of(t) + c0;
            for_rows(t, c0, len, [&](int r0, int rows, size_t valid) {
                if (valid > 0) Backend::copy2d(dst + r0 * t.chunk, t.chunk * X, src + r0 * w, w * X, valid * X, rows);
            });
        });
    }
    // this rank's chunks of the tensors (chunk_of(t)) -> its piece p, real parameters only
    template <class ChunkOf>
    void copy_to_my_piece(floatX* piece, const Piece& p, ChunkOf chunk_of) const {
        for_each_mine(p, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            Backend::copy(piece + at, chunk_of(t) + c0, len * sizeof(floatX));
        });
    }
    // ... and back
    template <class ChunkOf>
    void copy_from_my_piece(const floatX* piece, const Piece& p, ChunkOf chunk_of) const {
        for_each_mine(p, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            Backend::copy(chunk_of(t) + c0, piece + at, len * sizeof(floatX));
        });
    }

private:
    // Elements [c0, c0 + len) of every rank's chunk of t: calls f(first_rank, rows, valid) for
    // the run of ranks where all len are real parameters, then each remaining rank alone.
    template <class F>
    void for_rows(const PartitionPlan::Tensor& t, size_t c0, size_t len, F f) const {
        const int N = plan_.world();
        const size_t n = t.slice.n;
        int full = n >= c0 + len ? (int)std::min<size_t>(N, (n - c0 - len) / t.chunk + 1) : 0;
        if (full > 0) f(0, full, len);
        for (int r = full; r < N; r++) {
            size_t start = std::min(n, r * t.chunk + c0);
            f(r, 1, std::min(len, n - start));
        }
    }
    // for_each_tensor, cut to the real parameters (no padding) of this rank's chunks
    template <class F>
    void for_each_mine(const Piece& p, F f) const {
        for_each_tensor(p, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            const size_t unpadded = PartitionPlan::unpadded(t, rank_);
            if (unpadded > c0) f(t, c0, at, std::min(len, unpadded - c0));
        });
    }

    const PartitionPlan& plan_;
    int rank_;
    size_t max_ = 0;
};
