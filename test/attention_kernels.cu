// The attention kernels alone, for test/test_attention_build.sh: one function that launches each,
// so that nvcc compiles every kernel the bf16 and fp32 builds use.
#include "kernels/cuda/attention.cuh"

void launch_every_attention_kernel(gpu::floatX* out, float* lse, const gpu::floatX* qkv, gpu::floatX* dqkv,
                                   const gpu::floatX* dout, int B, int T, int C, int NH) {
    gpu::attention_forward(out, lse, qkv, B, T, C, NH);
    gpu::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
}
