// The partition plan: how the flat parameter buffer is cut into shards, one per rank.
//
// The model describes its parameters as groups of tensors (the embedding, each layer, the final
// layernorm); a group is the unit of communication (a bucket). Each tensor of n elements is cut
// into `world` chunks of ceil(n / world) elements; rank r owns chunk r of every tensor, the last
// chunks padded with zeros. Because the cut is per tensor, any world size works and a shard can
// be mapped back to tensors (and re-sharded) without knowing how it was made.
//
// A rank's shard lays its chunks out group by group, tensor by tensor. A group's slice of the
// shard is contiguous, so one reduce-scatter or all-gather of a rank-major buffer of
// world * group_shard elements moves a whole group.
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "../common/tensor_slice.h"
#include "../kernels/shard_table.h"

class PartitionPlan {
public:
    struct Tensor {
        TensorSlice slice;
        size_t chunk;         // elements per rank, ceil(n / world)
        size_t shard_offset;  // of this tensor's chunk within a rank's shard
        size_t group_offset;  // in the group's unsharded, unpadded layout
    };
    struct Group {
        std::vector<Tensor> tensors;
        size_t shard_offset = 0, shard_size = 0;  // slice of the shard
        size_t size = 0;                          // unsharded elements
    };

    PartitionPlan(const std::vector<std::vector<TensorSlice>>& groups, int world) : world_(world) {
        for (const auto& slices : groups) {
            Group g;
            g.shard_offset = shard_size_;
            for (const TensorSlice& s : slices) {
                size_t chunk = (s.n + world - 1) / world;
                g.tensors.push_back({s, chunk, shard_size_, g.size});
                shard_size_ += chunk;
                g.shard_size += chunk;
                g.size += s.n;
                total_ += s.n;
            }
            groups_.push_back(g);
        }
    }

    int world() const { return world_; }
    size_t total() const { return total_; }            // Psi: parameters in the model
    size_t shard_size() const { return shard_size_; }  // elements each rank owns, padding included
    int num_groups() const { return (int)groups_.size(); }
    const Group& group(int g) const { return groups_[g]; }
    // elements of rank r's chunk of t that hold real parameters (the rest is padding)
    static size_t unpadded(const Tensor& t, int r) {
        size_t start = std::min(t.slice.n, (size_t)r * t.chunk);
        return std::min(t.chunk, t.slice.n - start);
    }

    // Rank r's pieces of every tensor in shard order, for the optimizer's launches. The
    // parameters sit in the flat full-size buffer when full_params, else in the shard, and so do
    // the gradients by full_grads; Adam state is always in the shard.
    std::vector<ShardTensor> shard_table(int r, bool full_params, bool full_grads) const {
        std::vector<ShardTensor> table;
        size_t start = 0;
        for (const Group& g : groups_)
            for (const Tensor& t : g.tensors) {
                const size_t n = unpadded(t, r), flat = t.slice.offset + (size_t)r * t.chunk;
                if (n == 0) continue;
                table.push_back({start, n, full_params ? flat : t.shard_offset, full_grads ? flat : t.shard_offset,
                                 t.shard_offset, flat, t.slice.decay ? 1 : 0});
                start += n;
            }
        return table;
    }

private:
    int world_;
    std::vector<Group> groups_;
    size_t total_ = 0, shard_size_ = 0;
};
