// ZeRO stages 0-3: who keeps which part of the parameters, gradients and Adam state, and when
// they move between ranks. Knows nothing of the model's kernels: it takes the parameter groups
// from the model and uses only the backend's memory primitives and its two optimizer ops
// (adamw_update, grad_norm_squared), each one launch over the rank's whole shard.
//
//   stage 0  full replicas; gradients all-reduced once per step
//   stage 1  Adam state (and fp32 master weights) sharded; gradients reduce-scattered once per
//            step, each rank updates its shard, parameters all-gathered
//            (at stages 0-1 each group's reduction starts as soon as its backward is done, on
//            the last micro-step of the step, which reduce_during_backward(true) announces)
//   stage 2  gradients sharded too: each group is reduce-scattered as soon as its backward is
//            done, from a reusable bucket, and accumulated into the shard
//   stage 3  parameters sharded too: each group is all-gathered into a slot just before use
//
// Slots and buckets: the first and last groups (embedding and final layernorm in GPT-2) have
// their own, because the tied embedding is used at both ends of the step and its gradient
// collects from the classifier (first in backward) to the encoder (last). Middle groups alternate
// between two, so one can be filled while the other is in use.
//
// Overlap: a group's reduction (every micro-step at stages 2-3, the last one at stages 0-1) starts
// as soon as its backward is done and runs while the next group is computed; its result is used
// (added into the shard, or copied back into the full gradient) when the slot is needed again
// (or at the step). At stage 3, prefetch(g) starts the gather of the group computed next.
// Each slot has its own communication buffers, so these never wait on one another.
//
// Pieces: a collective moves at most one layer's shard at a time; a larger group (the
// embedding) goes in several pieces, so the communication buffers are sized by a layer, not by
// the vocabulary.
//
// Offload (ZeroOptions::offload_optimizer, at any stage): the optimizer state and its update
// move to the host, zero/offload.h; the stage's parameters and gradients stay where they are.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "../common/io.h"  // fatal
#include "../kernels/allocations.h"
#include "comm.h"
#include "offload.h"
#include "partition.h"

// bytes held per rank, by category: in backend memory, and in host memory (offload)
struct ZeroMemory {
    size_t params = 0, grads = 0, optimizer = 0, comm = 0;
    size_t host_optimizer = 0, host_staging = 0;
};

struct ZeroOptions {
    // an fp32 copy of the parameters for the update (-w), where the backend's parameters are
    // narrower than fp32; ignored where they are fp32 already
    bool master_weights = true;
    // fp32 master weights, Adam m and v in host memory, updated there (--offload cpu)
    bool offload_optimizer = false;
};

template <class Backend>
class Zero {
public:
    using floatX = typename Backend::floatX;
    // a group's tensors, as params() and grads() hand them out: t[i] is the group's tensor i
    static constexpr int kMaxGroupTensors = 12;  // the most a group may have (GPT-2: a layer's 12)
    struct Tensors {
        floatX* t[kMaxGroupTensors];
        int count;
        floatX* operator[](int i) const {
            if (i < 0 || i >= count) fatal(1, "zero: tensor %d of a group of %d asked for", i, count);
            return t[i];
        }
    };

    Zero(int stage, const std::vector<std::vector<TensorSlice>>& groups, Communicator& comm, ZeroOptions options = {})
        : stage_(stage),
          comm_(comm),
          dtype_(sizeof(floatX) == 4 ? DType::F32 : DType::BF16),
          plan_(groups, stage == 0 ? 1 : comm.world()),
          rank_(stage == 0 ? 0 : comm.rank()),
          master_in_state_(Backend::has_master_weights && options.master_weights) {
        const size_t S = plan_.shard_size(), P = plan_.total();
        const int N = plan_.world();
        for (int g = 0; g < plan_.num_groups(); g++)
            if (plan_.group(g).tensors.size() > (size_t)kMaxGroupTensors)
                fatal(1, "zero: group %d has %zu tensors, more than the %d a group may have", g, plan_.group(g).tensors.size(), kMaxGroupTensors);
        if (stage_ <= 2) owned_.alloc(&params_full_, P, &memory_.params);
        else owned_.alloc(&param_shard_, S, &memory_.params);
        if (stage_ <= 1) owned_.alloc(&grads_full_, P, &memory_.grads);
        else owned_.alloc(&grad_shard_, S, &memory_.grads);
        if (!options.offload_optimizer) {
            if (master_in_state_) owned_.alloc(&master_, S, &memory_.optimizer);
            owned_.alloc(&adam_m_, S, &memory_.optimizer);
            owned_.alloc(&adam_v_, S, &memory_.optimizer);
        }
        const int last = plan_.num_groups() - 1;
        for (int g = 1; g < last; g++) piece_ = std::max(piece_, plan_.group(g).shard_size);
        if (piece_ == 0) piece_ = std::max(plan_.group(0).shard_size, plan_.group(last).shard_size);
        size_t slot_size[kSlots] = {}, slot_piece[kSlots] = {};
        for (int g = 0; g < plan_.num_groups(); g++) {
            int s = slot_of(g);
            slot_size[s] = std::max(slot_size[s], plan_.group(g).size);
            slot_piece[s] = std::max(slot_piece[s], std::min(piece_, plan_.group(g).shard_size));
        }
        const bool reduces = stage_ >= 1 || comm.world() > 1;
        for (int s = 0; s < kSlots && reduces; s++) {
            owned_.alloc(&rank_major_[s], (size_t)N * slot_piece[s], &memory_.comm);
            if (stage_ >= 1) owned_.alloc(&own_[s], slot_piece[s], &memory_.comm);
            if (stage_ >= 2) owned_.alloc(&bucket_[s], slot_size[s], &memory_.comm);
            if (stage_ == 3) {
                owned_.alloc(&slot_[s], slot_size[s], &memory_.comm);
                owned_.alloc(&gathered_[s], (size_t)N * slot_piece[s], &memory_.comm);
            }
        }
        owned_.alloc(&norm_acc_, 1, &memory_.comm);
        reduced_.assign(plan_.num_groups(), 0);
        shard_host_ = plan_.shard_table(rank_, stage_ <= 2, stage_ <= 1);
        ShardTensor* device_table;
        owned_.alloc(&device_table, shard_host_.size(), &memory_.comm);
        Backend::from_host(device_table, shard_host_.data(), shard_host_.size() * sizeof(ShardTensor));
        shard_.host = shard_host_.data();
        shard_.device = device_table;
        shard_.count = (int)shard_host_.size();
        for (const ShardTensor& t : shard_host_) shard_.elements += t.n;
        if (options.offload_optimizer) {
            host_ = std::make_unique<HostOptimizer<Backend>>(shard_host_, table_entries_per_group(), S);
            memory_.host_optimizer = host_->optimizer_bytes();
            memory_.host_staging = host_->staging_bytes();
        }
    }
    Zero(const Zero&) = delete;
    Zero& operator=(const Zero&) = delete;

    const PartitionPlan& plan() const { return plan_; }
    const ZeroMemory& memory() const { return memory_; }
    // fp32 master weights are part of the optimizer state (save_state, load_state)
    bool has_master_weights() const { return master_in_state_; }
    bool offloads_optimizer() const { return host_ != nullptr; }

    // full fp32 parameters (same on every rank) -> this rank's copies
    void load(const float* host) {
        for (int g = 0; g < plan_.num_groups(); g++) {
            for (const auto& t : plan_.group(g).tensors) {
                size_t start = (size_t)rank_ * t.chunk, len = PartitionPlan::valid(t, rank_);
                if (stage_ <= 2) Backend::upload_fp32(params_full_ + t.slice.offset, host + t.slice.offset, t.slice.n);
                else Backend::upload_fp32(param_shard_ + t.shard_offset, host + t.slice.offset + start, len);
                // offloaded, the host keeps an fp32 master whatever the backend's precision
                if (host_) std::copy_n(host + t.slice.offset + start, len, host_->master() + t.shard_offset);
                else if (master_ != nullptr)
                    Backend::from_host(master_ + t.shard_offset, host + t.slice.offset + start, len * 4);
            }
        }
        invalidate_slots();
    }
    // this rank's view -> full fp32 parameters on the host; a collective at stage 3
    void save(float* host) {
        for (int g = 0; g < plan_.num_groups(); g++) {
            Tensors p = params(g);
            const auto& tensors = plan_.group(g).tensors;
            for (size_t i = 0; i < tensors.size(); i++)
                Backend::download_fp32(host + tensors[i].slice.offset, p[i], tensors[i].slice.n);
        }
    }

    // Optimizer state in the flat, unsharded layout (so any stage and world size can take it
    // back): Adam's m and v, and the fp32 master weights where they are part of the state (else
    // `master` is left alone). The same with or without offload. A collective; only `root`
    // receives.
    void save_state(float* m, float* v, float* master, int root) {
        const int N = plan_.world();
        const size_t S = plan_.shard_size();
        std::vector<float> shard(host_ ? 0 : S), rows(comm_.rank() == root && N > 1 ? (size_t)N * S : 0);
        auto gather = [&](const float* device_shard, const float* host_shard, float* out) {
            const float* mine = host_shard;
            if (host_ == nullptr) {
                if (device_shard == nullptr) return;
                Backend::to_host(shard.data(), device_shard, S * sizeof(float));
                mine = shard.data();
            }
            const float* all = mine;  // one shard (stage 0): every rank holds all of it
            if (N > 1) {
                comm_.gather_host(mine, rows.data(), S * sizeof(float), root);
                all = rows.data();
            }
            if (comm_.rank() != root) return;
            for (int g = 0; g < plan_.num_groups(); g++)
                for (const auto& t : plan_.group(g).tensors)
                    for (int r = 0; r < N; r++)
                        std::copy_n(all + (size_t)r * S + t.shard_offset, PartitionPlan::valid(t, r),
                                    out + t.slice.offset + (size_t)r * t.chunk);
        };
        gather(adam_m_, host_ ? host_->m() : nullptr, m);
        gather(adam_v_, host_ ? host_->v() : nullptr, v);
        if (master_in_state_) gather(master_, host_ ? host_->master() : nullptr, master);
    }
    // the inverse: every rank takes its chunks of the flat state (without master weights in the
    // state, an offloaded run keeps the master load() made from the parameters)
    void load_state(const float* m, const float* v, const float* master) {
        for_each_owned([&](const PartitionPlan::Tensor& t, size_t len) {
            const size_t at = t.slice.offset + (size_t)rank_ * t.chunk, bytes = len * sizeof(float);
            if (host_) {
                std::copy_n(m + at, len, host_->m() + t.shard_offset);
                std::copy_n(v + at, len, host_->v() + t.shard_offset);
                if (master_in_state_) std::copy_n(master + at, len, host_->master() + t.shard_offset);
                return;
            }
            Backend::from_host(adam_m_ + t.shard_offset, m + at, bytes);
            Backend::from_host(adam_v_ + t.shard_offset, v + at, bytes);
            if (master_ != nullptr) Backend::from_host(master_ + t.shard_offset, master + at, bytes);
        });
    }

    // this rank's shard of the parameters in shard layout (padding as zeros), as fp32
    std::vector<float> shard_to_host() {
        std::vector<float> out(plan_.shard_size(), 0.0f);
        for_each_owned([&](const PartitionPlan::Tensor& t, size_t len) {
            Backend::download_fp32(out.data() + t.shard_offset, param_of(t), len);
        });
        return out;
    }

    // Parameters of group g, ready for the kernels. At stage 3 this all-gathers them unless the
    // group's slot already holds them (or waits for the gather prefetch() started).
    Tensors params(int g) {
        comm_.note(Communicator::Event::ParamsWanted, g);
        const auto& group = plan_.group(g);
        if (stage_ <= 2) return tensors_at(params_full_, group, full_offset);
        int s = slot_of(g);
        if (slot_group_[s] != g) {
            // the last (or only) piece may have been started by prefetch()
            for_each_piece(group, [&](size_t lo, size_t hi) {
                if (gather_[s].group != g || gather_[s].lo != lo) {
                    prefetch_misses_ += g != 0;  // the embedding comes first: nothing runs before it
                    start_gather(g, lo, hi);
                }
                comm_.wait(gather_[s].ticket);
                gather_[s].group = -1;
                unpack(slot_[s], gathered_[s], group, group_offset, lo, hi);
            });
            slot_group_[s] = g;
        }
        return tensors_at(slot_[s], group, group_offset);
    }
    // Stage 3: gathers params() had to start itself, for a group after the first of a micro-step
    // (each costs the overlap prefetch() is there for); 0 when the model prefetches correctly
    int prefetch_misses() const { return prefetch_misses_; }
    // Stage 3: start gathering group g (if it exists, is not already there and goes in one
    // piece) while the caller computes with another slot's group.
    void prefetch(int g) {
        if (stage_ != 3 || g < 0 || g >= plan_.num_groups() || plan_.group(g).shard_size > piece_) return;
        int s = slot_of(g);
        if (slot_group_[s] != g && gather_[s].group != g) start_gather(g, 0, plan_.group(g).shard_size);
    }

    // Where group g's backward adds its gradients. At stages 2-3 the first call in a micro-step
    // hands out a zeroed bucket, which grads_done() reduce-scatters into the shard.
    Tensors grads(int g) {
        const auto& group = plan_.group(g);
        if (stage_ <= 1) {
            if (reduce_in_backward_ && reduced_[g])
                fatal(1, "zero: group %d's gradients wanted after their reduction began (a second backward after reduce_during_backward(true)?)", g);
            return tensors_at(grads_full_, group, full_offset);
        }
        int s = slot_of(g);
        if (bucket_group_[s] != g) {
            Backend::zero(bucket_[s], group.size * sizeof(floatX));
            bucket_group_[s] = g;
        }
        return tensors_at(bucket_[s], group, group_offset);
    }
    // group g's backward is done: its reduction may start (see the stage table above)
    void grads_done(int g) {
        comm_.note(Communicator::Event::GradsDone, g);
        if (stage_ >= 2 || reduce_in_backward_) reduce_group(g);
        if (stage_ >= 2) bucket_group_[slot_of(g)] = -1;
    }

    // before the first micro-step of a step
    void zero_grads() {
        if (host_) host_->begin_step();
        if (stage_ <= 1) Backend::zero(grads_full_, plan_.total() * sizeof(floatX));
        else Backend::zero(grad_shard_, plan_.shard_size() * sizeof(floatX));
        std::fill(reduced_.begin(), reduced_.end(), 0);
        reduce_in_backward_ = false;
    }
    // before each backward: true for the last of the step, whose gradients are then complete
    // group by group, so stages 0-1 reduce each as soon as its backward is done
    void reduce_during_backward(bool last_micro_step) { reduce_in_backward_ = last_micro_step; }
    // before each micro-step's forward: stage 3 gathers every group afresh
    void begin_micro_step() { invalidate_slots(); }

    // The optimizer's step in two halves, so that the caller may look at the norm and skip the
    // update: first the reductions and the global gradient norm, ...
    float grad_norm() {
        if (stage_ <= 1)  // what no backward reduced
            for (int g = 0; g < plan_.num_groups(); g++)
                if (!reduced_[g]) reduce_group(g);
        reduce_in_backward_ = false;  // the gradients may be read again
        for (int s = 0; s < kSlots; s++) {
            finish_reduce(s);
            if (gather_[s].group >= 0) comm_.wait(gather_[s].ticket);  // of parameters about to change
            gather_[s].group = -1;
        }
        for (int g = 0; g < plan_.num_groups() && host_; g++)  // what no backward sent
            if (!host_->grads_sent(g)) gradients_complete(g);

        Backend::grad_norm_squared(norm_acc_, grads_base(), shard_);
        float local = 0.0f;
        Backend::to_host(&local, norm_acc_, sizeof(float));
        // stage 0: every rank holds the whole reduced gradient, nothing to add up
        double sumsq = stage_ == 0 ? local : comm_.all_reduce_host(local);
        return (float)std::sqrt(sumsq);
    }
    // ... then the update with that norm (a collective too: every rank must call it or none).
    // Offloaded, group by group on the host, each group's gather (stages 1-2) started as soon
    // as its new parameters are on their way.
    void update(const AdamWStep& s) {
        floatX* params = stage_ <= 2 ? params_full_ : param_shard_;
        auto update_on_host = [&](int g) {
            if (host_) host_->update(g, params, s);
        };
        if (!host_) Backend::adamw_update(params, master_, grads_base(), adam_m_, adam_v_, shard_, s);
        if (stage_ == 1 || stage_ == 2) all_gather_full_params(update_on_host);
        else
            for (int g = 0; g < plan_.num_groups(); g++) update_on_host(g);
        invalidate_slots();
    }

private:
    static constexpr int kSlots = 4;
    // a collective under way over the piece [lo, hi) of a group's shard (group -1: none);
    // last_of_step: a reduction that completes the group's gradient for this step
    struct InFlight {
        int group = -1;
        size_t lo = 0, hi = 0;
        Communicator::Ticket ticket = 0;
        bool last_of_step = false;
    };
    // where a tensor sits: in the flat, full-size layout, or in a group's own buffer
    static size_t full_offset(const PartitionPlan::Tensor& t) { return t.slice.offset; }
    static size_t group_offset(const PartitionPlan::Tensor& t) { return t.group_offset; }
    template <class OffsetOf>
    static Tensors tensors_at(floatX* base, const PartitionPlan::Group& g, OffsetOf offset_of) {
        Tensors out{};
        out.count = (int)g.tensors.size();
        for (int i = 0; i < out.count; i++) out.t[i] = base + offset_of(g.tensors[i]);
        return out;
    }
    // f(lo, hi) for each piece of the group's shard, in order
    template <class F>
    void for_each_piece(const PartitionPlan::Group& g, F f) const {
        for (size_t lo = 0; lo < g.shard_size; lo += piece_) f(lo, std::min(g.shard_size, lo + piece_));
    }
    // gathers the piece [lo, hi) of group g's shard into the slot's buffer
    void start_gather(int g, size_t lo, size_t hi) {
        const auto& group = plan_.group(g);
        int s = slot_of(g);
        if (gather_[s].group >= 0) comm_.wait(gather_[s].ticket);  // an unused prefetch
        comm_.note(Communicator::Event::Serves, g);
        gather_[s] = {g, lo, hi, comm_.all_gather_async(param_shard_ + group.shard_offset + lo, gathered_[s], hi - lo, dtype_)};
    }
    // Starts summing group g's gradients over ranks, piece by piece through its slot's
    // buffers: stage 0 all-reduces the full gradient, stage 1 reduce-scatters it, stages 2-3 the
    // micro-step's bucket. The last piece finishes while the caller computes on.
    void reduce_group(int g) {
        reduced_[g] = 1;
        const bool last_of_step = stage_ <= 1 || reduce_in_backward_;  // stages 0-1 reduce once per step
        if (stage_ == 0 && comm_.world() == 1) {  // nothing to sum
            if (last_of_step) gradients_complete(g);
            return;
        }
        const auto& group = plan_.group(g);
        const int s = slot_of(g);
        for_each_piece(group, [&](size_t lo, size_t hi) {
            finish_reduce(s);
            if (stage_ <= 1) pack(rank_major_[s], grads_full_, group, full_offset, lo, hi);
            else pack(rank_major_[s], bucket_[s], group, group_offset, lo, hi);
            comm_.note(Communicator::Event::Serves, g);
            reduce_[s] = {g, lo, hi,
                          stage_ == 0 ? comm_.all_reduce_async(rank_major_[s], hi - lo, dtype_)
                                      : comm_.reduce_scatter_async(rank_major_[s], own_[s], hi - lo, dtype_),
                          last_of_step};
        });
    }
    // group g's gradient shard is complete for the step: offloaded, it leaves for the host now
    void gradients_complete(int g) {
        if (host_ == nullptr) return;
        comm_.note(Communicator::Event::GradsToHost, g);
        host_->send_grads(g, grads_base());
    }
    // the slot's outstanding reduction, if any, waited for and its result put where the
    // optimizer reads it: back into the full gradient (stage 0), into this rank's chunks of it
    // (stage 1), added into the gradient shard (stages 2-3)
    void finish_reduce(int s) {
        InFlight& r = reduce_[s];
        if (r.group < 0) return;
        comm_.wait(r.ticket);
        const auto& group = plan_.group(r.group);
        auto grad = [&](const PartitionPlan::Tensor& t) { return grad_of(t); };
        if (stage_ == 0) unpack(grads_full_, rank_major_[s], group, full_offset, r.lo, r.hi);
        else if (stage_ == 1) copy_own_piece(own_[s], group, r.lo, r.hi, grad, false);
        else Backend::accumulate(grad_shard_ + group.shard_offset + r.lo, own_[s], r.hi - r.lo);
        if (r.last_of_step && r.hi == group.shard_size) gradients_complete(r.group);  // its last piece
        r.group = -1;
    }
    int slot_of(int g) const {
        int last = plan_.num_groups() - 1;
        return g == 0 ? 0 : g == last ? 1 : 2 + (g % 2);
    }
    void invalidate_slots() {
        for (int s = 0; s < kSlots; s++) slot_group_[s] = -1;
    }
    floatX* grads_base() const { return stage_ <= 1 ? grads_full_ : grad_shard_; }
    // this rank's chunk of tensor t, where the optimizer reads it
    floatX* grad_of(const PartitionPlan::Tensor& t) const {
        if (stage_ <= 1) return grads_full_ + t.slice.offset + (size_t)rank_ * t.chunk;
        return grad_shard_ + t.shard_offset;
    }
    floatX* param_of(const PartitionPlan::Tensor& t) const {
        if (stage_ <= 2) return params_full_ + t.slice.offset + (size_t)rank_ * t.chunk;
        return param_shard_ + t.shard_offset;
    }
    // each group's entries [first, end) in the optimizer's table (one per tensor with a piece here)
    std::vector<std::pair<int, int>> table_entries_per_group() const {
        std::vector<std::pair<int, int>> ranges;
        int next = 0;
        for (int g = 0; g < plan_.num_groups(); g++) {
            const int first = next;
            for (const auto& t : plan_.group(g).tensors) next += PartitionPlan::valid(t, rank_) > 0;
            ranges.push_back({first, next});
        }
        return ranges;
    }
    template <class F>
    void for_each_owned(F f) {
        for (int g = 0; g < plan_.num_groups(); g++)
            for (const auto& t : plan_.group(g).tensors) {
                size_t len = PartitionPlan::valid(t, rank_);
                if (len > 0) f(t, len);
            }
    }

    // Calls f(t, c0, at, len) for each tensor t of group g overlapping the piece [lo, hi) of the
    // group's shard: the overlap starts at c0 within t's chunk and at `at` within the piece.
    template <class F>
    static void for_each_in_piece(const PartitionPlan::Group& g, size_t lo, size_t hi, F f) {
        for (const auto& t : g.tensors) {
            const size_t t_lo = t.shard_offset - g.shard_offset;
            const size_t a = std::max(lo, t_lo), b = std::min(hi, t_lo + t.chunk);
            if (a < b) f(t, a - t_lo, a - lo, b - a);
        }
    }
    // Elements [c0, c0 + len) of every rank's chunk of t: calls f(first_rank, rows, valid) for
    // the run of ranks where all len are real parameters, then each remaining rank alone.
    template <class F>
    void for_rows(const PartitionPlan::Tensor& t, size_t c0, size_t len, F f) {
        const int N = plan_.world();
        const size_t n = t.slice.n;
        int full = n >= c0 + len ? (int)std::min<size_t>(N, (n - c0 - len) / t.chunk + 1) : 0;
        if (full > 0) f(0, full, len);
        for (int r = full; r < N; r++) {
            size_t start = std::min(n, r * t.chunk + c0);
            f(r, 1, std::min(len, n - start));
        }
    }
    // Tensors of group g (tensor t at base + offset_of(t)) -> rank-major buffer holding, row by
    // row, every rank's piece [lo, hi) of the group shard, padding zeroed.
    template <class OffsetOf>
    void pack(floatX* rank_major, const floatX* base, const PartitionPlan::Group& g, OffsetOf offset_of, size_t lo, size_t hi) {
        const size_t X = sizeof(floatX), w = hi - lo;
        for_each_in_piece(g, lo, hi, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            floatX* dst = rank_major + at;
            const floatX* src = base + offset_of(t) + c0;
            for_rows(t, c0, len, [&](int r0, int rows, size_t valid) {
                if (valid > 0) Backend::copy2d(dst + r0 * w, w * X, src + r0 * t.chunk, t.chunk * X, valid * X, rows);
                if (valid < len) Backend::zero(dst + r0 * w + valid, (len - valid) * X);
            });
        });
    }
    // rank-major buffer of pieces [lo, hi) -> tensors of group g at base + offset_of(t)
    template <class OffsetOf>
    void unpack(floatX* base, const floatX* rank_major, const PartitionPlan::Group& g, OffsetOf offset_of, size_t lo, size_t hi) {
        const size_t X = sizeof(floatX), w = hi - lo;
        for_each_in_piece(g, lo, hi, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            const floatX* src = rank_major + at;
            floatX* dst = base + offset_of(t) + c0;
            for_rows(t, c0, len, [&](int r0, int rows, size_t valid) {
                if (valid > 0) Backend::copy2d(dst + r0 * t.chunk, t.chunk * X, src + r0 * w, w * X, valid * X, rows);
            });
        });
    }
    // this rank's piece [lo, hi) <-> its chunks of the tensors (only the real parameters move)
    template <class Of>
    void copy_own_piece(floatX* piece, const PartitionPlan::Group& g, size_t lo, size_t hi, Of of, bool to_piece) {
        const size_t X = sizeof(floatX);
        for_each_in_piece(g, lo, hi, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            size_t valid = PartitionPlan::valid(t, rank_);
            if (valid <= c0) return;
            len = std::min(len, valid - c0);
            if (to_piece) Backend::copy(piece + at, of(t) + c0, len * X);
            else Backend::copy(of(t) + c0, piece + at, len * X);
        });
    }

    // One collective per piece, in group order: before(g) prepares group g, start(group, slot, lo,
    // hi) begins a piece's collective and returns its ticket, finish(group, slot, lo, hi) uses its
    // result. A slot's next collective starts once its previous one is finished, so packing one
    // overlaps the transfer of the one before.
    template <class Before, class Start, class Finish>
    void for_each_piece_pipelined(Before before, Start start, Finish finish) {
        InFlight pending[kSlots];
        auto drain = [&](int s) {
            InFlight& p = pending[s];
            if (p.group < 0) return;
            comm_.wait(p.ticket);
            finish(plan_.group(p.group), s, p.lo, p.hi);
            p.group = -1;
        };
        for (int g = 0; g < plan_.num_groups(); g++) {
            const auto& group = plan_.group(g);
            const int s = slot_of(g);
            before(g);
            for_each_piece(group, [&](size_t lo, size_t hi) {
                drain(s);
                pending[s] = {g, lo, hi, start(group, s, lo, hi)};
            });
        }
        for (int s = 0; s < kSlots; s++) drain(s);
    }
    // stages 1-2: every rank's updated chunks -> the full parameters; before(g) is called before
    // group g's first piece (its chunks are read after the work it queues)
    template <class Before>
    void all_gather_full_params(Before before) {
        auto param = [&](const PartitionPlan::Tensor& t) { return param_of(t); };
        for_each_piece_pipelined(
            before,
            [&](const PartitionPlan::Group& g, int s, size_t lo, size_t hi) {
                copy_own_piece(own_[s], g, lo, hi, param, true);
                return comm_.all_gather_async(own_[s], rank_major_[s], hi - lo, dtype_);
            },
            [&](const PartitionPlan::Group& g, int s, size_t lo, size_t hi) { unpack(params_full_, rank_major_[s], g, full_offset, lo, hi); });
    }

    int stage_;
    Communicator& comm_;
    DType dtype_;
    PartitionPlan plan_;
    int rank_;  // which chunk this rank owns (0 at stage 0: it owns everything)
    bool master_in_state_;
    ZeroMemory memory_;
    Allocations<Backend> owned_;
    floatX *params_full_ = nullptr, *grads_full_ = nullptr;
    floatX *param_shard_ = nullptr, *grad_shard_ = nullptr;
    float *master_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr, *norm_acc_ = nullptr;  // in backend memory
    std::unique_ptr<HostOptimizer<Backend>> host_;  // offloaded: the optimizer state instead
    std::vector<ShardTensor> shard_host_;  // the optimizer's table of this rank's shard
    ShardTable shard_;
    // per slot: a rank-major buffer (world x group shard) and this rank's block, for the
    // collectives; at stages 2-3 the gradient bucket, at stage 3 the gathered parameters
    floatX* rank_major_[kSlots] = {};
    floatX* own_[kSlots] = {};
    floatX* bucket_[kSlots] = {};
    floatX* slot_[kSlots] = {};
    floatX* gathered_[kSlots] = {};
    // which group each slot's parts hold or are receiving (-1: none)
    int slot_group_[kSlots] = {-1, -1, -1, -1};
    int bucket_group_[kSlots] = {-1, -1, -1, -1};
    std::vector<char> reduced_;  // per group: its reduction of this step has started (stages 0-1)
    bool reduce_in_backward_ = false;
    InFlight gather_[kSlots], reduce_[kSlots];  // each slot's collective under way, if any
    int prefetch_misses_ = 0;
    size_t piece_ = 0;  // elements per rank a collective moves at most: the largest layer shard
};
