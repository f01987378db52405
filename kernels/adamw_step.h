// One AdamW step's constants, the same on every rank: made by train_step() and handed through
// zero/ (and its offload) to the update kernels of both backends (kernels/cpu/adamw.h,
// kernels/cuda/adamw.cuh) as they are.
#pragma once
#include <cstdint>

struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // gradient clipping folded into the update: clip_scale() of the global norm
    int t;             // the step's number, from 1 (bias correction)
    uint32_t seed;     // stochastic rounding (bf16 parameters only)
};

// clipping by the global gradient norm (grad_clip 0: off), as one factor on every gradient
inline float clip_scale(float norm, float grad_clip) { return (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f; }
