// ZeRO-Offload (--offload cpu, DeepSpeed's offload_optimizer: {device: cpu}): this rank's fp32
// master weights and Adam moments live in host memory (pinned on CUDA) and AdamW runs there, on
// every core, so the device holds no optimizer state. Within a step:
//   backward   as soon as a group's gradient shard is reduced for the last time in the step, it
//              goes to the host, on the transfer stream, while the backward goes on;
//   grad_norm  on the device, as without offload: clipping and the -sl/-sg skips need the global
//              norm before any update, so no group can be updated during backward;
//   update     group by group: wait for its gradients, AdamW on the host, queue its new
//              parameters back to the device and go on to the next group while they travel
//              (and, at stages 1-2, while the group is all-gathered).
// One host staging buffer in shard layout takes the gradients in and gives the new parameters
// out (each element's gradient is read before its parameter is written), so a step allocates
// nothing. On the CPU backend host and device are one memory; the same buffers and copies are
// used all the same, which is what lets the CPU tests check the offload path.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "../common/io.h"  // fatal
#include "../kernels/adamw_step.h"
#include "../kernels/allocations.h"
#include "../kernels/shard_table.h"

// host bytes a rank's offloaded state takes: fp32 master, m and v (12 bytes per element of its
// shard) and the staging buffer (one parameter per element)
inline size_t offload_host_bytes(size_t shard_elements, size_t param_bytes) {
    return shard_elements * (12 + param_bytes);
}

// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read
inline size_t host_memory_available() {
    size_t kib = 0;
    if (FILE* f = fopen("/proc/meminfo", "r")) {
        char line[256];
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1) break;
        fclose(f);
    }
    return kib * 1024;
}

[[noreturn]] inline void offload_does_not_fit(size_t needed, size_t available) {
    fatal(1, "--offload cpu: this rank's optimizer state needs %zu bytes of pinned host memory (%.2f GiB), "
             "%zu (%.2f GiB) are available; use more ranks, a higher ZeRO stage or --offload none",
          needed, needed / 1073741824.0, available, available / 1073741824.0);
}

template <class Backend>
class HostOptimizer {
public:
    using floatX = typename Backend::floatX;

    // device_table: this rank's shard table as zero/ lays it out in backend memory; group_entries:
    // each parameter group's entries [first, end) in it; shard: elements in the rank's shard
    HostOptimizer(const std::vector<ShardTensor>& device_table, std::vector<std::pair<int, int>> group_entries,
                  size_t shard)
        : device_table_(device_table), host_table_(device_table), groups_(std::move(group_entries)) {
        const bool fits = owned_.alloc_pinned(&master_, shard, &optimizer_bytes_) && owned_.alloc_pinned(&m_, shard, &optimizer_bytes_) &&
                          owned_.alloc_pinned(&v_, shard, &optimizer_bytes_) && owned_.alloc_pinned(&staging_, shard, &staging_bytes_);
        if (!fits) offload_does_not_fit(offload_host_bytes(shard, sizeof(floatX)), host_memory_available());
        for (ShardTensor& e : host_table_) e.param_offset = e.grad_offset = e.state_offset;  // all in shard layout
        sent_.assign(groups_.size(), 0);
        marks_.assign(groups_.size(), 0);
    }
    HostOptimizer(const HostOptimizer&) = delete;
    HostOptimizer& operator=(const HostOptimizer&) = delete;

    size_t optimizer_bytes() const { return optimizer_bytes_; }
    size_t staging_bytes() const { return staging_bytes_; }
    // the state in shard layout, host memory
    float* master() { return master_; }
    float* m() { return m_; }
    float* v() { return v_; }

    // a new step: no gradients sent yet, and the device's gradient buffers, about to be zeroed,
    // must first be read by any transfer still under way (one queued for a step whose update
    // was skipped)
    void begin_step() {
        std::fill(sent_.begin(), sent_.end(), 0);
        Backend::kernels_after_transfers();
    }
    bool grads_sent(int g) const { return sent_[g] != 0; }
    // group g's gradient shard (at `grads`, laid out as the device table says) to the host,
    // after the kernels queued so far
    void send_grads(int g, const floatX* grads) {
        Backend::transfers_after_kernels();
        for_each_entry(g, [&](const ShardTensor& d, const ShardTensor& h) {
            Backend::transfer_to_host(staging_ + h.grad_offset, grads + d.grad_offset, d.n * sizeof(floatX));
        });
        marks_[g] = Backend::transfer_mark();
        sent_[g] = 1;
    }
    // AdamW on group g once its gradients are here; its new parameters go to `params` (laid out
    // as the device table says), and kernels queued afterwards see them
    void update(int g, floatX* params, const AdamWStep& s) {
        Backend::transfer_wait(marks_[g]);
        const auto [first, end] = groups_[g];
        Backend::adamw_update_host(staging_, master_, staging_, m_, v_, host_table_.data() + first, end - first, s);
        for_each_entry(g, [&](const ShardTensor& d, const ShardTensor& h) {
            Backend::transfer_from_host(params + d.param_offset, staging_ + h.param_offset, d.n * sizeof(floatX));
        });
        Backend::kernels_after_transfers();
    }

private:
    // f(device entry, host entry) for each of group g's entries
    template <class F>
    void for_each_entry(int g, F f) const {
        for (int j = groups_[g].first; j < groups_[g].second; j++) f(device_table_[j], host_table_[j]);
    }

    std::vector<ShardTensor> device_table_, host_table_;
    std::vector<std::pair<int, int>> groups_;
    Allocations<Backend> owned_;
    size_t optimizer_bytes_ = 0, staging_bytes_ = 0;
    float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr;
    floatX* staging_ = nullptr;
    std::vector<char> sent_;        // per group: its gradients of this step are on their way
    std::vector<uint64_t> marks_;   // per group: the transfer mark that says they are here
};
