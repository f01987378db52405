// A communicator for tests that passes every call on to a real one (so the numbers stay right)
// and records, in order, each collective's start and wait beside ZeRO's schedule events
// (Communicator::note), so a test can check when things happen, not only what comes out. The
// communicators split() makes (hybrid sharding's groups) record into the same log, each entry
// naming its communicator (link).
#pragma once
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "forwarding_comm.h"

class RecordingComm : public ForwardingComm {
public:
    enum class What { Start, Wait, ParamsWanted, GradsDone, GradsToHost };
    enum class Op { AllReduce, ReduceScatter, AllGather, AllToAll };
    struct Entry {
        What what;
        int group;          // the group an event is about, or the one a start serves (-1: not said)
        Ticket ticket = 0;  // Start, Wait: this communicator's ticket, the start's number from 1
        Op op = Op::AllReduce;
        size_t n = 0;  // Start: the collective's n (elements per rank)
        // Start: the bytes it reads and writes until waited for
        const char *read_lo = nullptr, *read_hi = nullptr, *write_lo = nullptr, *write_hi = nullptr;
        DType dtype = DType::F32;  // Start: of its elements
        int link = 0;              // the communicator: 0 the one made by the test, 1, 2... its splits in order
        size_t bytes() const { return n * dtype_size(dtype); }  // Start: elements per rank, in bytes
        bool reduces() const { return what == What::Start && op != Op::AllGather; }  // a quantized reduce-scatter is an all-to-all
        bool gathers() const { return what == What::Start && op == Op::AllGather; }
    };

    explicit RecordingComm(Communicator& inner) : ForwardingComm(inner), shared_(std::make_shared<Shared>()) {}
    const std::vector<Entry>& log() const { return shared_->log; }

    // What the log shows against the design (zero/zero.h): a collective started while one in
    // flight reads what it writes or writes what it reads (a buffer reused too early), a wait
    // for no collective or for one already waited for, a collective never waited for. Empty
    // when there is none; else one line each.
    std::vector<std::string> misuse() const {
        std::vector<std::string> out;
        std::vector<const Entry*> in_flight;
        auto overlap = [](const char* a_lo, const char* a_hi, const char* b_lo, const char* b_hi) { return a_lo < b_hi && b_lo < a_hi; };
        for (const Entry& e : shared_->log) {
            if (e.what == What::Start) {
                for (const Entry* f : in_flight)
                    if (overlap(e.write_lo, e.write_hi, f->read_lo, f->read_hi) || overlap(e.write_lo, e.write_hi, f->write_lo, f->write_hi) ||
                        overlap(e.read_lo, e.read_hi, f->write_lo, f->write_hi))
                        out.push_back("collective " + std::to_string(e.ticket) + " (group " + std::to_string(e.group) +
                                      ") started on the buffers of collective " + std::to_string(f->ticket) + " (group " +
                                      std::to_string(f->group) + "), still in flight");
                in_flight.push_back(&e);
            } else if (e.what == What::Wait) {
                auto it = in_flight.begin();
                while (it != in_flight.end() && (*it)->ticket != e.ticket) ++it;
                if (it == in_flight.end()) out.push_back("wait for ticket " + std::to_string(e.ticket) + ", which is not in flight");
                else in_flight.erase(it);
            }
        }
        for (const Entry* f : in_flight) out.push_back("collective " + std::to_string(f->ticket) + " never waited for");
        return out;
    }

    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        auto sub = owning<RecordingComm>(inner_.split(first, count, stride));
        sub->shared_ = shared_;
        sub->link_ = ++shared_->links;
        return sub;
    }
    void wait(Ticket ticket) override {
        if (ticket == 0) return;  // finished when it started (zero/comm.h)
        inner_.wait(shared_->inner_tickets.at(ticket - 1));
        append({What::Wait, -1, ticket});
    }
    void note(Event event, int group) override {
        inner_.note(event, group);
        if (event == Event::NextCollectiveMoves) serves_ = group;
        else append({event == Event::ParamsWanted ? What::ParamsWanted : event == Event::GradsDone ? What::GradsDone : What::GradsToHost, group});
    }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        return record(Op::AllReduce, n, t, buf, bytes, buf, bytes, inner_.all_reduce_async(buf, n, t));
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        return record(Op::ReduceScatter, n, t, send, world_ * bytes, recv, bytes, inner_.reduce_scatter_async(send, recv, n, t));
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = n * dtype_size(t);
        return record(Op::AllGather, n, t, send, bytes, recv, world_ * bytes, inner_.all_gather_async(send, recv, n, t));
    }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        const size_t bytes = world_ * n * dtype_size(t);
        return record(Op::AllToAll, n, t, send, bytes, recv, bytes, inner_.all_to_all_async(send, recv, n, t));
    }

private:
    // every start gets a ticket of its own, also where the inner one finished at once (ticket 0),
    // so that every start is matched with its wait
    Ticket record(Op op, size_t n, DType t, const void* read, size_t read_bytes, void* write, size_t write_bytes, Ticket inner) {
        shared_->inner_tickets.push_back(inner);
        const Ticket ticket = shared_->inner_tickets.size();
        const char *r = (const char*)read, *w = (const char*)write;
        Entry e{What::Start, serves_, ticket, op, n, r, r + read_bytes, w, w + write_bytes};
        e.dtype = t;
        append(e);
        serves_ = -1;
        return ticket;
    }
    void append(Entry e) {
        e.link = link_;
        shared_->log.push_back(e);
    }

    // what this communicator and the ones split() made from it share: one log, one ticket count
    struct Shared {
        std::vector<Entry> log;
        std::vector<Ticket> inner_tickets;  // by our ticket - 1
        int links = 0;                      // split() communicators made so far
    };
    std::shared_ptr<Shared> shared_;
    int link_ = 0;
    int serves_ = -1;  // the group the next collective serves, as last noted
};
