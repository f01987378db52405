// A communicator for tests that passes every call on to a real one, for wrappers that change
// or watch a few of them (test/recording_comm.h, test/late_comm.h). A wrapper's split() wraps
// the inner communicator's split in a wrapper of its own kind (owning()).
#pragma once
#include <cstdlib>
#include <memory>
#include <string>

#include "../zero/comm.h"

class ForwardingComm : public Communicator {
public:
    explicit ForwardingComm(Communicator& inner) : inner_(inner) {
        rank_ = inner.rank();
        world_ = inner.world();
        label_ = inner.label();
    }
    // a Wrapper(*inner, args...) that owns `inner` (a split's, say)
    template <class Wrapper, class... Args>
    static std::unique_ptr<Wrapper> owning(std::unique_ptr<Communicator> inner, Args... args) {
        auto wrapper = std::make_unique<Wrapper>(*inner, args...);
        wrapper->owned_inner_ = std::move(inner);
        return wrapper;
    }
    double all_reduce_host(double x) override { return inner_.all_reduce_host(x); }
    void wait(Ticket ticket) override { inner_.wait(ticket); }
    void barrier(double allowance) override { inner_.barrier(allowance); }
    void gather_host(const void* send, void* recv, size_t bytes, int root) override { inner_.gather_host(send, recv, bytes, root); }
    [[noreturn]] void abort(int code) override {
        inner_.abort(code);
        exit(code);  // not reached; the compiler does not see it through the virtual call
    }
    NodeRanks node_ranks() override { return inner_.node_ranks(); }
    void note(Event event, int group) override { inner_.note(event, group); }
    void set_label(std::string label) override {
        inner_.set_label(label);
        label_ = std::move(label);
    }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override { return inner_.all_reduce_async(buf, n, t); }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override { return inner_.reduce_scatter_async(send, recv, n, t); }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override { return inner_.all_gather_async(send, recv, n, t); }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override { return inner_.all_to_all_async(send, recv, n, t); }
    void do_broadcast_host(void* buf, size_t bytes, int root) override { inner_.broadcast_host(buf, bytes, root); }

    Communicator& inner_;
    std::unique_ptr<Communicator> owned_inner_;  // when made by split()
};
