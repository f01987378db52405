// A stand-in for a CUDA test binary whose kernel faults, for `make gpu-rehearsal` (no kernel can
// fault on a machine without a GPU): the same GoogleTest output, worst-error lines and fatal()
// ends as test/test_kernels_cuda. Cuda.Attention's kernel hits an illegal address. As on a GPU,
// the fault is reported by the next copy, which exits the process: within the test built as is,
// in the next test (Cuda.Elementwise) built with -DFAULT_SURFACES_LATER; with
// CUDA_SYNC_LAUNCHES=1 (common.cuh's check_launch) at the faulting launch itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

bool g_fault_pending = false;  // a kernel faulted; the next copy reports it

[[noreturn]] void die(const char* line) {
    fprintf(stderr, "error: %s\n", line);
    exit(1);
}

void launch(const char* launcher, bool faults) {
    if (!faults) return;
    const char* sync = getenv("CUDA_SYNC_LAUNCHES");
    if (sync != nullptr && strcmp(sync, "1") == 0) {
        fprintf(stderr, "error: CUDA error at the launch in %s (kernels/cuda/attention.cuh:212): an illegal memory access was "
                "encountered (CUDA_SYNC_LAUNCHES=1: this launch's own)\n", launcher);
        exit(1);
    }
    g_fault_pending = true;
}

void copy_to_host() {
    if (g_fault_pending)
        die("CUDA error at kernels/cuda_backend.cuh:92: an illegal memory access was encountered "
            "(cudaStreamSynchronize(gpu::stream()))");
}

class WorstErrorLines : public testing::EmptyTestEventListener {
    void OnTestEnd(const testing::TestInfo& test) override {
        printf("worst-error %s %s.%s: 0.25 vs tolerance 1 (0.25 of it) in %s\n", test.result()->Passed() ? "PASS" : "FAIL",
               test.test_suite_name(), test.name(), test.name());
        fflush(stdout);
    }
};

TEST(Cuda, Encoder) {
    launch("encoder_forward", false);
    copy_to_host();
}
TEST(Cuda, Attention) {
    launch("attention_forward", true);
#ifndef FAULT_SURFACES_LATER
    copy_to_host();
#endif
}
TEST(Cuda, Elementwise) {
    launch("gelu_forward", false);
    copy_to_host();
}
TEST(Cuda, Classifier) {
    launch("fused_classifier", false);
    copy_to_host();
    EXPECT_LE(1.5, 1.0) << "classifier dlogits: 3 of 64 elements out of tolerance";  // a plain failure, reported as one
}
TEST(Cuda, AdamW) {
    launch("adamw", false);
    copy_to_host();
}

}  // namespace

int main(int argc, char** argv) {
    testing::InitGoogleTest(&argc, argv);
    testing::UnitTest::GetInstance()->listeners().Append(new WorstErrorLines());
    return RUN_ALL_TESTS();
}
