// Transfers between device memory and pinned host memory on a stream of their own, so that they
// run beside the kernels (ZeRO-Offload's gradients out and parameters in, zero/offload.h). They
// run in the order they are queued; each side waits for the other only where told:
//   transfers_after_kernels()  transfers queued from now on start after the kernels queued so far
//   kernels_after_transfers()  kernels queued from now on start after the transfers queued so far
//   transfer_mark() / transfer_wait(mark): the host waits for the transfers queued before the mark
// A mark is a slot in a ring of events; waiting on a mark whose slot was recorded again since
// waits for the later point, which is later still, so it is never too early.
#pragma once
#include "common.cuh"

namespace gpu {

struct Transfers {
    static constexpr int kMarks = 256;  // marks outstanding at once; ZeRO-Offload needs one per group
    cudaStream_t stream = nullptr;
    cudaEvent_t marks[kMarks] = {};
    cudaEvent_t handoff = nullptr;  // between the kernels' stream and this one
    uint64_t next_mark = 0;
};

inline Transfers& transfers() {
    static Transfers t;
    if (t.stream == nullptr) {
        ctx();  // the device is chosen first
        CUDA_CHECK(cudaStreamCreateWithFlags(&t.stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&t.handoff, cudaEventDisableTiming));
        for (cudaEvent_t& e : t.marks) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    return t;
}

inline void transfers_after_kernels() {
    Transfers& t = transfers();
    CUDA_CHECK(cudaEventRecord(t.handoff, stream()));
    CUDA_CHECK(cudaStreamWaitEvent(t.stream, t.handoff, 0));
}
inline void kernels_after_transfers() {
    Transfers& t = transfers();
    CUDA_CHECK(cudaEventRecord(t.handoff, t.stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream(), t.handoff, 0));
}
inline void transfer(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, transfers().stream));
}
inline uint64_t transfer_mark() {
    Transfers& t = transfers();
    CUDA_CHECK(cudaEventRecord(t.marks[t.next_mark % Transfers::kMarks], t.stream));
    return t.next_mark++;
}
inline void transfer_wait(uint64_t mark) {
    wait_for_event(transfers().marks[mark % Transfers::kMarks]);
}

}  // namespace gpu
