// Communicator for a build without MPI: one rank, so every collective is a copy or nothing.
#pragma once
#include <cstdlib>
#include <cstring>

#include "comm.h"

class SingleComm : public Communicator {
public:
    using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
    explicit SingleComm(CopyFn device_copy) : copy_(device_copy) {}
    double all_reduce_host(double x) override { return x; }
    void barrier(double) override {}
    void gather_host(const void* send, void* recv, size_t bytes, int) override { memcpy(recv, send, bytes); }
    [[noreturn]] void abort(int code) override { exit(code); }
    std::unique_ptr<Communicator> split(int, int, int) override { return std::make_unique<SingleComm>(copy_); }
    NodeRanks node_ranks() override { return {}; }

protected:
    Ticket start_all_reduce(void*, size_t, DType) override { return 0; }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        if (send != recv) copy_(recv, send, n * dtype_size(t));
        return 0;
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        if (send != recv) copy_(recv, send, n * dtype_size(t));
        return 0;
    }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        return start_all_gather(send, recv, n, t);  // one rank: its block to itself
    }
    void do_broadcast_host(void*, size_t, int) override {}

private:
    CopyFn copy_;
};
