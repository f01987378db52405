// A tensor's place in the flat parameter buffer: how the model describes its parameters
// (model/shape.h's param_groups) and how zero/ takes them (zero/partition.h).
#pragma once
#include <cstddef>

struct TensorSlice {
    size_t offset;  // in the flat (unsharded) parameter buffer
    size_t n;
    bool decay;     // AdamW weight decay applies (2-D weights)
};
