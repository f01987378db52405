// What the GPU micro-benchmarks in scripts/ share: operands filled on the device and a median
// timed with CUDA events.
#pragma once
#include <algorithm>
#include <vector>

#include "kernels/cuda_backend.cuh"

// reproducible values in [-1, 1) from a hash of the index: no host generation of 100s of MB
__global__ void fill_kernel(gpu::floatX* x, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (gpu::floatX)((float)(random_u32(seed, i) >> 8) * (2.0f / 16777216.0f) - 1.0f);
}
inline gpu::floatX* random_device(size_t n, uint32_t seed) {
    gpu::floatX* p = (gpu::floatX*)CudaBackend::alloc(n * sizeof(gpu::floatX));
    fill_kernel<<<gpu::elementwise_blocks(n, 256), 256, 0, gpu::stream()>>>(p, n, seed);
    gpu::check_launch();
    return p;
}

// median of `runs` timed calls of run() after 3 untimed ones
template <class F>
float median_ms(F run, int runs = 20) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++) run();
    std::vector<float> ms;
    for (int i = 0; i < runs; i++) {
        CUDA_CHECK(cudaEventRecord(start, gpu::stream()));
        run();
        CUDA_CHECK(cudaEventRecord(stop, gpu::stream()));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

inline double tflops(double flop, float ms) { return flop / (ms * 1e-3) / 1e12; }
