// Communicator over NCCL for device buffers, one GPU per rank. MPI starts it (rank 0 makes the
// ncclUniqueId and broadcasts it) and still carries the host-side calls: scalar all-reduces,
// broadcasts of host memory, abort. Collectives run on a stream of their own, after the work
// the kernels' stream holds so far, and wait(ticket) makes the kernels' stream wait for them,
// without stopping the host.
// NCCL refuses two ranks on one GPU: use MpiComm with staging (comm_mpi.h) there.
// Only for nvcc builds with MPI.
#pragma once
#ifndef __CUDACC__
#error "zero/comm_nccl.h needs nvcc"
#endif
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "../common/io.h"               // fatal(): one line, and every rank stops
#include "../kernels/cuda/common.cuh"  // CUDA_CHECK
#include "comm.h"
#include "comm_mpi.h"  // abort_all_ranks, mpi_gather_host

#define NCCL_CHECK(call)                                                                  \
    do {                                                                                  \
        ncclResult_t r_ = (call);                                                         \
        if (r_ != ncclSuccess) {                                                          \
            fatal(1, "NCCL error at %s:%d: %s (%s)", __FILE__, __LINE__,                 \
                  ncclGetErrorString(r_), #call);                                         \
        }                                                                                 \
    } while (0)

// Whether every rank holds a GPU of its own: the ranks of each node (`node`) compare their
// GPUs' ids (choose_communicator in comm.h), and all ranks agree. Rank 0 says which
// communicator it is and why, when `say`.
inline bool nccl_usable(MPI_Comm node, const GpuUuid& mine, bool say) {
    int local_size = 1, rank = 0;
    MPI_Comm_size(node, &local_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::vector<GpuUuid> node_gpus(local_size);
    MPI_Allgather(mine.data(), (int)mine.size(), MPI_BYTE, node_gpus.data(), (int)mine.size(), MPI_BYTE, node);
    const CommChoice choice = choose_communicator(node_gpus);
    int everywhere = choice.nccl ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const bool nccl = everywhere == 1;
    if (rank == 0 && say)
        printf("communicator: %s (%s)\n", nccl ? "NCCL" : "MPI through host memory",
               nccl == choice.nccl ? choice.why.c_str() : "ranks of another node share a GPU");
    return nccl;
}

class NcclComm : public Communicator {
public:
    // stream: where collectives run; pass the backend's (gpu::stream()). The device must be
    // selected (CudaBackend::init) before construction.
    NcclComm(MPI_Comm comm, cudaStream_t stream) : mpi_(comm), stream_(stream) {
        MPI_Comm_rank(mpi_, &rank_);
        MPI_Comm_size(mpi_, &world_);
        ncclUniqueId id;
        if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_);
        NCCL_CHECK(ncclCommInitRank(&nccl_, world_, id, rank_));
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    }
    ~NcclComm() override {
        for (auto& e : events_) cudaEventDestroy(e.second);
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
        cudaStreamDestroy(comm_stream_);
        ncclCommDestroy(nccl_);
        if (owns_mpi_) MPI_Comm_free(&mpi_);
    }
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    double all_reduce_host(double x) override {
        double sum = 0.0;
        MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, mpi_);
        return sum;
    }
    void wait(Ticket ticket) override {
        auto it = events_.find(ticket);
        if (it == events_.end()) return;
        CUDA_CHECK(cudaStreamWaitEvent(stream_, it->second, 0));
        free_events_.push_back(it->second);
        events_.erase(it);
    }
    void barrier() override { MPI_Barrier(mpi_); }
    void gather_host(const void* send, void* recv, size_t bytes, int root) override {
        mpi_gather_host(send, recv, bytes, root, mpi_);
    }
    [[noreturn]] void abort(int code) override { abort_all_ranks(code); }
    // an NCCL communicator of its own over the subset's ranks (and its own collective stream)
    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        auto sub = std::make_unique<NcclComm>(mpi_split(mpi_, first, count), stream_);
        sub->owns_mpi_ = true;
        return sub;
    }
    int ranks_per_node() override { return mpi_ranks_per_node(mpi_); }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        after_queued_work();
        NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), ncclSum, nccl_, comm_stream_));
        return mark_done();
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        after_queued_work();
        NCCL_CHECK(ncclReduceScatter(send, recv, n, nccl_type(t), ncclSum, nccl_, comm_stream_));
        return mark_done();
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        after_queued_work();
        NCCL_CHECK(ncclAllGather(send, recv, n, nccl_type(t), nccl_, comm_stream_));
        return mark_done();
    }
    // NCCL has no all-to-all of its own: a send and a receive per rank, in one group
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        after_queued_work();
        const size_t bytes = n * dtype_size(t);
        NCCL_CHECK(ncclGroupStart());
        for (int r = 0; r < world_; r++) {
            NCCL_CHECK(ncclSend((const char*)send + r * bytes, n, nccl_type(t), r, nccl_, comm_stream_));
            NCCL_CHECK(ncclRecv((char*)recv + r * bytes, n, nccl_type(t), r, nccl_, comm_stream_));
        }
        NCCL_CHECK(ncclGroupEnd());
        return mark_done();
    }
    void do_broadcast_host(void* buf, size_t bytes, int root) override {
        if (bytes > (size_t)0x7fffffff) {
            fprintf(stderr, "error: host broadcast of %zu bytes exceeds MPI's int count\n", bytes);
            abort(1);
        }
        MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, mpi_);
    }

private:
    static ncclDataType_t nccl_type(DType t) { return t == DType::F32 ? ncclFloat : t == DType::BF16 ? ncclBfloat16 : ncclInt8; }
    cudaEvent_t take_event() {
        if (free_events_.empty()) {
            cudaEvent_t e;
            CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            return e;
        }
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
    }
    // the collective stream starts after everything the kernels' stream holds so far
    void after_queued_work() {
        cudaEvent_t e = take_event();
        CUDA_CHECK(cudaEventRecord(e, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, e, 0));
        free_events_.push_back(e);  // reusable: a recorded event may be recorded again
    }
    Ticket mark_done() {
        cudaEvent_t e = take_event();
        CUDA_CHECK(cudaEventRecord(e, comm_stream_));
        events_[++last_ticket_] = e;
        return last_ticket_;
    }

    MPI_Comm mpi_;
    bool owns_mpi_ = false;  // made by split(): freed with this communicator
    cudaStream_t stream_, comm_stream_ = nullptr;
    ncclComm_t nccl_ = nullptr;
    std::map<Ticket, cudaEvent_t> events_;
    std::vector<cudaEvent_t> free_events_;
    Ticket last_ticket_ = 0;
};
