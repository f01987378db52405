// Communicator over NCCL for device buffers, one GPU per rank. MPI starts it (rank 0 makes the
// ncclUniqueId and broadcasts it) and still carries the host-side calls: scalar all-reduces,
// broadcasts of host memory, abort. Collectives are queued on the stream the kernels use, so
// they are ordered with the kernels that produce and consume their buffers without any wait.
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

#include "comm.h"
#include "comm_mpi.h"  // abort_all_ranks

#define NCCL_CHECK(call)                                                                        \
    do {                                                                                        \
        ncclResult_t r_ = (call);                                                               \
        if (r_ != ncclSuccess) {                                                                \
            fprintf(stderr, "error: NCCL error at %s:%d: %s (%s)\n", __FILE__, __LINE__,        \
                    ncclGetErrorString(r_), #call);                                             \
            abort_all_ranks(1);                                                                 \
        }                                                                                       \
    } while (0)

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
    }
    ~NcclComm() override { ncclCommDestroy(nccl_); }
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    double all_reduce_host(double x) override {
        double sum = 0.0;
        MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, mpi_);
        return sum;
    }
    void wait() override {
        if (cudaStreamSynchronize(stream_) != cudaSuccess) {
            fprintf(stderr, "error: rank %d: CUDA stream failed during NCCL collectives\n", rank_);
            abort(1);
        }
    }
    [[noreturn]] void abort(int code) override { abort_all_ranks(code); }

protected:
    void do_all_reduce(void* buf, size_t n, DType t) override {
        NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), ncclSum, nccl_, stream_));
    }
    void do_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        NCCL_CHECK(ncclReduceScatter(send, recv, n, nccl_type(t), ncclSum, nccl_, stream_));
    }
    void do_all_gather(const void* send, void* recv, size_t n, DType t) override {
        NCCL_CHECK(ncclAllGather(send, recv, n, nccl_type(t), nccl_, stream_));
    }
    void do_broadcast_host(void* buf, size_t bytes, int root) override {
        if (bytes > (size_t)0x7fffffff) {
            fprintf(stderr, "error: host broadcast of %zu bytes exceeds MPI's int count\n", bytes);
            abort(1);
        }
        MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, mpi_);
    }

private:
    static ncclDataType_t nccl_type(DType t) { return t == DType::F32 ? ncclFloat : ncclBfloat16; }

    MPI_Comm mpi_;
    cudaStream_t stream_;
    ncclComm_t nccl_ = nullptr;
};
