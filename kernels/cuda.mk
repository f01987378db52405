# CUDA build fragment: `include kernels/cuda.mk` from the Makefile, or run it on its own, which
# checks no prerequisites (scripts/gpu_check.sh does so on a machine without a package manager):
#   make -f kernels/cuda.mk train_gpt [PRECISION=FP32] [NO_MPI=1] [NO_BLAS=1] [GPU_ARCHS="80 90"]
#   make -f kernels/cuda.mk test/test_kernels_cuda test/test_kernels_cuda_fp32 test/test_zero_cuda test/bench_kernels_cuda ...
#   make -f kernels/cuda.mk KERNELS=candidate build/candidate/train_gpt build/candidate/test/test_kernels_cuda ...
#   ... [NCCL_HOME=DIR] [NVCC_WERROR=]
# test/test_kernels_cuda and test/test_zero_cuda follow PRECISION (bf16 by default), their *_fp32
# twins are always fp32: each precision its own file, built once. GPU_ARCHS defaults to sm_80 and
# sm_90 plus whatever nvidia-smi reports here; each extra arch adds roughly the device-compile
# time of one again.
NVCC ?= nvcc
MPICXX ?= mpicxx
PRECISION ?= BF16
NVIDIA_SMI_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ')
GPU_ARCHS ?= $(sort 80 90 $(NVIDIA_SMI_ARCH))
NVCC_ARCH_FLAGS = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))

ifeq ($(PRECISION),FP32)
  NVCC_PRECISION = -DENABLE_FP32
else ifeq ($(PRECISION),BF16)
  NVCC_PRECISION =
else
  $(error PRECISION must be BF16 or FP32, not $(PRECISION))
endif

# KERNELS=candidate compiles the kernels that no GPU has run yet (#ifdef KERNELS_CANDIDATE in
# kernels/cuda/) in place of the default ones, into build/candidate/ under the same names. Once a
# GPU run shows a candidate correct and faster it becomes the default and the old kernel goes.
KERNELS ?= default
# The candidate build compiles sm_90 as sm_90a (wgmma and setmaxnreg exist only there; every
# sm_90 GPU runs it), for flash_attention_hopper.cuh.
ifeq ($(KERNELS),candidate)
  NVCC_KERNELS = -DKERNELS_CANDIDATE
  CUDA_OUT = build/candidate/
  CUDA_ARCHS = $(patsubst 90,90a,$(GPU_ARCHS))
else ifeq ($(KERNELS),default)
  NVCC_KERNELS =
  CUDA_OUT =
  CUDA_ARCHS = $(GPU_ARCHS)
else
  $(error KERNELS must be default or candidate, not $(KERNELS))
endif
# the headers that hold a candidate kernel: with none, the candidate build is the default one
KERNEL_CANDIDATES := $(shell grep -l KERNELS_CANDIDATE kernels/cuda/*.cuh 2>/dev/null)

# NCCL from the toolkit or the system, or from NCCL_HOME (include/, lib/) found by its rpath; a
# lib/ with only libnccl.so.2 (PyTorch's wheel has no libnccl.so) is linked by that full name
ifneq ($(NCCL_HOME),)
  NVCC_NCCL_CFLAGS = -I$(NCCL_HOME)/include
  NVCC_NCCL_LIBS = -L$(NCCL_HOME)/lib -Xlinker -rpath=$(abspath $(NCCL_HOME)/lib) $(if $(wildcard $(NCCL_HOME)/lib/libnccl.so),-lnccl,-l:libnccl.so.2)
else
  NVCC_NCCL_LIBS = -lnccl
endif
ifeq ($(NO_MPI),1)
  NVCC_MPI_CFLAGS = -DNO_MPI
  NVCC_MPI_LIBS =
else
  NVCC_MPI_CFLAGS = -DOMPI_SKIP_MPICXX $(shell $(MPICXX) --showme:compile) $(NVCC_NCCL_CFLAGS)
  NVCC_MPI_LIBS = $(shell $(MPICXX) --showme:link) $(NVCC_NCCL_LIBS)
endif

# host warnings as the CPU build has them; nvcc's own warnings are errors
NVCC_HOST_FLAGS = -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-fopenmp,-march=native,-fno-math-errno
include kernels/blas.mk
# NVCC_WERROR= turns nvcc's warnings back into warnings (scripts/gpu_check.sh: another toolkit
# version may warn where this one does not, and it reports them rather than fail the build)
NVCC_WERROR ?= -Werror all-warnings
# -lineinfo: compute-sanitizer and Nsight Compute name the source line of a kernel's fault
NVCC_FLAGS = -x cu -std=c++17 -O3 -lineinfo -I. $(NVCC_ARCH_FLAGS) $(NVCC_PRECISION) $(NVCC_KERNELS) $(BLAS_CFLAGS) $(NVCC_HOST_FLAGS) $(NVCC_WERROR)
NVCC_LIBS = -lcublasLt -lcublas $(BLAS_LIBS)
# everything train_gpt.cu needs from nvcc: `$(NVCC) $(NVCC_TRAIN_FLAGS) train_gpt.cu -o ... $(NVCC_TRAIN_LIBS)`
NVCC_TRAIN_FLAGS = $(NVCC_FLAGS) $(NVCC_MPI_CFLAGS)
NVCC_TRAIN_LIBS = $(NVCC_LIBS) $(NVCC_MPI_LIBS)

CUDA_HEADERS = $(wildcard common/*.h model/*.h kernels/*.h kernels/*.cuh kernels/cpu/*.h kernels/cuda/*.cuh zero/*.h data/*.h train/*.h)

# GoogleTest from the system, or from GTEST_ROOT (include/, lib/) as a system header directory
GTEST_FLAGS = $(if $(GTEST_ROOT),-isystem $(GTEST_ROOT)/include -L$(GTEST_ROOT)/lib) -lgtest -lpthread

CUDA_TESTS = $(addprefix $(CUDA_OUT)test/,test_kernels_cuda test_kernels_cuda_fp32 test_zero_cuda test_zero_cuda_fp32)
$(CUDA_OUT)test/test_kernels_cuda_fp32 $(CUDA_OUT)test/test_zero_cuda_fp32: NVCC_PRECISION = -DENABLE_FP32
$(CUDA_OUT)test/test_kernels_cuda $(CUDA_OUT)test/test_kernels_cuda_fp32: test/test_kernels_cuda.cu test/test_util.h test/tolerance.h test/zipf_tokens.h train_gpt.cu $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_TRAIN_FLAGS) $< -o $@ $(NVCC_TRAIN_LIBS) $(GTEST_FLAGS)

# the per-kernel benchmark at d12's shapes (scripts/bench_gpu.sh runs it)
$(CUDA_OUT)test/bench_kernels_cuda: test/bench_kernels_cuda.cu test/zipf_tokens.h $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -DNO_MPI $< -o $@ $(NVCC_LIBS)

# the ZeRO tests on the CUDA backend, ranks sharing one GPU (scripts/gpu_check.sh runs them)
$(CUDA_OUT)test/test_zero_cuda $(CUDA_OUT)test/test_zero_cuda_fp32: test/test_zero.cpp test/test_util.h test/tolerance.h test/recording_comm.h train_gpt.cu $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_TRAIN_FLAGS) $< -o $@ $(NVCC_TRAIN_LIBS) $(GTEST_FLAGS)

# attention alone, and the step's GEMMs with each algorithm cuBLASLt offers, at the training
# shapes (scripts/bench_gpu.sh runs them)
$(CUDA_OUT)scripts/bench_attention $(CUDA_OUT)scripts/bench_gemm: $(CUDA_OUT)scripts/%: scripts/%.cu scripts/bench_cuda.cuh $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $< -o $@ $(NVCC_LIBS)

# a CUDA injection library (CUPTI's activity API) that records each kernel's start and end during a
# real run, for scripts/step_trace.py (scripts/bench_gpu.sh traces a d12 step with it). Host code
# alone, its warnings errors as nvcc's are (NVCC_WERROR). CUPTI's header and library each from the
# first place that has them: CUPTI_HOME (include/, lib64/ or lib/), the toolkit (itself, extras/CUPTI/,
# targets/x86_64-linux/), PyTorch's wheels
CUDA_ROOT := $(patsubst %/bin/nvcc,%,$(realpath $(shell command -v $(NVCC) 2>/dev/null)))
CUPTI_PLACES = $(CUPTI_HOME) $(CUDA_ROOT) $(CUDA_ROOT)/extras/CUPTI $(CUDA_ROOT)/targets/x86_64-linux \
    $(wildcard /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13 /opt/*/.venv/lib/python3*/site-packages/nvidia/cuda_cupti)
CUPTI_INCLUDE := $(firstword $(patsubst %/cupti_activity.h,%,$(wildcard $(addsuffix /include/cupti_activity.h,$(CUPTI_PLACES)))))
CUPTI_LIB_DIR := $(firstword $(patsubst %/,%,$(dir $(wildcard $(foreach p,$(CUPTI_PLACES),$(p)/lib64/libcupti.so* $(p)/lib/libcupti.so*)))))
CUPTI_LIBS = -L$(CUPTI_LIB_DIR) -Wl,-rpath,$(CUPTI_LIB_DIR) $(if $(wildcard $(CUPTI_LIB_DIR)/libcupti.so),-lcupti,-l:$(notdir $(firstword $(wildcard $(CUPTI_LIB_DIR)/libcupti.so.*))))
$(CUDA_OUT)scripts/kernel_trace.so: scripts/kernel_trace.cpp
	@if [ -z "$(CUPTI_INCLUDE)" ] || [ -z "$(CUPTI_LIB_DIR)" ]; then echo "error: $@ needs CUPTI: include/cupti_activity.h$(if $(CUPTI_INCLUDE), (found in $(CUPTI_INCLUDE))) and lib64/ or lib/libcupti.so*$(if $(CUPTI_LIB_DIR), (found in $(CUPTI_LIB_DIR))) under CUPTI_HOME, $(CUDA_ROOT), its extras/CUPTI or targets/x86_64-linux, or a wheel's nvidia/cu13 or nvidia/cuda_cupti" >&2; exit 1; fi
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -O2 -shared -fPIC -Wall -Wextra $(if $(NVCC_WERROR),-Werror) -I$(CUPTI_INCLUDE) -I$(CUDA_ROOT)/include $< -o $@ $(CUPTI_LIBS)
# its lines from records made up on the host, for test/test_step_trace.py (no GPU needed)
test/kernel_trace_records: test/kernel_trace_records.cpp scripts/kernel_trace.cpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra $(if $(NVCC_WERROR),-Werror) -I. -I$(CUPTI_INCLUDE) -I$(CUDA_ROOT)/include $< -o $@ $(CUPTI_LIBS)

# the Makefile adds its prerequisites check to this rule
$(CUDA_OUT)train_gpt: train_gpt.cu $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_TRAIN_FLAGS) $< -o $@ $(NVCC_TRAIN_LIBS)

.PHONY: cuda-clean
cuda-clean:
	rm -f $(CUDA_TESTS) $(CUDA_OUT)test/bench_kernels_cuda $(CUDA_OUT)train_gpt $(CUDA_OUT)scripts/bench_attention $(CUDA_OUT)scripts/bench_gemm $(CUDA_OUT)scripts/kernel_trace.so test/kernel_trace_records
	rm -rf build/candidate
