// One attention block works on one (batch row b, head h) pair; the pairs ride in the grid's y and z.
#pragma once
#include "common.cuh"

namespace gpu {

// The (b, h) pairs ride in gridDim.y and gridDim.z together, since either alone holds at most
// 65535 (and -b goes to 65536); blocks past B * NH in the last z row do nothing.
inline dim3 attention_grid(int tiles, int B, int NH) {
    const size_t heads = (size_t)B * NH, y = heads < 65535 ? heads : 65535;
    return dim3(tiles, (unsigned)y, (unsigned)((heads + y - 1) / y));
}
__device__ inline bool head_of_block(int NH, int B, int* b, int* h) {
    const size_t bh = blockIdx.y + (size_t)blockIdx.z * gridDim.y;
    if (bh >= (size_t)B * NH) return false;
    *b = (int)(bh / NH);
    *h = (int)(bh % NH);
    return true;
}


}  // namespace gpu
