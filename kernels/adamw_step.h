// One AdamW step's constants, the same on every rank: made by train_step() and handed through
// zero/ (and its offload) to the update kernels of both backends (kernels/cpu/adamw.h,
// kernels/cuda/adamw.cuh) as they are.
#pragma once
#include <cmath>
#include <cstdint>

#include "../common/host_device.h"

struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // gradient clipping folded into the update: clip_scale() of the global norm
    int t;             // the step's number, from 1 (bias correction)
    uint32_t seed;     // stochastic rounding (bf16 parameters only)
};

// One element's AdamW update, the formula both backends' kernels share: the moments m and v take
// the gradient g (clipping already folded in), and the parameter p is returned updated, weight
// decay wd (0 where the tensor does not decay) decoupled from the gradient. bc1, bc2: the step's
// bias corrections, 1 - beta^t.
HOST_DEVICE inline float adamw_element(float p, float g, float& m, float& v, float lr, float beta1, float beta2, float bc1, float bc2,
                                       float eps, float wd) {
    const float mi = beta1 * m + (1.0f - beta1) * g, vi = beta2 * v + (1.0f - beta2) * g * g;
    m = mi;
    v = vi;
    return p - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * p);
}

// clipping by the global gradient norm (grad_clip 0: off), as one factor on every gradient
inline float clip_scale(float norm, float grad_clip) { return (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f; }
