// Communicator over NCCL for device buffers, one GPU per rank. MPI starts it (rank 0 makes the
// ncclUniqueId and broadcasts it) and carries the host-side calls (an MpiComm: scalar
// all-reduces, broadcasts of host memory, barriers, abort). Collectives run on a stream of their
// own, after the work the kernels' stream holds so far, and wait(ticket) makes the kernels' stream
// wait for them, without stopping the host.
//
// Nothing here blocks without a deadline: the communicators are non-blocking (ncclConfig_t's
// blocking = 0), so their start and each enqueue that returns ncclInProgress are polled under the
// watchdog (common/watchdog.h), which also polls ncclCommGetAsyncError whenever the host waits for
// the GPU, and aborts every communicator before the job ends.
//
// Several communicators (hybrid sharding's group and replicas, split from the world's, sharing
// its resources) have collectives in flight at once, which NCCL orders safely only as its version
// allows: from 2.26 by the order one host thread issues them (NCCL_LAUNCH_ORDER_IMPLICIT=1, set
// here unless the user set it; each communicator its own stream), before that only if they share
// one stream (then they do). docs/zero.md says more.
// NCCL refuses two ranks on one GPU: use MpiComm with staging (comm_mpi.h) there.
// Only for nvcc builds with MPI.
#pragma once
#ifndef __CUDACC__
#error "zero/comm_nccl.h needs nvcc"
#endif
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/io.h"               // fatal(): one line, and every rank stops
#include "../common/watchdog.h"
#include "../kernels/cuda/common.cuh"  // CUDA_CHECK
#include "comm.h"
#include "comm_mpi.h"  // MpiComm, for the host half

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "zero/comm_nccl.h needs NCCL 2.18 or later (ncclCommSplit, ncclConfig_t's splitShare)"
#endif

// Whether every rank holds a GPU of its own: the ranks of each node (`node`) compare their
// GPUs' ids (choose_communicator in comm.h), and all ranks agree. Rank 0 says which
// communicator it is and why, when `say`.
inline bool nccl_usable(MPI_Comm node, const GpuUuid& mine, bool say) {
    int local_size = 1, rank = 0;
    MPI_Comm_size(node, &local_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::vector<GpuUuid> node_gpus(local_size);
    MPI_Request r;
    MPI_Iallgather(mine.data(), (int)mine.size(), MPI_BYTE, node_gpus.data(), (int)mine.size(), MPI_BYTE, node, &r);
    mpi_await(r, [] { return std::string("the GPU ids of the node's ranks"); });
    const CommChoice choice = choose_communicator(node_gpus);
    int everywhere = choice.nccl ? 1 : 0;
    MPI_Iallreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r);
    mpi_await(r, [] { return std::string("every rank's choice of communicator"); });
    const bool nccl = everywhere == 1;
    if (rank == 0 && say)
        printf("communicator: %s (%s)\n", nccl ? "NCCL" : "MPI through host memory",
               nccl == choice.nccl ? choice.why.c_str() : "ranks of another node share a GPU");
    return nccl;
}

// NCCL's version as linked at run time (the library may be newer or older than the header)
inline int nccl_runtime_version() {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : NCCL_VERSION_CODE;
}

// Before the first NCCL call: how the collectives of several communicators are ordered (see the
// top of this file), and peers connected when a communicator starts (NCCL_RUNTIME_CONNECT=0),
// so that its buffers are taken before the memory plan reads what is free. Either variable set
// by the user stays as given. Returns whether the launch order is implicit.
inline bool nccl_prepare_environment() {
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    const bool offered = nccl_runtime_version() >= NCCL_VERSION(2, 26, 0);
    if (offered) setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
    // read as NCCL reads it (a number; empty or not a number is 0, off)
    const char* implicit = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    return offered && implicit != nullptr && strtoll(implicit, nullptr, 0) != 0;
}

class NcclComm : public Communicator {
public:
    // stream: the kernels' stream (gpu::stream()). The device must be selected
    // (CudaBackend::init) before construction. A collective over comm's ranks.
    NcclComm(MPI_Comm comm, cudaStream_t stream)
        : host_(std::make_unique<MpiComm>(comm)), stream_(stream), implicit_order_(nccl_prepare_environment()) {
        rank_ = host_->rank();
        world_ = host_->world();
        ncclUniqueId id;
        if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        host_->broadcast_host(&id, sizeof(id), 0);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;    // every call returns at once; the watchdog polls what is in progress
        config.splitShare = 1;  // split communicators share this one's buffers and connections
        check(ncclCommInitRankConfig(&nccl_, world_, id, rank_, &config), "ncclCommInitRankConfig");
        wait_ready("the NCCL communicator's start");
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
        owns_comm_stream_ = true;
        watch();
    }
    // Finalizing flushes what is in flight and meets the other ranks, so it is polled under the
    // watchdog like any other wait; destroying a finalized communicator then frees it locally.
    ~NcclComm() override {
        check(ncclCommFinalize(nccl_), "ncclCommFinalize");
        wait_ready("the NCCL communicator's end");
        watchdog().remove_source(watch_id_);
        for (auto& r : launched_) cudaEventDestroy(r.second.done);
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
        if (owns_comm_stream_) cudaStreamDestroy(comm_stream_);
        check(ncclCommDestroy(nccl_), "ncclCommDestroy");
    }
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    // one small collective of each kind the run uses (see Communicator::warm_up)
    void warm_up() override {
        const size_t n = 2 * (size_t)world_;  // floats per rank: a block for each rank, twice
        float* buf = nullptr;
        CUDA_CHECK(cudaMalloc(&buf, 3 * n * world_ * sizeof(float)));
        CUDA_CHECK(cudaMemsetAsync(buf, 0, 3 * n * world_ * sizeof(float), stream_));
        float *a = buf, *b = buf + n * world_, *c = buf + 2 * n * world_;
        for (Ticket t : {all_reduce_async(a, n, DType::F32), reduce_scatter_async(a, b, n, DType::F32), all_gather_async(b, c, n, DType::F32),
                         all_to_all_async(c, a, n / world_ > 0 ? n / world_ : 1, DType::F32)})
            wait(t);
        gpu::wait_for_stream(stream_);
        CUDA_CHECK(cudaFree(buf));
        reset_counters();  // the run counts its own traffic
    }

    double all_reduce_host(double x) override { return host_->all_reduce_host(x); }
    void wait(Ticket ticket) override {
        cudaEvent_t done;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = launched_.find(ticket);
            if (it == launched_.end()) return;
            done = it->second.done;
            it->second.waited = true;  // its event is recycled only by launched(), on this thread
        }
        CUDA_CHECK(cudaStreamWaitEvent(stream_, done, 0));  // may block on a full queue: not under the lock
    }
    void barrier(double allowance = 0.0) override { host_->barrier(allowance); }
    void gather_host(const void* send, void* recv, size_t bytes, int root) override { host_->gather_host(send, recv, bytes, root); }
    [[noreturn]] void abort(int code) override {
        host_->abort(code);
        exit(code);  // not reached; the compiler does not see it through the virtual call
    }
    // the subset's ranks, from ncclCommSplit (sharing this communicator's resources); its own
    // collective stream where the launch order is implicit, else this one's (see the top)
    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        std::unique_ptr<MpiComm> host = host_->split_mpi(first, count);
        ncclComm_t child = nullptr;
        check(ncclCommSplit(nccl_, first, rank_, &child, nullptr), "ncclCommSplit");
        // A non-blocking split is a job of this (the parent) communicator, which writes the child's
        // handle only as it finishes: wait for the parent, then for the handle.
        wait_ready("an NCCL communicator's split");
        watchdog().wait([&] { return __atomic_load_n(&child, __ATOMIC_ACQUIRE) != nullptr; },
                        [&] { return "the handle of a communicator split from " + label(); });
        auto sub = std::unique_ptr<NcclComm>(new NcclComm(std::move(host), child, stream_, implicit_order_));
        sub->wait_ready("an NCCL communicator's split");
        if (implicit_order_) {
            CUDA_CHECK(cudaStreamCreateWithFlags(&sub->comm_stream_, cudaStreamNonBlocking));
            sub->owns_comm_stream_ = true;
        } else {
            sub->comm_stream_ = comm_stream_;
        }
        sub->watch();
        return sub;
    }
    NodeRanks node_ranks() override { return host_->node_ranks(); }
    // under the lock: the watchdog's thread may be reading the label for its line
    void set_label(std::string label) override {
        std::lock_guard<std::mutex> lock(mutex_);
        Communicator::set_label(std::move(label));
    }
    void note(Event event, int group) override {
        if (event == Event::NextCollectiveMoves) moving_group_ = group;
    }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        after_queued_work();
        enqueued(ncclAllReduce(buf, buf, n, nccl_type(t), ncclSum, nccl_, comm_stream_), "ncclAllReduce");
        return launched("an all-reduce", n * dtype_size(t));
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        after_queued_work();
        enqueued(ncclReduceScatter(send, recv, n, nccl_type(t), ncclSum, nccl_, comm_stream_), "ncclReduceScatter");
        return launched("a reduce-scatter", world_ * n * dtype_size(t));
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        after_queued_work();
        enqueued(ncclAllGather(send, recv, n, nccl_type(t), nccl_, comm_stream_), "ncclAllGather");
        return launched("an all-gather", world_ * n * dtype_size(t));
    }
    // NCCL has no all-to-all of its own: a send and a receive per rank, in one group
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        after_queued_work();
        const size_t bytes = n * dtype_size(t);
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < world_; r++) {
            check(ncclSend((const char*)send + r * bytes, n, nccl_type(t), r, nccl_, comm_stream_), "ncclSend");
            check(ncclRecv((char*)recv + r * bytes, n, nccl_type(t), r, nccl_, comm_stream_), "ncclRecv");
        }
        enqueued(ncclGroupEnd(), "ncclGroupEnd");
        return launched("an all-to-all", world_ * bytes);
    }
    void do_broadcast_host(void* buf, size_t bytes, int root) override { host_->broadcast_host(buf, bytes, root); }

private:
    NcclComm(std::unique_ptr<MpiComm> host, ncclComm_t nccl, cudaStream_t stream, bool implicit_order)
        : host_(std::move(host)), stream_(stream), nccl_(nccl), implicit_order_(implicit_order) {
        rank_ = host_->rank();
        world_ = host_->world();
    }
    static ncclDataType_t nccl_type(DType t) { return t == DType::F32 ? ncclFloat : t == DType::BF16 ? ncclBfloat16 : ncclInt8; }

    // One line on an NCCL call that failed: what NCCL said, its last error's detail, and where to look
    void check(ncclResult_t r, const char* call) {
        if (r == ncclSuccess || r == ncclInProgress) return;
        fail(r, call);
    }
    [[noreturn]] void fail(ncclResult_t r, const char* what) {
        const char* detail = ncclGetLastError(nccl_);
        fatal(1, "rank %d on %s: NCCL failed in %s: %s%s%s (NCCL %d; NCCL_DEBUG=WARN says more; check that each rank sees its own GPU and that "
                 "NCCL_SOCKET_IFNAME / NCCL_IB_HCA name interfaces that reach every node)",
              rank_, host_name().c_str(), what, ncclGetErrorString(r), detail != nullptr && *detail ? ": " : "", detail != nullptr ? detail : "",
              nccl_runtime_version());
    }
    // a non-blocking communicator's call in progress, polled until it is done or failed
    void wait_ready(const char* what) {
        ncclResult_t state = ncclInProgress;
        watchdog().wait(
            [&] {
                if (ncclCommGetAsyncError(nccl_, &state) != ncclSuccess) state = ncclInternalError;
                return state != ncclInProgress;
            },
            [&] { return std::string(what) + " among " + label() + " (" + std::to_string(world_) + " rank(s))"; });
        if (state != ncclSuccess) fail(state, what);
    }
    // an enqueue: done, or in progress (then waited for until it is queued), or failed
    void enqueued(ncclResult_t r, const char* call) {
        check(r, call);
        if (r == ncclInProgress) wait_ready(call);
    }
    // the watchdog asks this communicator for its errors and what it has in flight, and aborts it
    void watch() {
        CUDA_CHECK(cudaGetDevice(&device_));
        watch_id_ = watchdog().add_source({[this] { return async_error(); }, [this] { return in_flight(); },
                                           [this] { ncclCommAbort(nccl_); }, [this] { return oldest_unfinished(); }});
    }
    std::string async_error() {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(nccl_, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress) return "";
        const char* detail = ncclGetLastError(nccl_);
        return "NCCL reported an error among " + label() + ": " + ncclGetErrorString(state) +
               (detail != nullptr && *detail ? std::string(": ") + detail : std::string());
    }
    struct Launched {
        cudaEvent_t done;
        const char* kind;
        size_t bytes;
        int group;
        std::chrono::steady_clock::time_point queued;
        bool waited;
    };
    // The oldest collective not yet finished (launched_.end(): none). The watchdog's thread asks
    // too: the caller holds mutex_, and the device is made current, as a new thread's is not.
    std::map<Ticket, Launched>::const_iterator oldest_unfinished_locked() const {
        (void)cudaSetDevice(device_);
        for (auto it = launched_.begin(); it != launched_.end(); ++it)
            if (cudaEventQuery(it->second.done) == cudaErrorNotReady) return it;
        return launched_.end();
    }
    // that collective and how long ago it was queued ("" when none is unfinished)
    std::string in_flight() const {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto it = oldest_unfinished_locked();
        if (it == launched_.end()) return "";
        char s[64];
        snprintf(s, sizeof(s), ", queued %.0f s ago", seconds_since(it->second.queued));
        return collective_words(it->second.kind, it->second.bytes, it->second.group, *this) + s;
    }
    // seconds since it was queued (0: none is unfinished)
    double oldest_unfinished() const {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto it = oldest_unfinished_locked();
        return it == launched_.end() ? 0.0 : seconds_since(it->second.queued);
    }

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
    // A collective queued: its ticket, and an event marking its end (for wait() and for the
    // watchdog's message). Collectives waited for and finished give their events back.
    Ticket launched(const char* kind, size_t bytes) {
        const Launched l{take_event(), kind, bytes, moving_group_, std::chrono::steady_clock::now(), false};
        CUDA_CHECK(cudaEventRecord(l.done, comm_stream_));  // may block on a full queue: not under the lock
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = launched_.begin(); it != launched_.end();) {
            if (it->second.waited && cudaEventQuery(it->second.done) == cudaSuccess) {
                free_events_.push_back(it->second.done);
                it = launched_.erase(it);
            } else {
                ++it;
            }
        }
        launched_[++last_ticket_] = l;
        return last_ticket_;
    }

    std::unique_ptr<MpiComm> host_;  // the host half, over the same ranks
    cudaStream_t stream_, comm_stream_ = nullptr;
    bool owns_comm_stream_ = false;
    ncclComm_t nccl_ = nullptr;
    bool implicit_order_;
    // guarded by mutex_, as the watchdog's thread reads it; the lock is never held across a call
    // that can block (a launch into a full queue) or end the process (CUDA_CHECK)
    std::map<Ticket, Launched> launched_;
    mutable std::mutex mutex_;
    int device_ = 0;
    std::vector<cudaEvent_t> free_events_;
    Ticket last_ticket_ = 0;
    int moving_group_ = -1;
    int watch_id_ = 0;
};
