// Communicator over MPI. Buffers are host memory, or device memory that is staged through the
// host when `stage` functions are given: NCCL refuses two ranks on one GPU, MPI does not care.
// bf16 sums use a user-defined MPI op since MPI has no bf16 type. On host memory the asynchronous
// collectives are MPI's non-blocking ones; staged ones complete before returning. Every call is
// non-blocking underneath and waited for under the watchdog (common/watchdog.h), so a rank whose
// peer stopped says so and ends the job instead of waiting forever.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "../common/bf16.h"
#include "../common/watchdog.h"
#include "comm.h"

// MPI's request waited for under the watchdog (common/watchdog.h): polled until done, or the job
// ends with one line naming `what`
inline void mpi_await(MPI_Request& request, const std::function<std::string()>& what, double allowance = 0.0) {
    watchdog().wait(
        [&] {
            int done = 0;
            MPI_Test(&request, &done, MPI_STATUS_IGNORE);
            return done != 0;
        },
        what, allowance);
}

// MPI_Gather of host memory in pieces below MPI's int count; root's recv is rank-major
inline void mpi_gather_host(const void* send, void* recv, size_t bytes, int root, MPI_Comm comm, const Communicator& c) {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    const size_t piece = (size_t)1 << 30;
    std::vector<char> tmp(rank == root ? std::min(bytes, piece) * world : 0);
    for (size_t at = 0; at < bytes; at += piece) {
        const size_t len = std::min(piece, bytes - at);
        MPI_Request request;
        MPI_Igather((const char*)send + at, (int)len, MPI_BYTE, tmp.data(), (int)len, MPI_BYTE, root, comm, &request);
        mpi_await(request, [&] { return collective_words("a gather to rank " + std::to_string(root), world * len, -1, c); });
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

// Communicator::node_ranks for comm: the size of this rank's node (MPI's shared-memory domain),
// and that size again when every node holds as many ranks, consecutive in comm (else 0;
// node_ranks_agreed)
inline Communicator::NodeRanks mpi_node_ranks(MPI_Comm comm, const Communicator& c) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int size = 0, bounds[2] = {-rank, rank};  // -lowest, highest
    MPI_Comm_size(node, &size);
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, bounds, 2, MPI_INT, MPI_MAX, node, &r);
    mpi_await(r, [&] { return collective_words("an all-reduce", sizeof(bounds), -1, c) + " within a node"; });
    MPI_Comm_free(&node);
    // the smallest node (min of size), the largest (min of -size), and whether all are blocks
    int agree[3] = {size, -size, node_is_a_block(rank, size, -bounds[0], bounds[1]) ? 1 : 0};
    MPI_Iallreduce(MPI_IN_PLACE, agree, 3, MPI_INT, MPI_MIN, comm, &r);
    mpi_await(r, [&] { return collective_words("an all-reduce", sizeof(agree), -1, c); });
    return node_ranks_agreed(size, agree[0], -agree[1], agree[2] == 1);
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
        MPI_Request r;
        MPI_Iallreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, comm_, &r);
        mpi_await(r, [&] { return collective_words("an all-reduce", sizeof(double), -1, *this); });
        return sum;
    }
    void wait(Ticket ticket) override {
        auto it = pending_.find(ticket);
        if (it == pending_.end()) return;
        const Pending& p = it->second;
        mpi_await(it->second.request, [&] { return collective_words(p.kind, p.bytes, p.group, *this); });
        pending_.erase(it);
    }
    void barrier(double allowance = 0.0) override {
        MPI_Request r;
        MPI_Ibarrier(comm_, &r);
        mpi_await(r, [&] { return "a barrier among " + label() + " (" + std::to_string(world_) + " rank(s))"; }, allowance);
    }
    void gather_host(const void* send, void* recv, size_t bytes, int root) override {
        mpi_gather_host(send, recv, bytes, root, comm_, *this);
    }
    [[noreturn]] void abort(int code) override { abort_all_ranks(code); }
    std::unique_ptr<Communicator> split(int first, int count, int stride) override { return split_mpi(first, count); }
    std::unique_ptr<MpiComm> split_mpi(int first, int count) {
        auto sub = std::make_unique<MpiComm>(mpi_split(comm_, first, count), to_host_, from_host_);
        sub->owns_comm_ = true;
        return sub;
    }
    NodeRanks node_ranks() override { return mpi_node_ranks(comm_, *this); }
    void note(Event event, int group) override {
        if (event == Event::NextCollectiveMoves) moving_group_ = group;
    }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        void* h = stage_in(buf, bytes, 0);
        return collective("an all-reduce", bytes, buf, h, bytes,
                          [&](MPI_Request* r) { MPI_Iallreduce(MPI_IN_PLACE, h, count(n, t), mpi_type(t), op(t), comm_, r); });
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        const void* s = stage_in(send, world_ * bytes, 0);
        void* h = receive_buffer(recv, bytes);
        return collective("a reduce-scatter", world_ * bytes, recv, h, bytes,
                          [&](MPI_Request* r) { MPI_Ireduce_scatter_block(s, h, count(n, t), mpi_type(t), op(t), comm_, r); });
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        const void* s = stage_in(send, bytes, 0);
        void* h = receive_buffer(recv, world_ * bytes);
        return collective("an all-gather", world_ * bytes, recv, h, world_ * bytes, [&](MPI_Request* r) {
            MPI_Iallgather(s, count(n, t), mpi_type(t), h, count(n, t), mpi_type(t), comm_, r);
        });
    }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = world_ * n * dtype_size(t);
        const void* s = stage_in(send, bytes, 0);
        void* h = receive_buffer(recv, bytes);
        return collective("an all-to-all", bytes, recv, h, bytes, [&](MPI_Request* r) {
            MPI_Ialltoall(s, count(n, t), mpi_type(t), h, count(n, t), mpi_type(t), comm_, r);
        });
    }
    void do_broadcast_host(void* buf, size_t bytes, int root) override {
        MPI_Request r;
        MPI_Ibcast(buf, count(bytes, DType::I8), MPI_BYTE, root, comm_, &r);
        await_now(r, "a broadcast from rank " + std::to_string(root), bytes);
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

    // a collective started, and what the watchdog's message would call it
    struct Pending {
        MPI_Request request;
        std::string kind;
        size_t bytes;
        int group;
    };
    Ticket remember(MPI_Request r, const char* kind, size_t bytes) {
        pending_[++last_ticket_] = {r, kind, bytes, moving_group_};
        return last_ticket_;
    }
    void await_now(MPI_Request& r, const std::string& kind, size_t bytes) {
        mpi_await(r, [&] { return collective_words(kind, bytes, moving_group_, *this); });
    }
    // A collective that `start` begins as MPI's non-blocking call, `moved` bytes in the words of
    // the watchdog's message: on host buffers its request is the ticket; staged, it is waited for
    // at once and its result (recv_host, recv_bytes of it) copied to the device's `recv`
    template <class Start>
    Ticket collective(const char* kind, size_t moved, void* recv, const void* recv_host, size_t recv_bytes, Start start) {
        MPI_Request r;
        start(&r);
        if (!staged()) return remember(r, kind, moved);
        await_now(r, kind, moved);
        stage_out(recv, recv_host, recv_bytes);
        return 0;
    }
    // where a collective writes: `recv` itself, or a host buffer when staged
    void* receive_buffer(void* recv, size_t bytes) { return staged() ? stage_buffer(1, bytes) : recv; }
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
    std::map<Ticket, Pending> pending_;
    Ticket last_ticket_ = 0;
    int moving_group_ = -1;  // the group the next collective moves, as zero/ last noted
};
