// Waits with a deadline. Whenever this rank waits for other ranks (a collective, or device work
// queued behind one), it polls: past the deadline (--collective-timeout), or as soon as a
// communicator reports an error of its own, it says in one line what it waited for, where the
// run was and for how long, aborts the communicators that can be aborted, and ends the job
// (common/io.h's fatal: under MPI every rank stops). Without it a rank whose peer died or hung
// would spin in the collective until the job's wall-clock limit, printing nothing.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "io.h"

class Watchdog {
public:
    // Something the wait can ask while it polls, registered by a communicator: an error it has
    // seen (empty: none), what it has in flight (for the message), and how to abort it at once.
    struct Source {
        std::function<std::string()> error, in_flight;
        std::function<void()> abort;
    };

    // seconds a wait may take before the job ends (0: no limit)
    void set_timeout(double seconds) { timeout_ = seconds; }
    double timeout() const { return timeout_; }
    // this rank, for the message
    void set_rank(int rank) { rank_ = rank; }
    // what the run is doing, for the message ("step 12", "the checkpoint after step 20")
    void set_activity(std::string activity) { activity_ = std::move(activity); }
    const std::string& activity() const { return activity_; }

    int add_source(Source s) {
        sources_.push_back({next_id_, std::move(s)});
        return next_id_++;
    }
    void remove_source(int id) {
        for (size_t i = 0; i < sources_.size(); i++)
            if (sources_[i].first == id) sources_.erase(sources_.begin() + i);
    }

    // Polls done() until it is true. `what` says what is awaited ("an all-reduce of 8 bytes on the
    // 4 ranks"); it is built only if the wait fails. `allowance`: seconds beyond the timeout, for a
    // wait known to cover a peer's long work (rank 0 writing a checkpoint).
    template <class Done>
    void wait(Done done, const std::function<std::string()>& what, double allowance = 0.0) {
        if (done()) return;
        const auto start = std::chrono::steady_clock::now();
        for (int polls = 1;; polls++) {
            if (done()) return;
            // the sources cost a call each: asked every 64th poll, about a millisecond apart once sleeping
            if (polls % 64 == 0)
                for (const auto& s : sources_) {
                    const std::string error = s.second.error();
                    if (!error.empty()) end_job(error, what(), seconds_since(start));
                }
            const double waited = seconds_since(start);
            if (timeout_ > 0 && waited > timeout_ + allowance) end_job("", what(), waited);
            // spin first (a collective usually ends within microseconds), then sleep in short naps
            if (polls < 256) std::this_thread::yield();
            else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 100));
        }
    }

private:
    static double seconds_since(std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }
    [[noreturn]] void end_job(const std::string& error, const std::string& what, double waited) {
        const std::string host = host_name();
        std::string in_flight;
        for (const auto& s : sources_) {
            const std::string f = s.second.in_flight();
            if (!f.empty()) in_flight += (in_flight.empty() ? " (in flight: " : "; ") + f;
        }
        if (!in_flight.empty()) in_flight += ")";
        for (const auto& s : sources_) s.second.abort();
        const std::string where = activity_.empty() ? "" : ", during " + activity_;
        if (error.empty())
            fatal(1, "rank %d on %s: waited %.1f s for %s%s%s, more than --collective-timeout %g allows; a rank stopped or hangs, so the job ends",
                  rank_, host.c_str(), waited, what.c_str(), in_flight.c_str(), where.c_str(), timeout_);
        fatal(1, "rank %d on %s: %s, after %.1f s waiting for %s%s%s; the job ends", rank_, host.c_str(), error.c_str(), waited, what.c_str(),
              in_flight.c_str(), where.c_str());
    }

    double timeout_ = 600.0;
    int rank_ = 0;
    std::string activity_;
    std::vector<std::pair<int, Source>> sources_;
    int next_id_ = 1;
};

// the process's watchdog: one per rank
inline Watchdog& watchdog() {
    static Watchdog w;
    return w;
}
