# make            train_gpt (CPU backend; with nvcc present also the CUDA backend, see issue notes)
# make test       the whole test suite (CPU; GPU tests run where a GPU is present)
# make bench      CPU benchmark (d12, B=4, T=64, one rank)
# make data       Tiny Shakespeare token shards + tokenizer from ../shared/data (or downloads)
CXX ?= g++
MPICXX ?= mpicxx
CXXFLAGS ?= -O3 -march=native -std=c++17 -Wall -Wextra -Wno-unused-parameter -DOMPI_SKIP_MPICXX
OMPFLAGS = -fopenmp
BLAS_LIBS = -lopenblas
SHARED ?= ../shared/data

ifeq ($(NO_MPI),1)
  CXX_BUILD = $(CXX) -DNO_MPI
else
  CXX_BUILD = $(MPICXX)
endif

HEADERS = $(wildcard kernels/*.h kernels/cpu/*.h zero/*.h data/*.h)
TINY_DATA = data/tinyshakespeare/tiny_shakespeare_train.bin

.PHONY: all test bench data clean
all: train_gpt data

train_gpt: train_gpt.cu $(HEADERS)
	$(CXX_BUILD) $(CXXFLAGS) $(OMPFLAGS) -x c++ $< -o $@ $(BLAS_LIBS)

$(TINY_DATA):
	python3 data/tinyshakespeare.py --input $(SHARED)/tinyshakespeare/input.txt \
	  --vocab-bpe $(SHARED)/gpt2/vocab.bpe --encoder-json $(SHARED)/gpt2/encoder.json
data: $(TINY_DATA)

TEST_BINS = test/test_model test/test_zero test/test_formats test/test_training
GTEST_MAIN = -lgtest_main
test/test_zero: GTEST_MAIN =
test/%: test/%.cpp train_gpt.cu $(HEADERS) test/test_util.h
	$(MPICXX) $(CXXFLAGS) $(OMPFLAGS) -I. $< -o $@ $(BLAS_LIBS) -lgtest $(GTEST_MAIN) -lpthread

test: train_gpt $(TEST_BINS) $(TINY_DATA)
	bash test/run_tests.sh

bench: train_gpt $(TINY_DATA)
	bash scripts/bench_cpu.sh

clean:
	rm -f train_gpt $(TEST_BINS)
