// HOST_DEVICE marks a function that the CUDA kernels and the host (CPU backend, tests) both run:
// one definition, so the two cannot drift apart.
#pragma once
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif
