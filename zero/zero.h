// ZeRO stages 0-3: who keeps which part of the parameters, gradients and Adam state, and when
// they move between ranks. Knows nothing of the model's kernels: it takes the parameter groups
// from the model and uses only the backend's memory primitives and its two optimizer ops
// (adamw_update, grad_norm_squared), each one launch over the rank's whole shard.
//
//   stage 0  full replicas; gradients all-reduced once per step
//   stage 1  Adam state (and fp32 master weights) sharded; gradients reduce-scattered once per
//            step, each rank updates its shard, parameters all-gathered
//            (at stages 0-1 each group's reduction starts as soon as its backward is done, in
//            the last micro-step of the step)
//   stage 2  gradients sharded too: each group is reduce-scattered as soon as its backward is
//            done, from a reusable bucket, and accumulated into the shard
//   stage 3  parameters sharded too: each group is all-gathered into a slot just before use
//
// ZeroPolicy below is this table as data; the methods read it, never the stage number.
//
// The protocol, driven by the training loop: zero_grads() once per step; begin_micro_step(last)
// before each micro-step's forward; the model asks params(g) and grads(g) and says grads_done(g)
// group by group; then grad_norm() and update(). A forward alone (an evaluation) needs none of
// it: params(g) hands out what the slots hold or gathers it.
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
// Hybrid sharding (ZeroOptions::shard_group, --shard-group N; PyTorch FSDP's HSDP): stages 1-3
// shard over groups of N consecutive ranks, each group a replica of the others. A group's
// gradients are reduce-scattered inside it; in the step's last reduction each rank's piece is
// then all-reduced with the ranks that hold the same piece in the other groups (its replicas),
// so the traffic across groups is one all-reduce of the shard per step. Parameters are gathered
// inside the group only. Every replica holds the same gradient shard and takes the same update.
//
// Quantized weights (ZeroOptions::quantize_weights, --quantize-weights int8; ZeRO++'s qwZ):
// stage 3's gathers send each rank's piece as int8 blocks with one scale each
// (kernels/quantize_blocks.h), and every rank computes with the dequantized gather, its own part
// included, so all ranks use the same weights. The shard the optimizer updates (and its fp32
// master) is never quantized, nor is what save() gathers for a checkpoint. A piece of fewer than
// kQuantMinValues values travels as it is.
//
// Quantized gradients (ZeroOptions::quantize_grads, --quantize-grads int8; ZeRO++'s qgZ, stages
// 1-3): a reduction's reduce-scatter becomes an all-to-all of int8 blocks (each rank's row of the
// rank-major buffer quantized), which the receiver dequantizes and sums in fp32. With replicas
// the piece so summed inside the group is then all-reduced across groups quantized too: cut into
// a part per replica, quantized and all-to-all'ed (each replica sums its part in fp32), the sums
// quantized again and all-gathered, every replica taking the dequantized parts, its own
// included, so that the replicas stay equal. A part of fewer than kQuantMinValues values (a
// piece under R times that) goes as an all-reduce of the piece, unquantized.
//
// Offload (ZeroOptions::offload_optimizer, at any stage): the optimizer state and its update
// move to the host, zero/offload.h; the stage's parameters and gradients stay where they are.
// A group's gradient leaves for the host as soon as it is final for the step (its last
// reduction finished), and update() takes the groups in turn: update group g on the host, send
// it back, start its gather.
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
#include "../kernels/quantize_blocks.h"
#include "comm.h"
#include "offload.h"
#include "partition.h"

// bytes held per rank, by category: in backend memory (optimizer: Adam m and v; master: the
// fp32 master weights), and in host memory (offload: master, m and v; the staging buffer)
struct ZeroMemory {
    size_t params = 0, grads = 0, optimizer = 0, master = 0, comm = 0;
    size_t host_optimizer = 0, host_staging = 0;
};

// What a stage keeps whole and what it cuts into chunks, one per rank (zero/partition.h), and
// what follows from that for when and how gradients and parameters move.
struct ZeroPolicy {
    bool shards_optimizer;  // 1-3: Adam state (and master weights) as chunks; each rank updates its own
    bool shards_grads;      // 2-3: gradients as chunks too; a micro-step's go through a bucket
    bool shards_params;     // 3: parameters as chunks too; a group is gathered into a slot for use
    explicit ZeroPolicy(int stage) : shards_optimizer(stage >= 1), shards_grads(stage >= 2), shards_params(stage >= 3) {}

    // gradients are summed over ranks once per step, in its last backward (else in every one)
    bool reduces_once_per_step() const { return !shards_grads; }
    // summed by all-reduce, every rank keeping the whole (else reduce-scattered: each its chunks)
    bool all_reduces() const { return !shards_optimizer; }
    // after the update every rank's new chunks are all-gathered into the full parameters
    bool gathers_after_update() const { return shards_optimizer && !shards_params; }
};

// bytes moved per rank (zero/comm.h's accounting), inside its shard group and across groups
struct ZeroTraffic {
    CommCounters inside, across;
};

// The world's ranks in shard groups of N consecutive ranks (hybrid sharding; N <= 0 or the whole
// world: one group). group() is this rank's group, replicas() the ranks that hold the same part of
// the shard as this one, one in each group (null with one group): rank r and r +- N, r +- 2N...
class ShardGroups {
public:
    ShardGroups(Communicator& world, int N) : world_(world) {
        const int W = world.world(), r = world.rank();
        if (N <= 0 || N == W) return;
        if (W % N != 0) fatal(2, "--shard-group %d: expected a divisor of the %d ranks", N, W);
        group_ = world.split(r / N * N, N, 1);
        group_->set_label("the shard group");
        replicas_ = world.split(r % N, W / N, N);
        replicas_->set_label("the replicas across shard groups");
    }
    Communicator& world() const { return world_; }
    Communicator& group() const { return group_ ? *group_ : world_; }
    Communicator* replicas() const { return replicas_.get(); }
    // whether world rank `rank` is in this rank's group
    bool holds(int rank) const { return rank / group().world() == world_.rank() / group().world(); }

private:
    Communicator& world_;
    std::unique_ptr<Communicator> group_, replicas_;
};

struct ZeroOptions {
    // an fp32 copy of the parameters for the update (-w), where the backend's parameters are
    // narrower than fp32; ignored where they are fp32 already
    bool master_weights = true;
    // fp32 master weights, Adam m and v in host memory, updated there (--offload cpu)
    bool offload_optimizer = false;
    // ranks per shard group (--shard-group): stages 1-3 shard over groups of this many
    // consecutive ranks, each group a replica; 0: one group of all ranks
    int shard_group = 0;
    // stage 3's gathers send int8 blocks (--quantize-weights int8)
    bool quantize_weights = false;
    // reductions at stages 1-3 send int8 blocks (--quantize-grads int8)
    bool quantize_grads = false;
};

// The smallest piece a quantized collective quantizes: with blocks of at most 256 values and at
// most 12 tensors in a piece (Zero::kMaxGroupTensors), a piece of 512 or more values takes at
// most 0.28 of its fp32 bytes, scales and padding included (0.56 of bf16); a smaller one (a final
// layernorm's piece on many ranks) travels as it is, its scales costing more than they save.
constexpr size_t kQuantMinValues = 2 * kQuantBlock;

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

    // comm: every rank of the run; the stage shards over options.shard_group of them
    Zero(int stage, const std::vector<std::vector<TensorSlice>>& groups, Communicator& comm, ZeroOptions options = {})
        : policy_(stage),
          shard_groups_(comm, policy_.shards_optimizer ? options.shard_group : 0),
          comm_(shard_groups_.group()),
          replicas_(shard_groups_.replicas()),
          dtype_(sizeof(floatX) == 4 ? DType::F32 : DType::BF16),
          plan_(groups, policy_.shards_optimizer ? comm_.world() : 1),
          rank_(policy_.shards_optimizer ? comm_.rank() : 0),
          master_in_state_(Backend::has_master_weights && options.master_weights),
          quantize_weights_(options.quantize_weights && policy_.shards_params && comm_.world() > 1),
          quantize_grads_(options.quantize_grads && policy_.shards_optimizer && (comm_.world() > 1 || replicas_ != nullptr)) {
        const size_t S = plan_.shard_size(), P = plan_.total();
        const int N = plan_.world();
        for (int g = 0; g < plan_.num_groups(); g++)
            if (plan_.group(g).tensors.size() > (size_t)kMaxGroupTensors)
                fatal(1, "zero: group %d has %zu tensors, more than the %d a group may have", g, plan_.group(g).tensors.size(), kMaxGroupTensors);
        if (policy_.shards_params) owned_.alloc(&params_shard_, S, &memory_.params);
        else owned_.alloc(&params_full_, P, &memory_.params);
        if (policy_.shards_grads) owned_.alloc(&grads_shard_, S, &memory_.grads);
        else owned_.alloc(&grads_full_, P, &memory_.grads);
        if (!options.offload_optimizer) {
            if (master_in_state_) owned_.alloc(&master_, S, &memory_.master);
            owned_.alloc(&adam_m_, S, &memory_.optimizer);
            owned_.alloc(&adam_v_, S, &memory_.optimizer);
        }
        const int last = plan_.num_groups() - 1;
        for (int g = 1; g < last; g++) max_piece_ = std::max(max_piece_, plan_.group(g).shard_size);
        if (max_piece_ == 0) max_piece_ = std::max(plan_.group(0).shard_size, plan_.group(last).shard_size);
        size_t slot_size[kSlots] = {}, slot_piece[kSlots] = {};
        for (int g = 0; g < plan_.num_groups(); g++) {
            int s = slot_of(g);
            slot_size[s] = std::max(slot_size[s], plan_.group(g).size);
            slot_piece[s] = std::max(slot_piece[s], std::min(max_piece_, plan_.group(g).shard_size));
        }
        if (quantize_weights_ || quantize_grads_) plan_quantization();
        // per slot, the largest quantized row of its groups' pieces, and of their parts across groups
        size_t slot_row[kSlots] = {}, slot_part[kSlots] = {};
        for (int g = 0; g < (int)quant_.size(); g++)
            for (const PieceQuant& q : quant_[g]) {
                const int s = slot_of(g);
                if (q.whole.blocks > 0) slot_row[s] = std::max(slot_row[s], q.whole.row_bytes());
                if (!q.parts.empty()) slot_part[s] = std::max(slot_part[s], q.parts[0].row_stride());
            }
        const int R = replica_count();
        const bool communicates = policy_.shards_optimizer || comm.world() > 1;  // else nothing is ever summed
        for (int s = 0; s < kSlots && communicates; s++) {
            if (quantize_weights_ && slot_row[s] > 0) {
                owned_.alloc(&q_gather_mine_[s], slot_row[s], &memory_.comm);
                owned_.alloc(&q_gather_all_[s], (size_t)N * slot_row[s], &memory_.comm);
            }
            if (quantize_grads_ && N > 1 && slot_row[s] > 0) {
                owned_.alloc(&q_reduce_send_[s], (size_t)N * slot_row[s], &memory_.comm);
                owned_.alloc(&q_reduce_recv_[s], (size_t)N * slot_row[s], &memory_.comm);
            }
            if (slot_part[s] > 0) {
                owned_.alloc(&q_across_send_[s], (size_t)R * slot_part[s], &memory_.comm);
                owned_.alloc(&q_across_recv_[s], (size_t)R * slot_part[s], &memory_.comm);
            }
            owned_.alloc(&rank_major_[s], (size_t)N * slot_piece[s], &memory_.comm);
            if (!policy_.all_reduces()) owned_.alloc(&my_piece_[s], slot_piece[s], &memory_.comm);
            // stage 1 with replicas: a piece all-reduced across groups while the next one is reduce-scattered
            if (replicas_ && !policy_.shards_grads) owned_.alloc(&across_piece_[s], slot_piece[s], &memory_.comm);
            if (policy_.shards_grads) owned_.alloc(&bucket_[s], slot_size[s], &memory_.comm);
            if (policy_.shards_params) {
                owned_.alloc(&slot_[s], slot_size[s], &memory_.comm);
                owned_.alloc(&gathered_[s], (size_t)N * slot_piece[s], &memory_.comm);
            }
        }
        owned_.alloc(&norm_acc_, 1, &memory_.comm);
        reduced_.assign(plan_.num_groups(), 0);
        zeroed_.assign(plan_.num_groups(), 1);
        optimizer_entries_ = plan_.shard_table(rank_, !policy_.shards_params, !policy_.shards_grads);
        ShardTensor* device_table;
        owned_.alloc(&device_table, optimizer_entries_.size(), &memory_.comm);
        Backend::from_host(device_table, optimizer_entries_.data(), optimizer_entries_.size() * sizeof(ShardTensor));
        optimizer_table_.host = optimizer_entries_.data();
        optimizer_table_.device = device_table;
        optimizer_table_.count = (int)optimizer_entries_.size();
        for (const ShardTensor& t : optimizer_entries_) optimizer_table_.elements += t.n;
        if (options.offload_optimizer) {
            host_ = std::make_unique<HostOptimizer<Backend>>(optimizer_entries_, table_entries_per_group(), S);
            memory_.host_optimizer = host_->optimizer_bytes();
            memory_.host_staging = host_->staging_bytes();
        }
    }
    Zero(const Zero&) = delete;
    Zero& operator=(const Zero&) = delete;

    const PartitionPlan& plan() const { return plan_; }
    const ZeroMemory& memory() const { return memory_; }
    // ranks per shard group, and groups (replicas of the shard)
    int group_size() const { return comm_.world(); }
    int replica_count() const { return replicas_ ? replicas_->world() : 1; }
    // bytes moved since the last reset_traffic()
    ZeroTraffic traffic() const { return {comm_.counters(), replicas_ ? replicas_->counters() : CommCounters{}}; }
    void reset_traffic() {
        comm_.reset_counters();
        if (replicas_) replicas_->reset_counters();
    }
    // fp32 master weights are part of the optimizer state (save_state, load_state)
    bool has_master_weights() const { return master_in_state_; }
    bool offloads_optimizer() const { return host_ != nullptr; }

    // full fp32 parameters (same on every rank) -> this rank's copies
    void load(const float* host) {
        for (int g = 0; g < plan_.num_groups(); g++) {
            for (const auto& t : plan_.group(g).tensors) {
                size_t start = (size_t)rank_ * t.chunk, len = PartitionPlan::unpadded(t, rank_);
                if (policy_.shards_params) Backend::upload_fp32(params_shard_ + t.shard_offset, host + t.slice.offset + start, len);
                else Backend::upload_fp32(params_full_ + t.slice.offset, host + t.slice.offset, t.slice.n);
                // offloaded, the host keeps an fp32 master whatever the backend's precision
                if (host_) std::copy_n(host + t.slice.offset + start, len, host_->master() + t.shard_offset);
                else if (master_ != nullptr)
                    Backend::from_host(master_ + t.shard_offset, host + t.slice.offset + start, len * 4);
            }
        }
        invalidate_slots();
    }
    // this rank's view -> full fp32 parameters on the host (the shards as the optimizer holds
    // them, never quantized); a collective at stage 3
    void save(float* host) { download_params(host, false); }

    // Optimizer state in the flat, unsharded layout (so any stage and world size can take it
    // back): Adam's m and v, and the fp32 master weights where they are part of the state (else
    // `master` is left alone). The same with or without offload. A collective; only `root`
    // receives.
    void save_state(float* m, float* v, float* master, int root) {
        if (!shard_groups_.holds(root)) return;  // the other groups hold the same shards again
        const int N = plan_.world();
        const size_t S = plan_.shard_size();
        const bool is_root = shard_groups_.world().rank() == root;
        root %= comm_.world();  // in the group
        std::vector<float> shard(host_ ? 0 : S), rows(is_root && N > 1 ? (size_t)N * S : 0);
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
            if (!is_root) return;
            for (int g = 0; g < plan_.num_groups(); g++)
                for (const auto& t : plan_.group(g).tensors)
                    for (int r = 0; r < N; r++)
                        std::copy_n(all + (size_t)r * S + t.shard_offset, PartitionPlan::unpadded(t, r),
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

    // Parameters of group g, ready for the kernels. At stage 3 this all-gathers them unless the
    // group's slot already holds them (or waits for the gather prefetch() started).
    Tensors params(int g) {
        comm_.note(Communicator::Event::ParamsWanted, g);
        return params_gathered(g, quantize_weights_);
    }
    // Stage 3: start gathering group g (if it exists, is not already there and goes in one
    // piece) while the caller computes with another slot's group.
    void prefetch(int g) {
        if (!policy_.shards_params || g < 0 || g >= plan_.num_groups() || plan_.group(g).shard_size > max_piece_) return;
        int s = slot_of(g);
        if (slot_group_[s] != g && gather_[s].group != g) start_gather(g, 0, plan_.group(g).shard_size, quantize_weights_);
    }

    // Where group g's backward adds its gradients. At stages 2-3 the first call in a micro-step
    // hands out a zeroed bucket, which grads_done() reduce-scatters into the shard.
    Tensors grads(int g) {
        const auto& group = plan_.group(g);
        if (!policy_.shards_grads) {
            if (last_micro_step_ && reduced_[g])
                fatal(1, "zero: group %d's gradients wanted after their reduction began (a second backward after begin_micro_step(true)?)", g);
            return tensors_at(grads_full_, group, full_offset);
        }
        int s = slot_of(g);
        if (bucket_group_[s] != g) {
            Backend::zero(bucket_[s], group.size * sizeof(floatX));
            bucket_group_[s] = g;
            zeroed_[g] = 1;
        }
        return tensors_at(bucket_[s], group, group_offset);
    }
    // Group g's gradients held zeros when grads(g) handed them out in this backward: no backward
    // has finished with them (grads_done) since zero_grads() or, where gradients are sharded,
    // since this micro-step's bucket was zeroed. A gradient that gets one addition a backward (a
    // bias) may then be written instead of added to.
    bool grads_zeroed(int g) const { return zeroed_[g] != 0; }
    // group g's backward is done: its reduction starts now, if this backward reduces (see the
    // stage table above)
    void grads_done(int g) {
        comm_.note(Communicator::Event::GradsDone, g);
        zeroed_[g] = 0;
        if (!policy_.reduces_once_per_step() || last_micro_step_) reduce_group(g);
        if (policy_.shards_grads) bucket_group_[slot_of(g)] = -1;
    }

    // before the first micro-step of a step
    void zero_grads() {
        if (host_) host_->begin_step();
        if (policy_.shards_grads) Backend::zero(grads_shard_, plan_.shard_size() * sizeof(floatX));
        else Backend::zero(grads_full_, plan_.total() * sizeof(floatX));
        std::fill(reduced_.begin(), reduced_.end(), 0);
        std::fill(zeroed_.begin(), zeroed_.end(), 1);
        last_micro_step_ = false;
    }
    // Before each micro-step's forward, once: stage 3 gathers every group afresh, and `last`
    // (the step's last micro-step, whose backward completes the gradients group by group) lets
    // stages 0-1 reduce each group as soon as its backward is done.
    void begin_micro_step(bool last) {
        invalidate_slots();
        last_micro_step_ = last;
    }

    // The optimizer's step in two halves, so that the caller may look at the norm and skip the
    // update: first the reductions and the global gradient norm, ...
    float grad_norm() {
        if (policy_.reduces_once_per_step())  // what no backward reduced
            for (int g = 0; g < plan_.num_groups(); g++)
                if (!reduced_[g]) reduce_group(g);
        last_micro_step_ = false;  // the gradients may be read again
        for (int s = 0; s < kSlots; s++) {
            // the slot's last reduce-scatter, then the all-reduce across groups it may start
            for (const int final_group : {finish_reduce(s), finish_across(s)})
                if (final_group >= 0) gradient_final(final_group);
            if (gather_[s].group >= 0) comm_.wait(gather_[s].ticket);  // of parameters about to change
            gather_[s].group = -1;
        }
        for (int g = 0; g < plan_.num_groups() && host_; g++)  // what no reduction made final
            if (!host_->grads_sent(g)) gradient_final(g);

        Backend::grad_norm_squared(norm_acc_, grads_base(), optimizer_table_);
        float local = 0.0f;
        Backend::to_host(&local, norm_acc_, sizeof(float));
        // all-reduced, every rank holds the whole gradient: nothing to add up
        double sumsq = policy_.all_reduces() ? local : comm_.all_reduce_host(local);
        return (float)std::sqrt(sumsq);
    }
    // ... then the update (a collective too: every rank must call it or none). Without offload
    // one launch over the rank's shard; offloaded, group by group: update group g on the host,
    // send its new parameters back, start its gather, while the host goes on to the next group.
    void update(const AdamWStep& s) {
        floatX* params = policy_.shards_params ? params_shard_ : params_full_;
        if (!host_) Backend::adamw_update(params, master_, grads_base(), adam_m_, adam_v_, optimizer_table_, s);
        for (int g = 0; g < plan_.num_groups(); g++) {
            if (host_) host_->update(g, params, s);
            if (policy_.gathers_after_update()) start_gather_updated(g);
        }
        for (int slot = 0; slot < kSlots; slot++) finish_gather_updated(slot);
        invalidate_slots();
    }

    // ---- for the tests (test/test_zero.cpp)
    // this rank's shard of the parameters in shard layout (padding as zeros), as fp32
    std::vector<float> shard_to_host() {
        std::vector<float> out(plan_.shard_size(), 0.0f);
        for_each_owned([&](const PartitionPlan::Tensor& t, size_t len) {
            Backend::download_fp32(out.data() + t.shard_offset, param_of(t), len);
        });
        return out;
    }
    // Stage 3: gathers params() had to start itself, for a group after the first of a micro-step
    // (each costs the overlap prefetch() is there for); 0 when the model prefetches correctly
    int prefetch_misses() const { return prefetch_misses_; }
    // the parameters forward and backward compute with, as fp32 (with --quantize-weights the
    // dequantized gathers); a collective at stage 3
    std::vector<float> params_in_use() {
        std::vector<float> out(plan_.total());
        download_params(out.data(), quantize_weights_);
        return out;
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
        bool quantized = false;  // of int8 blocks
        bool gathering = false;  // a quantized all-reduce across groups in its second half, the all-gather
    };
    // How a piece of a group's shard travels quantized: a rank's row of it in the group's
    // collectives (whole; blocks == 0: unquantized), and with replicas and quantized gradients
    // part j of part_values values for replica j (none: an unquantized all-reduce across groups)
    struct PieceQuant {
        QuantRows whole;
        std::vector<QuantRows> parts;
        size_t part_values = 0;
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
        for (size_t lo = 0; lo < g.shard_size; lo += max_piece_) f(lo, std::min(g.shard_size, lo + max_piece_));
    }
    // Group g's parameters in its slot, ready for the kernels: at stage 3 all-gathered (as int8
    // blocks where `quantized` and the piece is large enough) unless the slot holds them already
    // or a prefetch() is gathering them
    Tensors params_gathered(int g, bool quantized) {
        const auto& group = plan_.group(g);
        if (!policy_.shards_params) return tensors_at(params_full_, group, full_offset);
        int s = slot_of(g);
        if (slot_group_[s] != g) {
            // the last (or only) piece may have been started by prefetch()
            for_each_piece(group, [&](size_t lo, size_t hi) {
                if (gather_[s].group != g || gather_[s].lo != lo || gather_[s].quantized != (quantized && quantized_piece(g, lo))) {
                    prefetch_misses_ += g != 0;  // (for the tests) the embedding comes first: nothing runs before it
                    start_gather(g, lo, hi, quantized);
                }
                comm_.wait(gather_[s].ticket);
                if (gather_[s].quantized) Backend::dequantize_int8(gathered_[s], q_gather_all_[s], quant(g, lo).whole, comm_.world());
                gather_[s].group = -1;
                unpack(slot_[s], gathered_[s], group, group_offset, lo, hi);
            });
            slot_group_[s] = g;
        }
        return tensors_at(slot_[s], group, group_offset);
    }
    // gathers the piece [lo, hi) of group g's shard into the slot's buffer, as int8 blocks where
    // `quantized` and the piece is large enough
    void start_gather(int g, size_t lo, size_t hi, bool quantized) {
        const auto& group = plan_.group(g);
        int s = slot_of(g);
        if (gather_[s].group >= 0) comm_.wait(gather_[s].ticket);  // an unused prefetch
        comm_.note(Communicator::Event::NextCollectiveMoves, g);
        const floatX* mine = params_shard_ + group.shard_offset + lo;
        if (quantized && quantized_piece(g, lo)) {
            const QuantRows& rows = quant(g, lo).whole;
            Backend::quantize_int8(q_gather_mine_[s], mine, rows, 1);
            gather_[s] = {g, lo, hi, comm_.all_gather_async(q_gather_mine_[s], q_gather_all_[s], rows.row_bytes(), DType::I8), false, true};
        } else {
            gather_[s] = {g, lo, hi, comm_.all_gather_async(mine, gathered_[s], hi - lo, dtype_)};
        }
    }
    // every group's parameters (quantized: as the model computes with them) -> fp32 on the
    // host; the slots are gathered afresh before and after, so that quantized and exact
    // parameters never stand in for each other
    void download_params(float* host, bool quantized) {
        invalidate_slots();
        for (int g = 0; g < plan_.num_groups(); g++) {
            Tensors p = params_gathered(g, quantized);
            const auto& tensors = plan_.group(g).tensors;
            for (size_t i = 0; i < tensors.size(); i++)
                Backend::download_fp32(host + tensors[i].slice.offset, p[i], tensors[i].slice.n);
        }
        invalidate_slots();
    }

    // Quantized collectives: each piece's rows (kernels/quantize_blocks.h), whole and in parts
    // across groups, their blocks in host and backend memory
    void plan_quantization() {
        const int R = replica_count();
        std::vector<std::vector<QuantBlock>> blocks;  // of every QuantRows below, in for_each_quant_rows' order
        for (int g = 0; g < plan_.num_groups(); g++) {
            quant_.emplace_back();
            for_each_piece(plan_.group(g), [&](size_t lo, size_t hi) {
                PieceQuant q;
                if (hi - lo >= kQuantMinValues) q.whole = quant_rows_of(g, lo, hi, &blocks);
                q.part_values = (hi - lo + R - 1) / R;
                if (quantize_grads_ && replicas_ && q.part_values >= kQuantMinValues) {
                    size_t stride = 0;
                    for (int j = 0; j < R; j++) {
                        const size_t a = std::min(hi, lo + j * q.part_values), b = std::min(hi, a + q.part_values);
                        q.parts.push_back(quant_rows_of(g, a, b, &blocks));
                        stride = std::max(stride, q.parts.back().row_bytes());
                    }
                    for (QuantRows& part : q.parts) part.stride = stride;  // one message size for the all-to-all
                }
                quant_.back().push_back(q);
            });
        }
        size_t count = 0;
        for (const auto& b : blocks) count += b.size();
        QuantBlock* device = nullptr;
        owned_.alloc(&device, count, &memory_.comm);
        quant_blocks_.reserve(count);
        size_t next = 0;
        for_each_quant_rows([&](QuantRows& rows) {
            rows.host = quant_blocks_.data() + quant_blocks_.size();
            rows.device = device + quant_blocks_.size();
            quant_blocks_.insert(quant_blocks_.end(), blocks[next].begin(), blocks[next].end());
            next++;
        });
        Backend::from_host(device, quant_blocks_.data(), count * sizeof(QuantBlock));
    }
    // the rows of the values [a, b) of group g's shard: blocks of its tensor pieces (appended to
    // *blocks; the rows' pointers are set once all are known)
    QuantRows quant_rows_of(int g, size_t a, size_t b, std::vector<std::vector<QuantBlock>>* blocks) {
        std::vector<size_t> tensor_pieces;
        for_each_in_piece(plan_.group(g), a, b, [&](const PartitionPlan::Tensor&, size_t, size_t, size_t len) { tensor_pieces.push_back(len); });
        blocks->push_back(quant_blocks(tensor_pieces));
        QuantRows rows;
        rows.blocks = (int)blocks->back().size();
        rows.values = b - a;
        return rows;
    }
    // f(rows) for every piece's rows that have blocks: whole, then its parts, piece after piece
    template <class F>
    void for_each_quant_rows(F f) {
        for (auto& pieces : quant_)
            for (PieceQuant& q : pieces) {
                if (q.whole.values > 0) f(q.whole);  // made by quant_rows_of
                for (QuantRows& part : q.parts) f(part);
            }
    }
    // how group g's piece starting at lo travels quantized, and whether it does (whole)
    const PieceQuant& quant(int g, size_t lo) const { return quant_[g][lo / max_piece_]; }
    bool quantized_piece(int g, size_t lo) const { return !quant_.empty() && quant(g, lo).whole.blocks > 0; }
    // Starts summing group g's gradients over ranks, piece by piece through its slot's
    // buffers: all-reduced in the full gradient, reduce-scattered from it, or reduce-scattered
    // from the micro-step's bucket, as the policy says. The last piece finishes while the caller
    // computes on; a piece before it finishes when its slot takes the next.
    void reduce_group(int g) {
        reduced_[g] = 1;
        const bool last_of_step = policy_.reduces_once_per_step() || last_micro_step_;
        if (policy_.all_reduces() && comm_.world() == 1) {  // nothing to sum: final as it is
            if (last_of_step) gradient_final(g);
            return;
        }
        const auto& group = plan_.group(g);
        const int s = slot_of(g);
        for (int t = 0; t < kSlots; t++) exchange_across(t);  // each quantized exchange across groups a group of compute ago
        for_each_piece(group, [&](size_t lo, size_t hi) {
            const int final_group = finish_reduce(s);  // the slot's previous piece
            if (final_group >= 0) gradient_final(final_group);
            if (policy_.shards_grads) pack(rank_major_[s], bucket_[s], group, group_offset, lo, hi);
            else pack(rank_major_[s], grads_full_, group, full_offset, lo, hi);
            comm_.note(Communicator::Event::NextCollectiveMoves, g);
            if (quantize_grads_ && comm_.world() > 1 && quantized_piece(g, lo)) {  // each rank's row as int8 blocks
                const QuantRows& rows = quant(g, lo).whole;
                Backend::quantize_int8(q_reduce_send_[s], rank_major_[s], rows, comm_.world());
                reduce_[s] = {g, lo, hi, comm_.all_to_all_async(q_reduce_send_[s], q_reduce_recv_[s], rows.row_bytes(), DType::I8), last_of_step, true};
            } else {
                reduce_[s] = {g, lo, hi,
                              policy_.all_reduces() ? comm_.all_reduce_async(rank_major_[s], hi - lo, dtype_)
                                                    : comm_.reduce_scatter_async(rank_major_[s], my_piece_[s], hi - lo, dtype_),
                              last_of_step};
            }
        });
    }
    // The slot's reduction under way, if any, waited for and its result put where the optimizer
    // reads it: back into the full gradient (all-reduced), into this rank's chunks of it
    // (reduce-scattered from it, or summed from the quantized rows an all-to-all brought), added
    // into the gradient shard (from a bucket). With replicas,
    // the step's last reduction then starts the piece's all-reduce across groups (after the one
    // the slot has under way, if any, is finished): in the shard, or at stage 1 in a buffer of
    // its own, so that the slot's next reduce-scatter need not wait for it. Returns the group
    // whose gradient that made final for the step (its last piece of the step's last
    // reduction), else -1.
    int finish_reduce(int s) {
        const int final_across = finish_across(s);
        InFlight& r = reduce_[s];
        if (r.group < 0) return final_across;
        comm_.wait(r.ticket);
        const auto& group = plan_.group(r.group);
        if (r.quantized) Backend::dequantize_sum_int8(my_piece_[s], q_reduce_recv_[s], quant(r.group, r.lo).whole, comm_.world());
        const bool across = replicas_ && r.last_of_step && !policy_.all_reduces();
        auto grad_chunk = [&](const PartitionPlan::Tensor& t) { return grad_of(t); };
        if (policy_.all_reduces()) {
            unpack(grads_full_, rank_major_[s], group, full_offset, r.lo, r.hi);
        } else if (!policy_.shards_grads) {
            if (across) std::swap(my_piece_[s], across_piece_[s]);
            else copy_from_my_piece(my_piece_[s], group, r.lo, r.hi, grad_chunk);
        } else {
            Backend::accumulate(grads_shard_ + group.shard_offset + r.lo, my_piece_[s], r.hi - r.lo);
        }
        if (across) start_across(s, r.group, r.lo, r.hi);
        const int final_group = !across && r.last_of_step && r.hi == group.shard_size ? r.group : -1;
        r.group = -1;
        return final_group >= 0 ? final_group : final_across;  // at most one is: across or not
    }
    // the piece [lo, hi) of group g's gradient shard that slot s all-reduces across groups
    floatX* across_piece(int s, int g, size_t lo) const {
        return policy_.shards_grads ? grads_shard_ + plan_.group(g).shard_offset + lo : across_piece_[s];
    }
    // Starts the all-reduce across groups of group g's piece [lo, hi): quantized, each replica's
    // part as int8 blocks to that replica (the first half; exchange_across() does the second)
    void start_across(int s, int g, size_t lo, size_t hi) {
        floatX* piece = across_piece(s, g, lo);
        replicas_->note(Communicator::Event::NextCollectiveMoves, g);
        const PieceQuant* q = quantize_grads_ ? &quant(g, lo) : nullptr;
        if (q == nullptr || q->parts.empty()) {
            across_[s] = {g, lo, hi, replicas_->all_reduce_async(piece, hi - lo, dtype_), true};
            return;
        }
        const size_t stride = q->parts[0].row_stride();
        for (size_t j = 0; j < q->parts.size(); j++)
            Backend::quantize_int8(q_across_send_[s] + j * stride, piece + j * q->part_values, q->parts[j], 1);
        across_[s] = {g, lo, hi, replicas_->all_to_all_async(q_across_send_[s], q_across_recv_[s], stride, DType::I8), true, true};
    }
    // A quantized all-reduce across groups halfway (its all-to-all under way): waited for, this
    // replica's part summed in fp32 from every replica's, quantized again and all-gathered
    void exchange_across(int s) {
        InFlight& a = across_[s];
        if (a.group < 0 || !a.quantized || a.gathering) return;
        replicas_->wait(a.ticket);
        const PieceQuant& q = quant(a.group, a.lo);
        const int k = replicas_->rank();
        const size_t stride = q.parts[0].row_stride();
        floatX* mine = across_piece(s, a.group, a.lo) + k * q.part_values;
        Backend::dequantize_sum_int8(mine, q_across_recv_[s], q.parts[k], replicas_->world());
        Backend::quantize_int8(q_across_send_[s], mine, q.parts[k], 1);
        replicas_->note(Communicator::Event::NextCollectiveMoves, a.group);
        a.ticket = replicas_->all_gather_async(q_across_send_[s], q_across_recv_[s], stride, DType::I8);
        a.gathering = true;
    }
    // The slot's all-reduce across groups, if any, waited for (quantized: each replica's summed
    // part dequantized into the piece, this replica's too, so that all hold the same), at stage 1
    // the piece then copied into this rank's chunks of the full gradient; returns the group it
    // made final, else -1
    int finish_across(int s) {
        exchange_across(s);
        InFlight& a = across_[s];
        if (a.group < 0) return -1;
        replicas_->wait(a.ticket);
        const auto& group = plan_.group(a.group);
        if (a.quantized) {
            const PieceQuant& q = quant(a.group, a.lo);
            const size_t stride = q.parts[0].row_stride();
            for (size_t j = 0; j < q.parts.size(); j++)
                Backend::dequantize_int8(across_piece(s, a.group, a.lo) + j * q.part_values, q_across_recv_[s] + j * stride, q.parts[j], 1);
        }
        if (!policy_.shards_grads)
            copy_from_my_piece(across_piece_[s], group, a.lo, a.hi, [&](const PartitionPlan::Tensor& t) { return grad_of(t); });
        const int final_group = a.hi == group.shard_size ? a.group : -1;
        a = InFlight{};
        return final_group;
    }
    // group g's gradient is final for the step: offloaded, it leaves for the host now, on the
    // transfer stream, while the backward goes on
    void gradient_final(int g) {
        if (host_ == nullptr) return;
        comm_.note(Communicator::Event::GradsToHost, g);
        host_->send_grads(g, grads_base());
    }
    int slot_of(int g) const {
        int last = plan_.num_groups() - 1;
        return g == 0 ? 0 : g == last ? 1 : 2 + (g % 2);
    }
    void invalidate_slots() {
        for (int s = 0; s < kSlots; s++) slot_group_[s] = -1;
    }
    floatX* grads_base() const { return policy_.shards_grads ? grads_shard_ : grads_full_; }
    // this rank's chunk of tensor t, where the optimizer reads it
    floatX* grad_of(const PartitionPlan::Tensor& t) const {
        if (policy_.shards_grads) return grads_shard_ + t.shard_offset;
        return grads_full_ + t.slice.offset + (size_t)rank_ * t.chunk;
    }
    floatX* param_of(const PartitionPlan::Tensor& t) const {
        if (policy_.shards_params) return params_shard_ + t.shard_offset;
        return params_full_ + t.slice.offset + (size_t)rank_ * t.chunk;
    }
    // each group's entries [first, end) in the optimizer's table (one per tensor with a piece here)
    std::vector<std::pair<int, int>> table_entries_per_group() const {
        std::vector<std::pair<int, int>> ranges;
        int next = 0;
        for (int g = 0; g < plan_.num_groups(); g++) {
            const int first = next;
            for (const auto& t : plan_.group(g).tensors) next += PartitionPlan::unpadded(t, rank_) > 0;
            ranges.push_back({first, next});
        }
        return ranges;
    }
    template <class F>
    void for_each_owned(F f) {
        for (int g = 0; g < plan_.num_groups(); g++)
            for (const auto& t : plan_.group(g).tensors) {
                size_t len = PartitionPlan::unpadded(t, rank_);
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
    // f(t, c0, at, len) for the real parameters (no padding) of this rank's chunks that the
    // piece [lo, hi) of group g holds: len elements from c0 within t's chunk, at `at` in the piece
    template <class F>
    void for_each_mine_in_piece(const PartitionPlan::Group& g, size_t lo, size_t hi, F f) const {
        for_each_in_piece(g, lo, hi, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            const size_t unpadded = PartitionPlan::unpadded(t, rank_);
            if (unpadded > c0) f(t, c0, at, std::min(len, unpadded - c0));
        });
    }
    // this rank's chunks of the tensors (chunk_of(t)) -> its piece [lo, hi) of group g
    template <class ChunkOf>
    void copy_to_my_piece(floatX* piece, const PartitionPlan::Group& g, size_t lo, size_t hi, ChunkOf chunk_of) const {
        for_each_mine_in_piece(g, lo, hi, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            Backend::copy(piece + at, chunk_of(t) + c0, len * sizeof(floatX));
        });
    }
    // ... and back
    template <class ChunkOf>
    void copy_from_my_piece(const floatX* piece, const PartitionPlan::Group& g, size_t lo, size_t hi, ChunkOf chunk_of) const {
        for_each_mine_in_piece(g, lo, hi, [&](const PartitionPlan::Tensor& t, size_t c0, size_t at, size_t len) {
            Backend::copy(chunk_of(t) + c0, piece + at, len * sizeof(floatX));
        });
    }

    // After the update (stages 1-2): starts gathering every rank's new chunks of group g into
    // the full parameters, piece by piece through its slot's buffers; a slot's piece before is
    // finished first, so packing one overlaps the transfer of the one before.
    void start_gather_updated(int g) {
        const auto& group = plan_.group(g);
        const int s = slot_of(g);
        for_each_piece(group, [&](size_t lo, size_t hi) {
            finish_gather_updated(s);
            copy_to_my_piece(my_piece_[s], group, lo, hi, [&](const PartitionPlan::Tensor& t) { return param_of(t); });
            updated_gather_[s] = {g, lo, hi, comm_.all_gather_async(my_piece_[s], rank_major_[s], hi - lo, dtype_)};
        });
    }
    // the slot's gather of updated parameters, if any, waited for and unpacked into the full parameters
    void finish_gather_updated(int s) {
        InFlight& p = updated_gather_[s];
        if (p.group < 0) return;
        comm_.wait(p.ticket);
        unpack(params_full_, rank_major_[s], plan_.group(p.group), full_offset, p.lo, p.hi);
        p.group = -1;
    }

    ZeroPolicy policy_;
    ShardGroups shard_groups_;
    Communicator& comm_;         // this rank's shard group: the collectives of the stage
    Communicator* replicas_;     // the ranks holding the same shard in the other groups (null: none)
    DType dtype_;
    PartitionPlan plan_;
    int rank_;  // which chunk this rank owns (0 at stage 0: it owns everything)
    bool master_in_state_;
    bool quantize_weights_;  // stage 3's gathers go as int8 blocks
    bool quantize_grads_;    // reductions go as int8 blocks (inside the group where it has ranks, across groups)
    ZeroMemory memory_;
    Allocations<Backend> owned_;
    floatX *params_full_ = nullptr, *grads_full_ = nullptr;    // unsharded, in the flat layout
    floatX *params_shard_ = nullptr, *grads_shard_ = nullptr;  // this rank's chunks, in shard layout
    float *master_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr, *norm_acc_ = nullptr;  // in backend memory
    std::unique_ptr<HostOptimizer<Backend>> host_;  // offloaded: the optimizer state instead
    // the optimizer's table of this rank's shard (kernels/shard_table.h): its entries, and the
    // table the launches take (the entries in host and in backend memory)
    std::vector<ShardTensor> optimizer_entries_;
    ShardTable optimizer_table_;
    // Per slot, for the collectives: a rank-major buffer (world rows of a piece) and this rank's
    // row of it; at stages 2-3 the gradient bucket, at stage 3 the group's gathered parameters
    // (slot_, in the group's layout) and the rank-major buffer they are gathered into
    floatX* rank_major_[kSlots] = {};
    floatX* my_piece_[kSlots] = {};
    floatX* across_piece_[kSlots] = {};  // stage 1 with replicas: a piece all-reduced across groups
    floatX* bucket_[kSlots] = {};
    floatX* slot_[kSlots] = {};
    floatX* gathered_[kSlots] = {};
    // Quantized collectives, per slot: a gather's row of this rank and every rank's; a reduction's
    // rows sent and received inside the group; and across groups, a row per replica sent and
    // received (the all-gather's reusing them)
    uint8_t* q_gather_mine_[kSlots] = {};
    uint8_t* q_gather_all_[kSlots] = {};
    uint8_t* q_reduce_send_[kSlots] = {};
    uint8_t* q_reduce_recv_[kSlots] = {};
    uint8_t* q_across_send_[kSlots] = {};
    uint8_t* q_across_recv_[kSlots] = {};
    std::vector<std::vector<PieceQuant>> quant_;  // [group][piece]; empty: nothing quantized
    std::vector<QuantBlock> quant_blocks_;        // the blocks of every QuantRows above, in host memory
    // which group each slot's parts hold or are receiving (-1: none)
    int slot_group_[kSlots] = {-1, -1, -1, -1};
    int bucket_group_[kSlots] = {-1, -1, -1, -1};
    std::vector<char> reduced_;  // per group: its reduction of this step has started (stages 0-1)
    std::vector<char> zeroed_;   // per group: no grads_done since its gradients were zeroed
    bool last_micro_step_ = false;  // begin_micro_step(true) until the norm is taken
    // each slot's collective under way, if any: a stage-3 gather, a reduction, its all-reduce
    // across groups, a gather after the update
    InFlight gather_[kSlots], reduce_[kSlots], across_[kSlots], updated_gather_[kSlots];
    int prefetch_misses_ = 0;
    size_t max_piece_ = 0;  // elements per rank a collective moves at most: the largest layer shard
};
