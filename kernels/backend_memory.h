// What a backend allocates besides the buffers the model and zero/ ask for: what its context
// keeps (CUDA: cuBLASLt's workspace), the scratch its ops share, and the pinned host buffers the
// batches are uploaded through. A run reserves them up front for the largest shapes its ops will
// see (Backend::reserve), so no step allocates, and a memory plan (train/memory_plan.h) knows
// them before anything exists (Backend::planned_memory).
#pragma once
#include <cstddef>

// the largest shapes a run's ops see: the model's at B x T (an evaluation's batches are no larger)
struct OpShapes {
    int B, T, C, NH;
    int widest_bias;            // the widest matmul whose bias gradient is summed (GPT-2: 4C)
    size_t largest_conversion;  // elements of the largest tensor converted between fp32 and floatX
    size_t largest_upload;      // bytes of the largest batch upload (tokens or targets)
};

struct BackendMemory {
    size_t context = 0;         // device: what the context keeps for its whole life
    size_t kernel_scratch = 0;  // device: the scratch the ops share
    size_t pinned_uploads = 0;  // host: the pinned buffers the batches go through
    size_t device_allocations = 0;  // how many allocations the device bytes are
};
