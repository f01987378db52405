// bf16, the top 16 bits of an fp32, as bits (uint16_t) on the host and in the kernels: widening,
// rounding to nearest even (checkpoints, the MPI sum of bf16 gradients), and stochastic rounding
// (AdamW's parameter update on the GPU and on the host, for ZeRO-Offload).
#pragma once
#include <cstdint>
#include <cstring>

#include "host_device.h"

inline float bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// round to nearest, ties to even; exact for values that are bf16 already (a bf16 build's)
inline uint16_t float_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// Stochastic rounding, the same on the GPU (kernels/cuda/adamw.cuh) and on the host
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
