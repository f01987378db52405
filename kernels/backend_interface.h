// The operations a backend provides (kernels/cpu_backend.h, kernels/cuda_backend.cuh), each with
// its signature, in one list: the model, zero/ and the trainer call only these, and a backend that
// gains, loses or changes one without the other no longer compiles (each backend's header checks
// itself against it). What each does is said where the CPU backend defines it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "adamw_step.h"
#include "backend_memory.h"
#include "fp8_scaling.h"
#include "gemm_choices.h"
#include "mlp_grads.h"
#include "quantize_blocks.h"
#include "shard_table.h"

template <class B>
struct BackendInterface {
    using X = typename B::floatX;
    static_assert(std::is_same_v<decltype(B::name), const char* const>, "name");
    static_assert(std::is_same_v<decltype(B::params_narrower_than_fp32), const bool>, "params_narrower_than_fp32");
    static_assert(std::is_same_v<decltype(B::device_is_host), const bool>, "device_is_host");
    static_assert(std::is_same_v<decltype(B::run_captured(std::declval<typename B::CapturedWork&>(), std::declval<void (&)()>())), void>, "run_captured");
    static_assert(std::is_same_v<decltype(&B::device_name), std::string (*)()>, "device_name");
    static_assert(std::is_same_v<decltype(&B::attention_kernels), std::string (*)(int, int)>, "attention_kernels");
    static_assert(std::is_same_v<decltype(&B::alloc), void* (*)(size_t)>, "alloc");
    static_assert(std::is_same_v<decltype(&B::release), void (*)(void*)>, "release");
    static_assert(std::is_same_v<decltype(&B::to_host), void (*)(void*, const void*, size_t)>, "to_host");
    static_assert(std::is_same_v<decltype(&B::from_host), void (*)(void*, const void*, size_t)>, "from_host");
    static_assert(std::is_same_v<decltype(&B::from_host_pinned), void (*)(void*, const void*, size_t)>, "from_host_pinned");
    static_assert(std::is_same_v<decltype(&B::copy), void (*)(void*, const void*, size_t)>, "copy");
    static_assert(std::is_same_v<decltype(&B::zero), void (*)(void*, size_t)>, "zero");
    static_assert(std::is_same_v<decltype(&B::copy2d), void (*)(void*, size_t, const void*, size_t, size_t, size_t)>, "copy2d");
    static_assert(std::is_same_v<decltype(&B::synchronize), void (*)()>, "synchronize");
    static_assert(std::is_same_v<decltype(&B::launches), uint64_t (*)()>, "launches");
    static_assert(std::is_same_v<decltype(&B::profiler_start), void (*)()>, "profiler_start");
    static_assert(std::is_same_v<decltype(&B::profiler_stop), void (*)()>, "profiler_stop");
    static_assert(std::is_same_v<decltype(&B::accumulate), void (*)(X*, const X*, size_t)>, "accumulate");
    static_assert(std::is_same_v<decltype(&B::upload_fp32), void (*)(X*, const float*, size_t)>, "upload_fp32");
    static_assert(std::is_same_v<decltype(&B::download_fp32), void (*)(float*, const X*, size_t)>, "download_fp32");
    static_assert(std::is_same_v<decltype(&B::encoder_forward), void (*)(X*, const int*, const X*, const X*, int, int, int)>, "encoder_forward");
    static_assert(std::is_same_v<decltype(&B::encoder_backward), void (*)(X*, X*, const X*, const int*, int, int, int)>, "encoder_backward");
    static_assert(std::is_same_v<decltype(&B::layernorm_forward), void (*)(X*, float*, float*, const X*, const X*, const X*, int, int)>, "layernorm_forward");
    static_assert(std::is_same_v<decltype(&B::residual_layernorm_forward), void (*)(X*, X*, float*, float*, const X*, const X*, const X*, const X*, int, int)>, "residual_layernorm_forward");
    static_assert(std::is_same_v<decltype(&B::layernorm_backward), void (*)(X*, X*, X*, const X*, const X*, const X*, const float*, const float*, int, int)>, "layernorm_backward");
    static_assert(std::is_same_v<decltype(&B::matmul_forward), void (*)(X*, const X*, const X*, const X*, int, int, int)>, "matmul_forward");
    static_assert(std::is_same_v<decltype(&B::matmul_backward), void (*)(X*, X*, X*, const X*, const X*, const X*, int, int, int, bool)>, "matmul_backward");
    static_assert(std::is_same_v<decltype(&B::matmul_gelu_forward), void (*)(X*, X*, const X*, const X*, const X*, int, int, int)>, "matmul_gelu_forward");
    static_assert(std::is_same_v<decltype(&B::use_gemm_choices), std::string (*)(const GemmChoices&)>, "use_gemm_choices");
    static_assert(std::is_same_v<decltype(&B::mlp_backward), void (*)(X*, X*, const X*, const X*, const X*, const X*, const X*, const X*, const MlpGrads<X>&, int, int)>, "mlp_backward");
    using F = const Fp8Workspace<typename B::Fp8Copy>&;
    static_assert(std::is_same_v<decltype(B::fp8_gemms_take_transposed), const bool>, "fp8_gemms_take_transposed");
    static_assert(std::is_same_v<decltype(&B::fp8_refusal), std::string (*)()>, "fp8_refusal");
    static_assert(std::is_same_v<decltype(&B::fp8_matmul_forward), void (*)(X*, const X*, const X*, const X*, int, int, int, F)>, "fp8_matmul_forward");
    static_assert(std::is_same_v<decltype(&B::fp8_matmul_gelu_forward), void (*)(X*, X*, const X*, const X*, const X*, int, int, int, F)>, "fp8_matmul_gelu_forward");
    static_assert(std::is_same_v<decltype(&B::fp8_matmul_backward), void (*)(X*, X*, X*, const X*, const X*, const X*, int, int, int, bool, F)>, "fp8_matmul_backward");
    static_assert(std::is_same_v<decltype(&B::fp8_mlp_backward), void (*)(X*, X*, const X*, const X*, const X*, const X*, const X*, const X*, const MlpGrads<X>&, int, int, F)>, "fp8_mlp_backward");
    static_assert(std::is_same_v<decltype(&B::attention_saved_floats), size_t (*)(int, int, int)>, "attention_saved_floats");
    static_assert(std::is_same_v<decltype(&B::attention_forward), void (*)(X*, float*, const X*, int, int, int, int)>, "attention_forward");
    static_assert(std::is_same_v<decltype(&B::attention_backward), void (*)(X*, const X*, const X*, const X*, const float*, int, int, int, int)>, "attention_backward");
    static_assert(std::is_same_v<decltype(&B::gelu_forward), void (*)(X*, const X*, size_t)>, "gelu_forward");
    static_assert(std::is_same_v<decltype(&B::gelu_backward), void (*)(X*, const X*, size_t)>, "gelu_backward");
    static_assert(std::is_same_v<decltype(&B::fused_classifier), void (*)(X*, float*, const int*, float, int, int, int)>, "fused_classifier");
    static_assert(std::is_same_v<decltype(&B::mean_loss_add), void (*)(double*, const float*, int)>, "mean_loss_add");
    static_assert(std::is_same_v<decltype(&B::adamw_update), void (*)(X*, float*, const X*, float*, float*, const ShardTable&, const AdamWStep&)>, "adamw_update");
    static_assert(std::is_same_v<decltype(&B::grad_norm_squared), void (*)(float*, const X*, const ShardTable&)>, "grad_norm_squared");
    static_assert(std::is_same_v<decltype(&B::quantize_int8), void (*)(uint8_t*, const X*, const QuantRows&, int)>, "quantize_int8");
    static_assert(std::is_same_v<decltype(&B::dequantize_int8), void (*)(X*, const uint8_t*, const QuantRows&, int)>, "dequantize_int8");
    static_assert(std::is_same_v<decltype(&B::dequantize_sum_int8), void (*)(X*, const uint8_t*, const QuantRows&, int)>, "dequantize_sum_int8");
    static_assert(std::is_same_v<decltype(&B::alloc_pinned), void* (*)(size_t)>, "alloc_pinned");
    static_assert(std::is_same_v<decltype(&B::release_pinned), void (*)(void*)>, "release_pinned");
    static_assert(std::is_same_v<decltype(&B::transfers_after_kernels), void (*)()>, "transfers_after_kernels");
    static_assert(std::is_same_v<decltype(&B::kernels_after_transfers), void (*)()>, "kernels_after_transfers");
    static_assert(std::is_same_v<decltype(&B::transfer_to_host), void (*)(void*, const void*, size_t)>, "transfer_to_host");
    static_assert(std::is_same_v<decltype(&B::transfer_from_host), void (*)(void*, const void*, size_t)>, "transfer_from_host");
    static_assert(std::is_same_v<decltype(&B::transfer_mark), uint64_t (*)()>, "transfer_mark");
    static_assert(std::is_same_v<decltype(&B::transfer_wait), void (*)(uint64_t)>, "transfer_wait");
    static_assert(std::is_same_v<decltype(&B::adamw_update_host), void (*)(X*, float*, const X*, float*, float*, const ShardTensor*, int, const AdamWStep&)>, "adamw_update_host");
    static_assert(std::is_same_v<decltype(&B::device_memory_in_use), size_t (*)()>, "device_memory_in_use");
    static_assert(std::is_same_v<decltype(&B::device_memory_taken), size_t (*)()>, "device_memory_taken");
    static_assert(std::is_same_v<decltype(&B::planned_memory), BackendMemory (*)(const OpShapes&)>, "planned_memory");
    static_assert(std::is_same_v<decltype(&B::reserve), void (*)(const OpShapes&)>, "reserve");
    static_assert(std::is_same_v<decltype(&B::memory), BackendMemory (*)()>, "memory");
};
