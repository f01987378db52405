// The one interface through which ranks talk. zero/ and the training loop call only these; an
// MPI implementation (host memory, or device memory staged through the host) and an NCCL one
// (device memory) sit behind it. The collectives are asynchronous (a ticket to wait for), so
// ZeRO can move one layer while the next is computed. Every collective is a sum where it reduces,
// and counts the bytes it moves per rank the way the ZeRO paper does: an all-reduce of n
// elements moves 2n (it is a reduce-scatter plus an all-gather), a reduce-scatter, all-gather or
// all-to-all over n elements in total moves n.
#pragma once
#include <array>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// I8: the bytes of quantized blocks (kernels/quantize_blocks.h), moved but never summed
enum class DType { F32, BF16, I8 };
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : t == DType::BF16 ? 2 : 1; }

struct CommCounters {
    uint64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, all_to_all = 0, broadcast = 0;
};

class Communicator {
public:
    virtual ~Communicator() = default;
    int rank() const { return rank_; }
    int world() const { return world_; }
    const CommCounters& counters() const { return counters_; }
    void reset_counters() { counters_ = CommCounters{}; }

    // A started collective: until wait(ticket) its buffers must stay untouched and its result
    // unused. After wait, host code may read a host result, and device work queued afterwards
    // sees a device result. Ticket 0 is a collective that finished before returning.
    using Ticket = uint64_t;
    // buf[0..n) summed over ranks, in place
    Ticket all_reduce_async(void* buf, size_t n, DType t) {
        counters_.all_reduce += 2 * n * dtype_size(t);
        return start_all_reduce(buf, n, t);
    }
    // send holds world*n elements, rank-major; rank r receives the sum of block r in recv[0..n)
    Ticket reduce_scatter_async(const void* send, void* recv, size_t n, DType t) {
        counters_.reduce_scatter += (size_t)world_ * n * dtype_size(t);
        return start_reduce_scatter(send, recv, n, t);
    }
    // every rank gives n elements; recv gets world*n elements, rank-major
    Ticket all_gather_async(const void* send, void* recv, size_t n, DType t) {
        counters_.all_gather += (size_t)world_ * n * dtype_size(t);
        return start_all_gather(send, recv, n, t);
    }
    // send holds world*n elements, rank-major: block r goes to rank r, and recv's block r (of
    // world*n) comes from rank r
    Ticket all_to_all_async(const void* send, void* recv, size_t n, DType t) {
        counters_.all_to_all += (size_t)world_ * n * dtype_size(t);
        return start_all_to_all(send, recv, n, t);
    }
    virtual void wait(Ticket) {}
    // host memory, from root to all
    void broadcast_host(void* buf, size_t bytes, int root) {
        counters_.broadcast += bytes;
        do_broadcast_host(buf, bytes, root);
    }
    // sum of a host scalar over ranks (losses, flags); not counted, it is a few bytes per step
    virtual double all_reduce_host(double x) = 0;
    // returns once every rank has called it; `allowance`: seconds the wait may take beyond the
    // watchdog's timeout (common/watchdog.h), where a rank is known to be busy for that long
    virtual void barrier(double allowance = 0.0) = 0;
    // root receives every rank's `bytes` of host memory, rank-major (a few bytes: gather_everywhere)
    virtual void gather_host(const void* send, void* recv, size_t bytes, int root) = 0;
    // stop every rank now, after this rank printed why
    [[noreturn]] virtual void abort(int code) = 0;
    // A communicator over `count` of this one's ranks: first, first + stride, ..., which hold
    // this rank (a collective: every rank calls it, naming its own subset, and the subsets
    // partition the ranks). Its collectives count their bytes apart from this one's.
    virtual std::unique_ptr<Communicator> split(int first, int count, int stride) = 0;
    // How this communicator's ranks sit on nodes (machines): how many share this rank's node, and
    // how many each node holds when every node holds as many and they are consecutive ranks
    // (mpirun's default placement; else 0). A collective.
    struct NodeRanks {
        int here = 1, per_node = 1;
    };
    virtual NodeRanks node_ranks() = 0;
    // One small collective of each kind, waited for, where a communicator sets up buffers on
    // first use (NCCL): they are then taken before a run reads what memory is free. A collective.
    virtual void warm_up() {}
    // what the messages call this communicator ("all ranks", "the shard group")
    const std::string& label() const { return label_; }
    virtual void set_label(std::string label) { label_ = std::move(label); }

    // ZeRO's schedule, told to a communicator that records it (test/recording_comm.h); the real
    // ones ignore it. ParamsWanted: the model asks for group g's parameters; GradsDone: group g's
    // backward is done; NextCollectiveMoves: the collective started next moves group g's
    // parameters or gradients; GradsToHost: group g's gradients of the step leave for the host
    // (offload).
    enum class Event { ParamsWanted, GradsDone, NextCollectiveMoves, GradsToHost };
    virtual void note(Event, int group) {}

protected:
    virtual Ticket start_all_reduce(void* buf, size_t n, DType t) = 0;
    virtual Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) = 0;
    virtual Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) = 0;
    virtual Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) = 0;
    virtual void do_broadcast_host(void* buf, size_t bytes, int root) = 0;
    int rank_ = 0, world_ = 1;
    CommCounters counters_;
    std::string label_ = "all ranks";
};

// "an all-gather of 1.50 MiB (group 7) among the shard group (4 rank(s))": a collective, in the words
// of the watchdog's message (group < 0: not said)
inline std::string collective_words(const std::string& kind, size_t bytes, int group, const Communicator& c) {
    char s[256];
    snprintf(s, sizeof(s), "%s of %.2f MiB%s among %s (%d rank(s))", kind.c_str(), bytes / 1048576.0,
             group >= 0 ? (" (group " + std::to_string(group) + ")").c_str() : "", c.label().c_str(), c.world());
    return s;
}

// Communicator::NodeRanks from what a rank learns of the nodes: `here` ranks share its node, the
// lowest and highest of them being ranks `lowest` and `highest`; over all ranks, the smallest and
// largest node, and whether every node found itself a block of consecutive ranks
// (node_is_a_block). Every node holds per_node ranks only when all of that holds.
inline bool node_is_a_block(int rank, int here, int lowest, int highest) {
    return lowest == rank / here * here && highest == lowest + here - 1;
}
inline Communicator::NodeRanks node_ranks_agreed(int here, int smallest, int largest, bool all_blocks) {
    return {here, smallest == largest && all_blocks ? here : 0};
}

// f() on rank 0, then on the other ranks: what a file or a flag has wrong is said once, by rank
// 0, whose error ends the job while the others wait (a collective)
template <class F>
void rank_0_first(Communicator& comm, F f) {
    if (comm.rank() != 0) comm.barrier();
    f();
    if (comm.rank() == 0) comm.barrier();
}

// every rank's `mine`, in rank order (a collective; for a few bytes of host data)
template <class T>
std::vector<T> gather_everywhere(Communicator& comm, const T& mine) {
    std::vector<T> all(comm.world());
    comm.gather_host(&mine, all.data(), sizeof(T), 0);
    comm.broadcast_host(all.data(), all.size() * sizeof(T), 0);
    return all;
}

// NCCL or MPI for device buffers. NCCL needs every rank on a GPU of its own; ranks of a node
// that share one must go through MPI, staged through host memory. Decided from the GPUs' ids
// (cudaDeviceProp.uuid) that the ranks of one node hold, in local rank order, not from how many
// GPUs a rank sees: under a per-rank CUDA_VISIBLE_DEVICES every rank sees one.
using GpuUuid = std::array<unsigned char, 16>;
struct CommChoice {
    bool nccl;
    std::string why;  // for the log
};
inline CommChoice choose_communicator(const std::vector<GpuUuid>& node_gpus) {
    for (size_t a = 0; a < node_gpus.size(); a++)
        for (size_t b = a + 1; b < node_gpus.size(); b++)
            if (node_gpus[a] == node_gpus[b])
                return {false, "local ranks " + std::to_string(a) + " and " + std::to_string(b) + " share a GPU"};
    return {true, "each of the node's " + std::to_string(node_gpus.size()) + " rank(s) has a GPU of its own"};
}
// How many ranks share the GPU of rank `rank` (itself included), from every rank's GPU id: those
// whose ids match, however many devices each rank sees (one, under a per-rank CUDA_VISIBLE_DEVICES)
inline int ranks_sharing_gpu(const std::vector<GpuUuid>& gpus, int rank) {
    int n = 0;
    for (const GpuUuid& g : gpus) n += g == gpus[rank];
    return n;
}
