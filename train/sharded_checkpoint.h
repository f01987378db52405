// Checkpoints that every rank writes and reads at once, each its own part: the runs of the flat
// layout it owns (zero/'s owned_runs()), at their offsets in llm.c's model_N.bin and in our
// state_N.bin (train/state_file.h). The files are the ones a single process writes, so any stage
// and world size reads them back, and each rank reads only what it will own. No rank holds more
// of a checkpoint than its staging buffer (kCheckpointStagingBytes at most), or with
// --async-checkpoint its own part whole, which the memory plan counts (train/memory_plan.h).
//
// A save: rank 0 makes both files as NAME.TOKEN.tmp at their full size, with the model's and the
// state's headers and the state's tail (the loader's order, the outlier detectors); TOKEN is new
// at every save, so that a rank can only open the files rank 0 just made (not a leftover of its
// own where -o is not shared). Then each rank that writes a part (one per part: the first shard
// group's) opens them, writes its runs and syncs them; once every rank has, rank 0 renames both
// into place, syncs the directory and writes DONE_N. A rank killed anywhere in between leaves
// .tmp files and no DONE_N, so -y 1 takes the checkpoint before. An async save returns once the
// rank's part is copied to the host; a thread writes it while training goes on, and between
// steps the ranks agree (poll) whether every part is durable, after which rank 0 completes it
// the same way.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/bf16.h"
#include "../common/io.h"
#include "../common/watchdog.h"
#include "../data/checkpoint.h"
#include "../zero/zero.h"
#include "run_dir.h"
#include "state_file.h"

// host memory a rank stages a checkpoint's parts through, at a save and at a load, at most
constexpr size_t kCheckpointStagingBytes = (size_t)32 << 20;
// fp32 values of a rank's staging buffer: the most a piece of its runs needs, up to the above
// (a small model's whole runs take less)
inline size_t staging_values(const std::vector<CheckpointRun>& runs) {
    size_t longest = 0;
    for (const CheckpointRun& r : runs) longest = std::max(longest, r.n);
    return std::min(longest, kCheckpointStagingBytes / sizeof(float));
}
// The slowest disk a checkpoint is written to or read from that the watchdog allows for (a
// network file system under load): a rank waits that much longer than the timeout for the
// slowest part (a test of the allowance makes the disk slower, test/fault_job.cpp).
inline double g_slowest_disk_bytes_per_second = 25e6;

// where each array of a checkpoint of `count` parameters lies in its two files
struct CheckpointLayout {
    size_t count;        // parameters
    size_t param_bytes;  // bytes of each in model_N.bin: 4 (fp32) or 2 (bf16)
    bool master;         // the state holds fp32 master weights
    std::vector<CheckpointArray> arrays() const {
        std::vector<CheckpointArray> a = {CheckpointArray::Params, CheckpointArray::AdamM, CheckpointArray::AdamV};
        if (master) a.push_back(CheckpointArray::Master);
        return a;
    }
    static int state_index(CheckpointArray a) { return (int)a - (int)CheckpointArray::AdamM; }  // in the state file
    size_t element_bytes(CheckpointArray a) const { return a == CheckpointArray::Params ? param_bytes : sizeof(float); }
    size_t offset(CheckpointArray a, size_t flat) const {
        return a == CheckpointArray::Params ? kHeaderBytes + flat * param_bytes : state_array_offset(state_index(a), count) + flat * sizeof(float);
    }
    // bytes of a part of `elements` elements of each array
    size_t part_bytes(size_t elements) const { return elements * (param_bytes + (master ? 3 : 2) * sizeof(float)); }
};

// f(array, run, from, n): a rank's part (its runs of each array) in pieces of at most max_n
// elements, in file order
template <class F>
void for_each_piece(const CheckpointLayout& layout, const std::vector<CheckpointRun>& runs, size_t max_n, F f) {
    for (CheckpointArray a : layout.arrays())
        for (const CheckpointRun& r : runs)
            for (size_t from = 0; from < r.n; from += max_n) f(a, r, from, std::min(max_n, r.n - from));
}

// the watchdog's allowance for a wait behind the slowest rank's part of a checkpoint
inline double checkpoint_allowance(const CheckpointLayout& layout, size_t largest_part_elements) {
    return (double)layout.part_bytes(largest_part_elements) / g_slowest_disk_bytes_per_second;
}

// one of a checkpoint's files being written (path: its .tmp), from the main thread or the save's
// own; a call that fails returns the line that says so ("" when it did not)
struct PartFile {
    std::string path;
    int fd = -1;
    std::string write_at(const void* buf, size_t bytes, size_t offset) const {
        for (size_t done = 0; done < bytes;) {
            const ssize_t n = pwrite(fd, (const char*)buf + done, bytes - done, (off_t)(offset + done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return path + ": write failed: " + strerror(n < 0 ? errno : EIO);
            done += (size_t)n;
        }
        return "";
    }
    std::string sync_and_close() {
        const bool synced = fsync(fd) == 0;
        const int sync_error = errno;
        const bool closed = close(fd) == 0;
        fd = -1;
        if (!synced) return path + ": fsync failed: " + strerror(sync_error);
        return closed ? "" : path + ": write failed: " + strerror(errno);
    }
};

// the copy of this rank's part an async save writes from, as the files hold it (none where the
// rank writes no part)
template <class Backend>
size_t async_copy_bytes(const Zero<Backend>& zero) {
    size_t part = 0;
    for (const CheckpointRun& r : zero.owned_runs()) part += zero.saves_its_runs() ? r.n : 0;
    return CheckpointLayout{zero.plan().total(), sizeof(typename Backend::floatX), zero.has_master_weights()}.part_bytes(part);
}
// Host memory a rank holds for checkpoints: its staging buffer where the run saves or loads one
// (checkpoint_io), and with async saves the copy of its part. The run and its plan both ask this.
template <class Backend>
size_t checkpoint_host_bytes(const Zero<Backend>& zero, bool checkpoint_io, bool async) {
    if (!checkpoint_io) return 0;
    return staging_values(zero.owned_runs()) * sizeof(float) + (async ? async_copy_bytes(zero) : 0);
}

// Saves checkpoints; `async`: in the background (--async-checkpoint), from a copy of this rank's
// part in host memory held from the start, so that the memory the plan counts is there (or the
// run stops at its start, not at its first checkpoint) and no save waits for pages.
template <class Backend>
class CheckpointWriter {
public:
    CheckpointWriter(Communicator& comm, Zero<Backend>& zero, const GPT2Config& c, bool async)
        : comm_(comm), zero_(zero), model_(c),
          layout_{zero.plan().total(), sizeof(typename Backend::floatX), zero.has_master_weights()},
          runs_(zero.owned_runs()), async_(async),
          snapshot_(async ? async_copy_bytes(zero) : 0) {}
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;
    ~CheckpointWriter() {  // a run that ends by an error: the part is abandoned, without a DONE
        if (thread_.joinable()) thread_.join();
    }

    // The checkpoint of `step` in dir, holding `rest` (the state but its arrays), after which the
    // checkpoint `retire` goes (0: none). Returns once written, or, async, once this rank's part
    // is copied to the host (a save before still under way is finished first). A collective.
    void save(const std::string& dir, int step, const OptimizerState& rest, int retire) {
        finish();
        dir_ = dir, step_ = step, retire_ = retire;
        kept_ = checkpoint_kept(dir);
        const bool root = comm_.rank() == 0, writes = zero_.saves_its_runs();
        uint64_t token = 0;  // names this save's files
        if (root) {
            std::random_device random;
            token = (uint64_t)random() << 32 | random();
            name_files(token);
            make_files(rest);
        }
        comm_.broadcast_host(&token, sizeof(token), 0);  // once the files exist
        if (!root) name_files(token);
        if (writes && !root) open_files();
        std::vector<float> staging(writes ? staging_values(runs_) : 0);
        writes_.clear();
        size_t copied = 0;  // into the snapshot
        if (writes)
            for_each_piece(layout_, runs_, staging.size(), [&](CheckpointArray a, const CheckpointRun& r, size_t from, size_t n) {
                const size_t bytes = stage(a, r, from, n, staging.data()), offset = layout_.offset(a, r.flat + from);
                const int file = a == CheckpointArray::Params ? 0 : 1;
                if (!async_) return report(files_[file].write_at(staging.data(), bytes, offset));
                writes_.push_back({file, offset, copied, bytes});
                memcpy(snapshot_.data() + copied, staging.data(), bytes);
                copied += bytes;
            });
        pending_ = true;
        if (!async_) {
            if (writes) report(sync_and_close());
            complete();
            return;
        }
        done_ = false;
        if (writes) thread_ = std::thread([this] { write_snapshot(); });
        else done_ = true;
    }
    // Between steps, while an async save is under way: whether every rank's part is durable,
    // and if so the checkpoint completed. A collective while one is under way.
    void poll() {
        if (!pending_) return;
        const bool done = done_;  // read once: the thread may finish between two reads
        if (done) report_thread_error();
        if (comm_.all_reduce_host(done ? 0.0 : 1.0) == 0.0) complete();
    }
    // waits for an async save under way and completes it (a collective)
    void finish() {
        if (!pending_) return;
        watchdog().set_activity("the checkpoint after step " + std::to_string(step_) + " (its parts written in the background)");
        if (thread_.joinable()) thread_.join();
        complete();
    }

private:
    struct Write {  // a piece of the snapshot, for the thread
        int file;
        size_t offset, at, bytes;
    };

    void name_files(uint64_t token) {
        char tmp[32];
        snprintf(tmp, sizeof(tmp), ".%016" PRIx64 ".tmp", token);
        files_[0].path = checkpoint_path(dir_, "model", step_) + tmp;
        files_[1].path = checkpoint_path(dir_, "state", step_) + tmp;
    }
    // rank 0: both .tmp files, sized, with their headers and the state's tail
    void make_files(const OptimizerState& rest) {
        for (PartFile& f : files_) {
            f.fd = open(f.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (f.fd < 0) fatal(1, "rank 0: cannot create %s: %s; %s", f.path.c_str(), strerror(errno), kept_.c_str());
        }
        const int32_t model_header[kHeaderInts] = {kCheckpointMagic, checkpoint_version(layout_.param_bytes), model_.max_seq_len, model_.vocab_size,
                                                   model_.num_layers, model_.num_heads, model_.channels, model_.padded_vocab_size};
        const FileHeader state = state_header(rest, layout_.count, layout_.master);
        const std::vector<char> tail = state_tail(rest);
        const size_t state_tail_at = state_array_offset(layout_.master ? 3 : 2, layout_.count);
        report(files_[0].write_at(model_header, sizeof(model_header), 0));
        report(files_[1].write_at(state.field, sizeof(state.field), 0));
        report(files_[1].write_at(tail.data(), tail.size(), state_tail_at));
        if (ftruncate(files_[0].fd, (off_t)layout_.offset(CheckpointArray::Params, layout_.count)) != 0)
            report(files_[0].path + ": cannot size it: " + strerror(errno));
    }
    void open_files() {
        for (PartFile& f : files_) {
            f.fd = open(f.path.c_str(), O_WRONLY);
            if (f.fd < 0)
                fatal(1, "rank %d on %s: cannot open %s, which rank 0 made: %s; every rank writes its part of the checkpoint, so -o must "
                         "be a directory every rank sees (a shared file system); %s",
                      comm_.rank(), host_name().c_str(), f.path.c_str(), strerror(errno), kept_.c_str());
        }
    }
    // piece [from, from + n) of run r of array a -> buf as the file holds it; returns its bytes
    size_t stage(CheckpointArray a, const CheckpointRun& r, size_t from, size_t n, float* buf) {
        zero_.copy_out(a, r, from, n, buf);
        if (layout_.element_bytes(a) == sizeof(float)) return n * sizeof(float);
        uint16_t* narrow = (uint16_t*)buf;  // narrowed in place from the start: no value is overwritten before it is read
        for (size_t i = 0; i < n; i++) narrow[i] = float_to_bf16_bits(buf[i]);
        return n * sizeof(uint16_t);
    }
    std::string sync_and_close() {
        std::string error;
        for (PartFile& f : files_) {
            const std::string e = f.sync_and_close();
            if (error.empty()) error = e;
        }
        return error;
    }
    // the save's thread: the snapshot into the files, synced; no collective, no backend call
    void write_snapshot() {
        std::string error;
        for (const Write& w : writes_)
            if (error.empty()) error = files_[w.file].write_at(snapshot_.data() + w.at, w.bytes, w.offset);
        const std::string closed = sync_and_close();
        thread_error_ = error.empty() ? closed : error;
        done_ = true;
    }
    // a failed write ends the job, first giving the files' space back (the others' writes to
    // them, under way, then go nowhere)
    void report(const std::string& error) const {
        if (error.empty()) return;
        for (const PartFile& f : files_) remove(f.path.c_str());
        fatal(1, "rank %d: %s; %s", comm_.rank(), error.c_str(), kept_.c_str());
    }
    // once the thread is done
    void report_thread_error() {
        if (thread_error_.empty()) return;
        if (thread_.joinable()) thread_.join();
        report(thread_error_);
    }
    // every rank's part is durable (or, staged, once every rank is here): rank 0 renames the
    // files into place, makes that durable, then DONE, then retires the old checkpoint
    void complete() {
        if (thread_.joinable()) thread_.join();
        report_thread_error();  // this rank's part is durable, or the job ends here
        const double allowance = checkpoint_allowance(layout_, zero_.plan().shard_size());
        watchdog().set_activity("the checkpoint after step " + std::to_string(step_) + " (every rank's part written)");
        comm_.barrier(allowance);
        pending_ = false;
        if (comm_.rank() != 0) return;
        const char* kinds[] = {"model", "state"};
        for (int i = 0; i < 2; i++) {
            const std::string path = checkpoint_path(dir_, kinds[i], step_);
            if (rename(files_[i].path.c_str(), path.c_str()) != 0)
                fatal(1, "rank 0: %s: rename failed: %s; %s", files_[i].path.c_str(), strerror(errno), kept_.c_str());
        }
        sync_dir(dir_, kept_);
        write_done(dir_, step_, kept_);
        if (retire_ > 0) remove_checkpoint(dir_, retire_);
    }

    Communicator& comm_;
    Zero<Backend>& zero_;
    const GPT2Config model_;
    const CheckpointLayout layout_;
    const std::vector<CheckpointRun> runs_;
    const bool async_;
    PartFile files_[2];  // model_N.bin.TOKEN.tmp, state_N.bin.TOKEN.tmp
    std::string dir_, kept_;
    int step_ = 0, retire_ = 0;
    bool pending_ = false;  // a save not yet completed
    // an async save: this rank's part as the files hold it, where each piece goes, and its thread
    std::vector<char> snapshot_;  // sized (and its pages touched) at the start
    std::vector<Write> writes_;
    std::thread thread_;
    std::atomic<bool> done_{true};
    std::string thread_error_;  // written by the thread before done_, read after
};

// The parameters of model file `path` (model c): each rank reads its own runs, then the stage
// gathers what it keeps whole. A collective.
template <class Backend>
void load_params(Zero<Backend>& zero, Communicator& comm, const std::string& path, const GPT2Config& c) {
    const std::string named = "rank " + std::to_string(comm.rank()) + ": " + path;  // for the errors
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr) fatal(1, "%s: cannot open: %s", named.c_str(), strerror(errno));
    GPT2Config in_file;
    const size_t elem = read_checkpoint_header(f, named, &in_file);
    if (memcmp(&in_file, &c, sizeof(c)) != 0)
        fatal(1, "%s: the model L=%d NH=%d C=%d V=%d maxT=%d, not the run's L=%d NH=%d C=%d V=%d maxT=%d (the file changed since the run read it)",
              named.c_str(), in_file.num_layers, in_file.num_heads, in_file.channels, in_file.vocab_size, in_file.max_seq_len, c.num_layers,
              c.num_heads, c.channels, c.vocab_size, c.max_seq_len);
    const std::vector<CheckpointRun> runs = zero.owned_runs();
    std::vector<float> staging(staging_values(runs));
    const CheckpointLayout params_only{zero.plan().total(), elem, false};
    for_each_piece(params_only, runs, staging.size(), [&](CheckpointArray a, const CheckpointRun& r, size_t from, size_t n) {
        if (a != CheckpointArray::Params) return;
        read_params(f, named, c, elem, r.flat + from, n, staging.data());
        zero.copy_in(a, r, from, n, staging.data());
    });
    fclose(f);
    comm.barrier(checkpoint_allowance(params_only, zero.plan().shard_size()));  // the slowest rank's reads
    zero.finish_loading_params();
}

// The state of the checkpoint at `step` (state file `path`, model c): each rank reads its own
// runs of m, v and the master weights (where the run keeps them), and every rank the rest,
// which it returns (its arrays empty). Rank 0 reads the header and the tail first, so that
// what is wrong with the file is said once. A collective.
template <class Backend>
OptimizerState load_state(Zero<Backend>& zero, Communicator& comm, const std::string& path, int step, const GPT2Config& c) {
    const std::string named = "rank " + std::to_string(comm.rank()) + ": " + path;
    FILE* f = nullptr;
    OptimizerState rest;
    rank_0_first(comm, [&] {
        f = fopen(path.c_str(), "rb");
        if (f == nullptr) fatal(1, "%s: cannot open: %s", named.c_str(), strerror(errno));
        bool has_master = false;
        rest = read_state_except_arrays(f, named, step, c, &has_master);
        if (zero.has_master_weights() && !has_master)
            fatal(1, "-y 1: %s: the state at step %d has no master weights (written with -w 0 or by an fp32 build); resume with -w 0", named.c_str(), step);
    });
    const CheckpointLayout layout{zero.plan().total(), 0, zero.has_master_weights()};
    const std::vector<CheckpointRun> runs = zero.owned_runs();
    std::vector<float> staging(staging_values(runs));
    for_each_piece(layout, runs, staging.size(), [&](CheckpointArray a, const CheckpointRun& r, size_t from, size_t n) {
        if (a == CheckpointArray::Params) return;
        const int index = CheckpointLayout::state_index(a);
        pread_exact(fileno(f), staging.data(), n * sizeof(float), state_array_offset(index, layout.count) + (r.flat + from) * sizeof(float),
                    named, kStateArrayNames[index]);
        check_state_values(named, index, staging.data(), r.flat + from, n, c);
        zero.copy_in(a, r, from, n, staging.data());
    });
    fclose(f);
    comm.barrier(checkpoint_allowance(layout, zero.plan().shard_size()));
    return rest;
}
