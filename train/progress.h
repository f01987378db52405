// What the step line says about progress: elapsed time, time to go, and on a GPU the model
// FLOPs utilisation (MFU) as llm.c estimates it.
#pragma once
#include <cstdio>
#include <string>

// llm.c's count (Kaplan et al. 2020, section 2.1): 6 FLOPs per parameter and token for the
// weight matmuls forward and backward, plus 6*L*C*T for attention's own matmuls. N includes the
// (tied, padded) embedding, the layernorms and biases, as llm.c's does.
inline double flops_per_token(size_t num_params, int L, int C, int T) {
    return 6.0 * (double)num_params + 6.0 * L * C * (double)T;
}

// Dense peak FLOP/s of the GPU named `device`: bf16 tensor cores, or fp32 without TF32 for the
// fp32 build. The name is matched whole, as CUDA gives it (cudaDeviceProp::name, the name
// nvidia-smi prints) and as llm.c's table matches it: part of a name tells GPUs apart no better
// than a guess ("NVIDIA L40" contains "L4", "NVIDIA H100 NVL" contains "H100"). 0 when the GPU
// is not in the table: MFU n/a.
inline double peak_flops(const std::string& device, bool bf16) {
    struct Peak { const char* name; double bf16, fp32; };  // TFLOP/s, dense, from the vendors' data sheets
    static const Peak peaks[] = {
        {"NVIDIA H100 80GB HBM3", 989, 67},  // SXM
        {"NVIDIA H100 PCIe", 756, 51},
        {"NVIDIA H100 NVL", 835, 60},
        {"NVIDIA H200", 989, 67},  // SXM
        {"NVIDIA H200 NVL", 835, 60},
        {"NVIDIA GH200 480GB", 989, 67},
        {"NVIDIA A100-SXM4-40GB", 312, 19.5},
        {"NVIDIA A100-SXM4-80GB", 312, 19.5},
        {"NVIDIA A100-PCIE-40GB", 312, 19.5},
        {"NVIDIA A100 80GB PCIe", 312, 19.5},
        {"NVIDIA L40S", 362, 91.6},
        {"NVIDIA L40", 181, 90.5},
        {"NVIDIA L4", 121, 30.3},
        {"NVIDIA GeForce RTX 4090", 165.2, 82.6},
    };
    for (const Peak& p : peaks)
        if (device == p.name) return (bf16 ? p.bf16 : p.fp32) * 1e12;
    return 0.0;
}

// 75 s -> "1m15s", 3725 s -> "1h02m05s"
inline std::string format_duration(double seconds) {
    const long s = seconds > 0 ? (long)(seconds + 0.5) : 0;
    char out[32];
    if (s >= 3600) snprintf(out, sizeof(out), "%ldh%02ldm%02lds", s / 3600, s / 60 % 60, s % 60);
    else if (s >= 60) snprintf(out, sizeof(out), "%ldm%02lds", s / 60, s % 60);
    else snprintf(out, sizeof(out), "%lds", s);
    return out;
}

// seconds left for `left` steps, at the mean pace of the `done` steps that took `elapsed`
inline double eta_seconds(double elapsed, int done, int left) { return done > 0 ? elapsed / done * left : 0.0; }
