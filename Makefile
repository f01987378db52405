# make            train_gpt (CPU backend; with nvcc present also the CUDA backend, see issue notes)
# make test       the whole test suite (CPU; GPU tests run where a GPU is present)
# make bench      CPU benchmark (d12, B=4, T=64, one rank)
# make data       Tiny Shakespeare token shards + tokenizer from ../shared/data where present, else
#                 downloaded (SHARED=DIR: another folder with tinyshakespeare/ and gpt2/ in it)
# make gpu-rehearsal  scripts/gpu_check.sh in a sandbox shaped like the GPU machine (root; minutes)
CXX ?= g++
MPICXX ?= mpicxx
CXXFLAGS ?= -O3 -march=native -fno-math-errno -std=c++17 -Wall -Wextra -Wno-unused-parameter -DOMPI_SKIP_MPICXX
OMPFLAGS = -fopenmp
include kernels/blas.mk
CXXFLAGS += $(BLAS_CFLAGS)
SHARED ?= ../shared/data

ifeq ($(NO_MPI),1)
  CXX_BUILD = $(CXX) -DNO_MPI
else
  CXX_BUILD = $(MPICXX)
endif

HEADERS = $(wildcard common/*.h model/*.h kernels/*.h kernels/cpu/*.h zero/*.h data/*.h train/*.h)
TINY_DATA = data/tinyshakespeare/tiny_shakespeare_train.bin

.PHONY: all test bench data clean prerequisites-build prerequisites-test gpu-rehearsal
all: train_gpt data

# What the build and the tests need is checked (and installed where possible) first; see the script.
# Order-only (|), so that a check that installs nothing rebuilds nothing.
prerequisites-build:
	@NO_MPI=$(NO_MPI) NO_BLAS=$(NO_BLAS) NVCC=$(NVCC) bash scripts/prerequisites.sh build
prerequisites-test: prerequisites-build
	@NO_MPI=$(NO_MPI) NO_BLAS=$(NO_BLAS) NVCC=$(NVCC) bash scripts/prerequisites.sh test

# With nvcc present train_gpt carries both backends (it falls back to the CPU one when no GPU
# is visible) and the CUDA kernel tests are built; without it train_gpt is CPU-only.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifneq ($(NVCC),)
include kernels/cuda.mk
train_gpt: | prerequisites-build
else
train_gpt: train_gpt.cu $(HEADERS) | prerequisites-build
	$(CXX_BUILD) $(CXXFLAGS) $(OMPFLAGS) -x c++ $< -o $@ $(BLAS_LIBS)
endif

# Tiny Shakespeare and GPT-2's BPE files from $(SHARED) where it has them; what it lacks the script
# downloads (offline it ends with one line saying which files to give, and how)
SHARED_BPE = $(SHARED)/gpt2/vocab.bpe $(SHARED)/gpt2/encoder.json
$(TINY_DATA): | prerequisites-build
	python3 data/tinyshakespeare.py $(if $(wildcard $(SHARED)/tinyshakespeare/input.txt),--input $(SHARED)/tinyshakespeare/input.txt) \
	  $(if $(filter 2,$(words $(wildcard $(SHARED_BPE)))),--vocab-bpe $(SHARED)/gpt2/vocab.bpe --encoder-json $(SHARED)/gpt2/encoder.json)
data: $(TINY_DATA)

TEST_BINS = test/test_ops test/test_model test/test_zero test/test_formats test/test_training test/test_hellaswag test/test_file_fuzz
ifneq ($(NVCC),)
TEST_BINS += test/test_kernels_cuda
test/test_kernels_cuda: | prerequisites-test
# kernels no GPU has run yet compile (and, on a GPU, are tested) in a build of their own; here
# its kernel tests alone (they hold train_gpt.cu and every kernel), for sm_90 (the H200 the
# candidates first run on; sm_90a in this build, kernels/cuda.mk) and this machine's GPU: a
# minute, not three (scripts/gpu_check.sh
# builds all of it on the GPU machine)
ifneq ($(KERNEL_CANDIDATES),)
TEST_BINS += candidate-build
.PHONY: candidate-build
candidate-build: | prerequisites-test
	$(MAKE) -f kernels/cuda.mk KERNELS=candidate GPU_ARCHS="$(sort 90 $(NVIDIA_SMI_ARCH))" build/candidate/test/test_kernels_cuda
endif
# the CUPTI tracer for bench_gpu.sh: make test compiles it, and its lines' test, where CUPTI is (kernels/cuda.mk)
ifneq ($(and $(CUPTI_INCLUDE),$(CUPTI_LIB_DIR)),)
TEST_BINS += scripts/kernel_trace.so test/kernel_trace_records
endif
endif
GTEST_MAIN = -lgtest_main
test/test_zero test/fault_job: GTEST_MAIN =
TEST_BINS += test/fault_job
test/%: test/%.cpp train_gpt.cu $(HEADERS) $(wildcard test/*.h) | prerequisites-test
	$(MPICXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@ $(BLAS_LIBS) -lgtest $(GTEST_MAIN) -lpthread

# the op and model tests once more on the plain-loop matmul that NO_BLAS=1 builds use
test/%_noblas: test/%.cpp train_gpt.cu $(HEADERS) $(wildcard test/*.h) | prerequisites-test
	$(MPICXX) $(CXXFLAGS) -DNO_BLAS $(OMPFLAGS) -I. $< -o $@ -lgtest -lgtest_main -lpthread
TEST_BINS += test/test_ops_noblas test/test_model_noblas

# the CPU quantizer on values from a file, for test/test_quantize.py's NumPy reference (a tool)
test/quantize_rows: test/quantize_rows.cpp kernels/cpu/quantize.h kernels/quantize_blocks.h common/io.h | prerequisites-test
	$(CXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@
TEST_BINS += test/quantize_rows

# the model's logits for test/test_hf.py (a tool, not a GoogleTest binary)
test/model_logits: test/model_logits.cpp train_gpt.cu $(HEADERS) | prerequisites-test
	$(MPICXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@ $(BLAS_LIBS)
TEST_BINS += test/model_logits

test: train_gpt $(TEST_BINS) $(TINY_DATA) | prerequisites-test
	bash test/run_tests.sh

# ZeRO-Offload's host AdamW against this machine's copy bandwidth (make bench runs it)
scripts/bench_host_adamw: scripts/bench_host_adamw.cpp kernels/cpu/adamw.h kernels/adamw_step.h kernels/shard_table.h common/bf16.h
	$(CXX) $(CXXFLAGS) $(OMPFLAGS) $< -o $@

bench: train_gpt $(TINY_DATA) scripts/bench_host_adamw
	bash scripts/bench_cpu.sh

# scripts/gpu_check.sh run as the GPU machine runs it, in a sandbox without a package manager,
# GoogleTest, OpenMPI or a GPU (see the script): before a change to CUDA code or the build goes
# to a device call. Minutes of nvcc, so not part of `make test`.
gpu-rehearsal:
	bash scripts/gpu_rehearsal.sh

clean:
	rm -rf build
	rm -f train_gpt scripts/bench_host_adamw scripts/kernel_trace.so test/kernel_trace_records test/model_logits test/quantize_rows test/test_ops test/test_ops_noblas test/test_model test/test_model_noblas test/test_zero test/test_formats test/test_training test/test_hellaswag test/test_file_fuzz test/test_kernels_cuda test/test_kernels_cuda_fp32 test/test_zero_cuda test/test_zero_cuda_fp32 test/fault_job
