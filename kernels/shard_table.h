// The optimizer's view of a rank's shard, for one AdamW launch and one gradient-norm launch over
// all of it: a table with one entry per tensor the rank owns a piece of. Each entry says where
// that piece's parameters, gradients and Adam state sit (offsets from their buffers' bases, which
// differ by ZeRO stage) and which parameters of the flat model they are. Stochastic rounding is
// keyed by that flat index, so every stage and world size rounds each parameter alike.
#pragma once
#include <cstddef>
#include <cstdint>

#include "host_device.h"

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

// Stochastic rounding to bf16, the same on the GPU (kernels/cuda/adamw.cuh) and on the host
// (kernels/cpu/adamw.h, for ZeRO-Offload): add 16 random bits below bf16's last mantissa bit,
// then truncate. The value rounds up with probability equal to how far it is towards the next
// bf16, so repeated tiny AdamW updates are not all lost. The random bits come from a hash of
// (seed, index): the same seed reproduces the same rounding, with no RNG state to carry.
HOST_DEVICE inline uint32_t hash_u32(uint32_t x) {  // "lowbias32" integer mixer
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
// the index's high half is hashed apart (`high` = hash_u32(seed ^ (index >> 32))), so that a loop
// over indices with one high half hashes 32-bit lanes only
HOST_DEVICE inline uint32_t random_u32_from(uint32_t high, uint32_t index_low) {
    return hash_u32(index_low * 0x9E3779B9u + high);
}
HOST_DEVICE inline uint32_t random_u32(uint32_t seed, uint64_t index) {
    return random_u32_from(hash_u32(seed ^ (uint32_t)(index >> 32)), (uint32_t)index);
}
// bf16 bits of the float with bits x, rounded with `random`'s low 16 bits; infinities stay,
// NaN becomes bf16's quiet NaN
HOST_DEVICE inline uint16_t bf16_round_stochastic(uint32_t x, uint32_t random) {
    if ((x & 0x7fffffffu) >= 0x7f800000u) return (x & 0x7fffffffu) > 0x7f800000u ? 0x7fff : (uint16_t)(x >> 16);
    return (uint16_t)((x + (random & 0xffffu)) >> 16);
}

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
