// What the MLP block's backward (each backend's mlp_backward) writes: the gradients of fc's and of
// its projection's weights and biases. They are added to, or written over where they still hold
// zeros (`zeroed`: the group's first backward since its gradients were zeroed, zero/'s
// grads_zeroed), which lets a backend take a bias gradient inside a GEMM that can only write it.
#pragma once

template <class floatX>
struct MlpGrads {
    floatX *w_fc, *b_fc, *w_proj, *b_proj;
    bool zeroed;
};
