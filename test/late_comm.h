// A communicator for tests whose collectives finish as late as they may: at wait(), never before.
// Real NCCL on GPUs finishes a collective some time after it starts, while the kernels go on;
// MPI's non-blocking collectives and MPI staged through host memory usually finish at once, so a
// test over them cannot see code that reads a collective's result too early or writes into its
// buffers while it is in flight. Over any real communicator (test/forwarding_comm.h), each
// collective here
//   - runs at its start, on the buffers as they are then (an in-place all-reduce's input kept),
//     and the result is set aside;
//   - fills its receive buffer with 0xFF bytes at once (NaN as fp32 or bf16), so that whatever
//     reads it before wait() computes with NaN;
//   - at wait(), checks that its send buffer still holds what it held at the start (for an
//     in-place all-reduce, the poison) and only then writes the result. A send buffer written
//     in between stops the job with one line naming the collective.
// A collective never waited for leaves its poison in place. Buffers are host memory, or device
// memory moved with the given copies (CudaBackend::to_host / from_host).
#pragma once
#include <cstring>
#include <map>
#include <vector>

#include "../common/io.h"
#include "forwarding_comm.h"

class LateComm : public ForwardingComm {
public:
    using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
    explicit LateComm(Communicator& inner, CopyFn to_host = nullptr, CopyFn from_host = nullptr)
        : ForwardingComm(inner), to_host_(to_host), from_host_(from_host) {}

    void wait(Ticket ticket) override {
        auto it = in_flight_.find(ticket);
        if (it == in_flight_.end()) return;
        const InFlight& c = it->second;
        if (read(c.send, c.send_at_start.size()) != c.send_at_start)
            fatal(1, "late communicator: rank %d: the send buffer of %s (ticket %llu) was written before its wait()", rank_, c.kind,
                  (unsigned long long)ticket);
        write(c.recv, c.result.data(), c.result.size());
        in_flight_.erase(it);
    }
    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        return owning<LateComm>(inner_.split(first, count, stride), to_host_, from_host_);
    }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        return late("an all-reduce", buf, bytes, buf, bytes, [&] { return inner_.all_reduce_async(buf, n, t); });
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        return late("a reduce-scatter", send, world_ * bytes, recv, bytes, [&] { return inner_.reduce_scatter_async(send, recv, n, t); });
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        return late("an all-gather", send, bytes, recv, world_ * bytes, [&] { return inner_.all_gather_async(send, recv, n, t); });
    }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = world_ * n * dtype_size(t);
        return late("an all-to-all", send, bytes, recv, bytes, [&] { return inner_.all_to_all_async(send, recv, n, t); });
    }

private:
    struct InFlight {
        const char* kind;
        const void* send;
        void* recv;
        std::vector<char> send_at_start, result;
    };
    // the collective run now on the inner communicator, its result set aside and the receive
    // buffer poisoned until wait()
    template <class Start>
    Ticket late(const char* kind, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, Start start) {
        inner_.wait(start());
        InFlight c{kind, send, recv, {}, read(recv, recv_bytes)};
        write(recv, std::vector<char>(recv_bytes, (char)0xFF).data(), recv_bytes);
        c.send_at_start = read(send, send_bytes);
        in_flight_[++last_ticket_] = std::move(c);
        return last_ticket_;
    }
    std::vector<char> read(const void* buf, size_t bytes) const {
        std::vector<char> out(bytes);
        if (to_host_) to_host_(out.data(), buf, bytes);
        else memcpy(out.data(), buf, bytes);
        return out;
    }
    void write(void* buf, const void* from, size_t bytes) const {
        if (from_host_) from_host_(buf, from, bytes);
        else memcpy(buf, from, bytes);
    }

    CopyFn to_host_, from_host_;
    std::map<Ticket, InFlight> in_flight_;
    Ticket last_ticket_ = 0;
};
