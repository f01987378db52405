// Communicator over MPI. Buffers are host memory, or device memory that is staged through the
// host when `stage` functions are given: NCCL refuses two ranks on one GPU, MPI does not care.
// bf16 sums use a user-defined MPI op since MPI has no bf16 type. On host memory the asynchronous
// collectives are MPI's non-blocking ones; staged ones complete before returning.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "../common/bf16.h"
#include "comm.h"

// MPI_Gather of host memory in pieces below MPI's int count; root's recv is rank-major
inline void mpi_gather_host(const void* send, void* recv, size_t bytes, int root, MPI_Comm comm) {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    const size_t piece = (size_t)1 << 30;
    std::vector<char> tmp(rank == root ? std::min(bytes, piece) * world : 0);
    for (size_t at = 0; at < bytes; at += piece) {
        const size_t len = std::min(piece, bytes - at);
        MPI_Gather((const char*)send + at, (int)len, MPI_BYTE, tmp.data(), (int)len, MPI_BYTE, root, comm);
        if (rank == root)
            for (int r = 0; r < world; r++) memcpy((char*)recv + r * bytes + at, tmp.data() + r * len, len);
    }
}

// The subset of comm's ranks first, first + stride, ... (count of them) that holds this rank, as
// its own communicator (Communicator::split)
inline MPI_Comm mpi_split(MPI_Comm comm, int first, int count) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm sub;
    MPI_Comm_split(comm, first, rank, &sub);  // `first` names the subset: the subsets are disjoint
    MPI_Comm_size(sub, &size);
    if (size != count) {
        fprintf(stderr, "error: rank %d: a split of the ranks gave %d rank(s) where %d were asked for\n", rank, size, count);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return sub;
}

// Communicator::ranks_per_node for comm: the size of this rank's node (MPI's shared-memory
// domain) when every node holds that many ranks, consecutive in comm; else 0
inline int mpi_ranks_per_node(MPI_Comm comm) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int size = 0, lowest = rank, highest = rank;
    MPI_Comm_size(node, &size);
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node);
    MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_INT, MPI_MAX, node);
    MPI_Comm_free(&node);
    // the same size everywhere (min of size and of -size), and each node ranks [k*size, (k+1)*size)
    int agree[3] = {size, -size, lowest == rank / size * size && highest == lowest + size - 1 ? 1 : 0};
    MPI_Allreduce(MPI_IN_PLACE, agree, 3, MPI_INT, MPI_MIN, comm);
    return agree[0] == -agree[1] && agree[2] == 1 ? size : 0;
}

// Prints nothing: the caller has said why. MPI_Abort takes every rank down, not only this one.
[[noreturn]] inline void abort_all_ranks(int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);  // not reached: MPI_Abort ends the process
}

class MpiComm : public Communicator {
public:
    using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

    // to_host/from_host: null for host buffers, else how to move device bytes
    explicit MpiComm(MPI_Comm comm, CopyFn to_host = nullptr, CopyFn from_host = nullptr)
        : comm_(comm), to_host_(to_host), from_host_(from_host) {
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &world_);
        MPI_Op_create(&bf16_sum, 1, &bf16_sum_op_);
    }
    ~MpiComm() override {
        MPI_Op_free(&bf16_sum_op_);
        if (owns_comm_) MPI_Comm_free(&comm_);
    }
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    double all_reduce_host(double x) override {
        double sum = 0.0;
        MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, comm_);
        return sum;
    }
    void wait(Ticket ticket) override {
        auto it = pending_.find(ticket);
        if (it == pending_.end()) return;
        MPI_Wait(&it->second, MPI_STATUS_IGNORE);
        pending_.erase(it);
    }
    void barrier() override { MPI_Barrier(comm_); }
    void gather_host(const void* send, void* recv, size_t bytes, int root) override {
        mpi_gather_host(send, recv, bytes, root, comm_);
    }
    [[noreturn]] void abort(int code) override { abort_all_ranks(code); }
    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        auto sub = std::make_unique<MpiComm>(mpi_split(comm_, first, count), to_host_, from_host_);
        sub->owns_comm_ = true;
        return sub;
    }
    int ranks_per_node() override { return mpi_ranks_per_node(comm_); }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        if (!staged()) {
            MPI_Request r;
            MPI_Iallreduce(MPI_IN_PLACE, buf, count(n, t), mpi_type(t), op(t), comm_, &r);
            return remember(r);
        }
        void* h = stage_in(buf, n * dtype_size(t), 0);
        MPI_Allreduce(MPI_IN_PLACE, h, count(n, t), mpi_type(t), op(t), comm_);
        stage_out(buf, h, n * dtype_size(t));
        return 0;
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        if (!staged()) {
            MPI_Request r;
            MPI_Ireduce_scatter_block(send, recv, count(n, t), mpi_type(t), op(t), comm_, &r);
            return remember(r);
        }
        size_t bytes = n * dtype_size(t);
        void* hr = stage_buffer(1, bytes);
        MPI_Reduce_scatter_block(stage_in(send, world_ * bytes, 0), hr, count(n, t), mpi_type(t), op(t), comm_);
        stage_out(recv, hr, bytes);
        return 0;
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        if (!staged()) {
            MPI_Request r;
            MPI_Iallgather(send, count(n, t), mpi_type(t), recv, count(n, t), mpi_type(t), comm_, &r);
            return remember(r);
        }
        size_t bytes = n * dtype_size(t);
        void* hr = stage_buffer(1, world_ * bytes);
        MPI_Allgather(stage_in(send, bytes, 0), count(n, t), mpi_type(t), hr, count(n, t), mpi_type(t), comm_);
        stage_out(recv, hr, world_ * bytes);
        return 0;
    }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        if (!staged()) {
            MPI_Request r;
            MPI_Ialltoall(send, count(n, t), mpi_type(t), recv, count(n, t), mpi_type(t), comm_, &r);
            return remember(r);
        }
        size_t bytes = world_ * n * dtype_size(t);
        void* hr = stage_buffer(1, bytes);
        MPI_Alltoall(stage_in(send, bytes, 0), count(n, t), mpi_type(t), hr, count(n, t), mpi_type(t), comm_);
        stage_out(recv, hr, bytes);
        return 0;
    }
    void do_broadcast_host(void* buf, size_t bytes, int root) override {
        MPI_Bcast(buf, count(bytes, DType::F32), MPI_BYTE, root, comm_);
    }

private:
    static MPI_Datatype mpi_type(DType t) { return t == DType::F32 ? MPI_FLOAT : t == DType::BF16 ? MPI_UINT16_T : MPI_INT8_T; }
    MPI_Op op(DType t) const { return t == DType::F32 ? MPI_SUM : bf16_sum_op_; }
    static int count(size_t n, DType) {
        if (n > (size_t)0x7fffffff) {
            fprintf(stderr, "error: collective of %zu elements exceeds MPI's int count\n", n);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        return (int)n;
    }
    static void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
        const uint16_t* a = (const uint16_t*)in;
        uint16_t* b = (uint16_t*)inout;
        for (int i = 0; i < *len; i++) b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
    }

    Ticket remember(MPI_Request r) {
        pending_[++last_ticket_] = r;
        return last_ticket_;
    }
    bool staged() const { return to_host_ != nullptr; }
    void* stage_buffer(int which, size_t bytes) {
        if (host_[which].size() < bytes) host_[which].resize(bytes);
        return host_[which].data();
    }
    void* stage_in(const void* dev, size_t bytes, int which) {
        if (!staged()) return const_cast<void*>(dev);
        void* h = stage_buffer(which, bytes);
        to_host_(h, dev, bytes);
        return h;
    }
    void stage_out(void* dev, const void* h, size_t bytes) {
        if (staged()) from_host_(dev, h, bytes);
    }

    MPI_Comm comm_;
    CopyFn to_host_, from_host_;
    bool owns_comm_ = false;  // made by split(): freed with this communicator
    MPI_Op bf16_sum_op_;
    std::vector<char> host_[2];
    std::map<Ticket, MPI_Request> pending_;
    Ticket last_ticket_ = 0;
};
