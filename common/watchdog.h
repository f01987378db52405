// Waits with a deadline. Whenever this rank waits for other ranks (a collective, or device work
// queued behind one), it polls: past the deadline (--collective-timeout), or as soon as a
// communicator reports an error of its own, it says in one line what it waited for, where the
// run was and for how long, aborts the communicators that can be aborted, and ends the job
// (under MPI every rank stops). Without it a rank whose peer died or hung would spin in the
// collective until the job's wall-clock limit, printing nothing.
//
// The host can also stop where no wait of ours polls: a kernel launch blocks once the GPU's
// queue is full behind a collective that never ends. So a thread of the watchdog's own asks the
// communicators that can tell (NCCL's) how long their oldest unfinished collective has been
// queued, and ends the job past the same deadline.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io.h"

inline double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class Watchdog {
public:
    // Something the wait can ask while it polls, registered by a communicator: an error it has
    // seen (empty: none), what it has in flight (for the message), and how to abort it at once.
    // oldest_unfinished: seconds since its oldest collective not yet finished was queued (0: none);
    // the watchdog's thread asks it, so it must be safe to call from another thread (empty: the
    // source is not watched from there).
    struct Source {
        std::function<std::string()> error, in_flight;
        std::function<void()> abort;
        std::function<double()> oldest_unfinished;
    };

    ~Watchdog() { stop_monitor(); }

    // seconds a wait may take before the job ends (0: no limit)
    void set_timeout(double seconds) { timeout_ = seconds; }
    double timeout() const { return timeout_; }
    // this rank, for the message
    void set_rank(int rank) { rank_ = rank; }
    // what the run is doing, for the message ("step 12", "the checkpoint after step 20")
    void set_activity(std::string activity) {
        std::lock_guard<std::mutex> lock(mutex_);
        activity_ = std::move(activity);
    }
    std::string activity() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return activity_;
    }

    int add_source(Source s) {
        std::lock_guard<std::mutex> lock(mutex_);
        const bool watched = static_cast<bool>(s.oldest_unfinished);
        sources_.push_back({next_id_, std::move(s)});
        if (watched && !monitor_.joinable()) {
            stopping_ = false;
            monitor_ = std::thread([this] { monitor(); });
        }
        return next_id_++;
    }
    void remove_source(int id) {
        bool any_watched = false;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            sources_.erase(std::remove_if(sources_.begin(), sources_.end(), [id](const auto& s) { return s.first == id; }), sources_.end());
            for (const auto& s : sources_) any_watched |= static_cast<bool>(s.second.oldest_unfinished);
        }
        { std::lock_guard<std::mutex> asked(asking_); }  // the thread is no longer asking the removed source
        if (!any_watched) stop_monitor();
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
            if (polls % 64 == 0) {
                const std::string error = first_source_error();
                if (!error.empty()) end_job_waiting(error, what(), seconds_since(start));
            }
            const double waited = seconds_since(start);
            const double timeout = timeout_;
            if (timeout > 0 && waited > timeout + allowance) end_job_waiting("", what(), waited);
            // spin first (a collective usually ends within microseconds), then sleep in short naps
            if (polls < 256) std::this_thread::yield();
            else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 100));
        }
    }

private:
    std::string first_source_error() {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& s : sources_) {
            std::string error = s.second.error();
            if (!error.empty()) return error;
        }
        return "";
    }
    // " (in flight: ...)" from every source, or ""
    std::string in_flight_words() {
        std::lock_guard<std::mutex> lock(mutex_);
        std::string in_flight;
        for (const auto& s : sources_) {
            const std::string f = s.second.in_flight();
            if (!f.empty()) in_flight += (in_flight.empty() ? " (in flight: " : "; ") + f;
        }
        return in_flight.empty() ? in_flight : in_flight + ")";
    }
    std::string where() const {
        const std::string a = activity();
        return a.empty() ? "" : ", during " + a;
    }
    // Only one thread says why the job ends; another that finds a reason too waits for the end.
    void claim_the_end() {
        if (!ending_.exchange(true))
            return;
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }

    // the main thread, in a wait that timed out or whose source reported an error
    [[noreturn]] void end_job_waiting(const std::string& error, const std::string& what, double waited) {
        claim_the_end();
        const std::string host = host_name(), in_flight = in_flight_words(), during = where();
        if (error.empty())
            say_error("rank %d on %s: waited %.1f s for %s%s%s, more than --collective-timeout %g allows; a rank stopped or hangs, so the job ends",
                      (int)rank_, host.c_str(), waited, what.c_str(), in_flight.c_str(), during.c_str(), (double)timeout_);
        else
            say_error("rank %d on %s: %s, after %.1f s waiting for %s%s%s; the job ends", (int)rank_, host.c_str(), error.c_str(), waited, what.c_str(),
                      in_flight.c_str(), during.c_str());
        // said first: an abort may itself take a while
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (const auto& s : sources_) s.second.abort();
        }
        end_process(1);
    }

    // The watchdog's thread: every source that can tell is asked how long its oldest unfinished
    // collective has waited, a few times per timeout (at most a second apart).
    // The sources are asked without the watchdog's lock held, so that a source that waits for
    // its own lock never holds up the main thread's waits. A wait's allowance does not apply here:
    // no collective is in flight while ranks wait out a peer's long work (a checkpoint's barrier).
    void monitor() {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!stopping_) {
            const double timeout = timeout_;
            const double period = timeout > 0 ? std::min(1.0, std::max(0.01, timeout / 8)) : 1.0;
            stop_or_tick_.wait_for(lock, std::chrono::duration<double>(period));
            if (stopping_ || timeout <= 0 || ending_) continue;
            std::vector<std::function<double()>> ages;
            for (const auto& s : sources_)
                if (s.second.oldest_unfinished) ages.push_back(s.second.oldest_unfinished);
            std::unique_lock<std::mutex> asking(asking_);  // a source removed meanwhile waits for its answer
            lock.unlock();
            for (const auto& oldest_unfinished : ages) {
                const double age = oldest_unfinished();
                if (age > timeout) end_job_from_monitor(age);
            }
            asking.unlock();
            lock.lock();
        }
    }
    // The main thread may be inside the communicator's library (a launch that blocks), so the
    // communicators are not aborted, nor MPI called (MPI started without threads); the process
    // just ends: mpirun then ends the job (a rank gone before MPI_Finalize), and the other
    // ranks' own watchdogs would too.
    [[noreturn]] void end_job_from_monitor(double age) {
        claim_the_end();
        const std::string host = host_name(), in_flight = in_flight_words(), during = where();
        say_error("rank %d on %s: a collective queued %.1f s ago has not finished%s%s, more than --collective-timeout %g allows; a rank stopped or "
                  "hangs, so the job ends",
                  (int)rank_, host.c_str(), age, in_flight.c_str(), during.c_str(), (double)timeout_);
        _exit(1);  // not exit(): the main thread still runs, and must not see the process's objects destroyed under it
    }
    // Once the job ends, the thread may be in claim_the_end() for good: it is left to the
    // process's end, not joined.
    void stop_monitor() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        stop_or_tick_.notify_all();
        if (!monitor_.joinable() || monitor_.get_id() == std::this_thread::get_id()) return;
        if (ending_) monitor_.detach();
        else monitor_.join();
    }

    std::atomic<double> timeout_{600.0};
    std::atomic<int> rank_{0};
    mutable std::mutex mutex_;  // guards activity_, sources_, stopping_
    std::mutex asking_;         // held by the thread while it asks the sources, without mutex_
    std::string activity_;
    std::vector<std::pair<int, Source>> sources_;
    int next_id_ = 1;
    std::thread monitor_;
    std::condition_variable stop_or_tick_;
    bool stopping_ = false;
    std::atomic<bool> ending_{false};
};

// the process's watchdog: one per rank
inline Watchdog& watchdog() {
    static Watchdog w;
    return w;
}
