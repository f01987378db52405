// The optimizer's view of a rank's shard, for one AdamW launch and one gradient-norm launch over
// all of it: a table with one entry per tensor the rank owns a piece of. Each entry says where
// that piece's parameters, gradients and Adam state sit (offsets from their buffers' bases, which
// differ by ZeRO stage) and which parameters of the flat model they are. Stochastic rounding
// (common/bf16.h) is keyed by that flat index, so every stage and world size rounds each
// parameter alike.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../common/bf16.h"

struct ShardTensor {
    size_t start;          // first element's position among the launch's elements (running sum of n)
    size_t n;
    size_t param_offset;   // from the parameter buffer
    size_t grad_offset;    // from the gradient buffer
    size_t state_offset;   // from the Adam m, v and master buffers
    uint64_t flat_index;   // first element's index in the model's flat parameters
    int decay;             // 1: AdamW weight decay applies
};

// the entries in host memory and the same in backend memory (where the kernels read them)
struct ShardTable {
    const ShardTensor* host = nullptr;
    const ShardTensor* device = nullptr;
    int count = 0;
    size_t elements = 0;  // sum of n
};

// which random number rounds element i of entry t: its place in the model, not in the shard
HOST_DEVICE inline uint64_t rounding_index(const ShardTensor& t, size_t i) { return t.flat_index + i; }

#ifdef __CUDACC__
// The table entry holding element e: *j < 0 finds it by bisection, later calls walk on from
// there (a thread's elements only grow, and the table has one entry per tensor, 580 at d48).
__device__ inline const ShardTensor& entry_of(const ShardTensor* table, int count, size_t e, int* j) {
    if (*j < 0) {
        int lo = 0, hi = count - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (table[mid].start <= e) lo = mid;
            else hi = mid - 1;
        }
        *j = lo;
    }
    while (table[*j].start + table[*j].n <= e) ++*j;
    return table[*j];
}
#endif
