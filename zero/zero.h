// ZeRO stages 0-3: which rank keeps which part of the parameters, gradients and Adam state, and
// when they move between ranks. Knows nothing of the model's kernels: it takes the parameter groups
// from the model and uses only the backend's memory primitives and its two optimizer ops
// (adamw_update, grad_norm_squared), each one launch over the rank's whole shard. docs/zero.md
// tells the rest: slots and pieces, hybrid sharding, int8 collectives, offload.
//
//   stage 0  full replicas; gradients all-reduced once per step
//   stage 1  Adam state (and fp32 master weights) sharded; gradients reduce-scattered once per
//            step, each rank updates its shard, parameters all-gathered
//   stage 2  gradients sharded too: each group is reduce-scattered as soon as its backward is
//            done, from a reusable bucket, and accumulated into the shard
//   stage 3  parameters sharded too: each group is all-gathered into a slot just before use
// ZeroPolicy below is this table as data; the methods read it, never the stage number.
//
// The training loop calls zero_grads() once per step and begin_micro_step(last) before each
// micro-step's forward. Group by group the model then asks params(g) in forward and backward,
// and at stage 3 prefetch(g) for the group it computes next; in backward it asks grads(g) and
// says grads_done(g). Then grad_norm() and update(). An evaluation needs only params(g).
//
// The collectives. Each goes through its group's Slot, a piece at a time (zero/pieces.h): the
// first and the last group have a slot each, the middle ones take turns in two. A slot has at
// most one of each kind under way and finishes it before it reuses that one's buffers, so each
// runs while the model computes on:
//   gather   stage 3: a group's parameters, into the slot. start_gather(), from params(g) or
//            ahead of it from prefetch(g); finished in params(g). An unused prefetch is waited
//            for by the next gather or in grad_norm().
//   reduce   a group's gradients summed inside the shard group, in every micro-step at stages
//            2-3 and in the last at stages 0-1. reduce_group(), from grads_done(g), or from
//            grad_norm() for the groups no backward reduced; finish_reduce() before the slot's
//            next piece, and in grad_norm().
//   across   with shard groups: the step's last reduce of a piece, all-reduced across groups.
//            start_across(), from finish_reduce(); finish_across(), from the slot's next
//            finish_reduce(), and in grad_norm(). As int8 it goes in two halves, an all-to-all
//            and then an all-gather, which gather_across() starts at the next reduce_group() or,
//            for the last, in grad_norm().
//   updated  stages 1-2: the new parameters all-gathered. start_gather_updated(), from
//            update(); finish_gather_updated() before the slot's next piece, and at the end
//            of update().
// A group's gradient is final for the step when the step's reduce of its last piece finishes,
// with shard groups its across; offloaded, it then leaves for the host (offload_final_grads()).
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "../common/io.h"  // fatal
#include "../kernels/allocations.h"
#include "comm.h"
#include "offload.h"
#include "partition.h"
#include "pieces.h"
#include "quantized_exchange.h"

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
    // the shard groups, made beforehand by the caller (a run makes its communicators before it
    // reads what memory is free), of shard_group ranks each; nullptr: made here
    const ShardGroups* shard_groups = nullptr;
};

// a checkpoint's arrays, each in the flat layout of every parameter (master: where the state has them)
enum class CheckpointArray { Params, AdamM, AdamV, Master };
// a run of the flat layout a rank owns: [flat, flat + n) is [shard, shard + n) of its shard
struct CheckpointRun {
    size_t flat, shard, n;
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

    // comm: every rank of the run; the stage shards over options.shard_group of them
    Zero(int stage, const std::vector<std::vector<TensorSlice>>& groups, Communicator& comm, ZeroOptions options = {})
        : policy_(stage),
          own_shard_groups_(options.shard_groups ? nullptr
                                                 : std::make_unique<ShardGroups>(comm, policy_.shards_optimizer ? options.shard_group : 0)),
          shard_groups_(options.shard_groups ? *options.shard_groups : *own_shard_groups_),
          comm_(shard_groups_.group()),
          replicas_(shard_groups_.replicas()),
          dtype_(sizeof(floatX) == 4 ? DType::F32 : DType::BF16),
          plan_(groups, policy_.shards_optimizer ? comm_.world() : 1),
          rank_(policy_.shards_optimizer ? comm_.rank() : 0),
          pieces_(plan_, rank_),
          master_in_state_(Backend::params_narrower_than_fp32 && options.master_weights),
          // int8 where there is something to send: stage 3's gathers among two or more ranks,
          // the reductions of stages 1-3 among two or more ranks or across shard groups
          int8_(pieces_, comm_, replicas_, options.quantize_weights && policy_.shards_params && comm_.world() > 1,
                options.quantize_grads && policy_.shards_optimizer && (comm_.world() > 1 || replicas_ != nullptr), owned_,
                &memory_.comm) {
        const size_t S = plan_.shard_size(), P = plan_.total();
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
        const bool communicates = policy_.shards_optimizer || comm.world() > 1;  // else nothing is ever summed
        for (int s = 0; s < kSlots && communicates; s++) alloc_slot(s);
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
    void save(float* host) { download_params(host, Gather::Exact); }

    // ---- checkpoints. A checkpoint holds each of its arrays (CheckpointArray) in the flat,
    // unsharded layout, so that any stage and world size can take it back; each rank saves and
    // loads its own runs of it (owned_runs()), through a host buffer of the caller's size.
    // this rank's chunk of every tensor: [flat, flat + n) of the layout is [shard, shard + n) of its shard
    std::vector<CheckpointRun> owned_runs() const {
        std::vector<CheckpointRun> runs;
        for_each_owned([&](const PartitionPlan::Tensor& t, size_t len) {
            runs.push_back({t.slice.offset + (size_t)rank_ * t.chunk, t.shard_offset, len});
        });
        return runs;
    }
    // whether this rank writes its runs at a save: one rank per part (the first shard group's;
    // at stage 0, where every rank holds everything, world rank 0)
    bool saves_its_runs() const { return shard_groups_.holds(0) && (policy_.shards_optimizer || shard_groups_.world().rank() == 0); }
    // elements [from, from + n) of run r of array a -> fp32 on the host (the shards as the
    // optimizer holds them, never quantized)
    void copy_out(CheckpointArray a, const CheckpointRun& r, size_t from, size_t n, float* host) {
        if (a == CheckpointArray::Params) return Backend::download_fp32(host, param_at(r) + from, n);
        if (float* h = host_state(a)) std::copy_n(h + r.shard + from, n, host);
        else Backend::to_host(host, device_state(a) + r.shard + from, n * sizeof(float));
    }
    // ... and back. Parameters set the master weights too (as load() does: the state's, where it
    // has them, come after); once every run's parameters are in, finish_loading_params().
    void copy_in(CheckpointArray a, const CheckpointRun& r, size_t from, size_t n, const float* host) {
        if (a == CheckpointArray::Params) {
            Backend::upload_fp32(param_at(r) + from, host, n);
            if (!master_in_state_ && !host_) return;
            a = CheckpointArray::Master;
        }
        if (float* h = host_state(a)) std::copy_n(host, n, h + r.shard + from);
        else Backend::from_host(device_state(a) + r.shard + from, host, n * sizeof(float));
    }
    // stages 1-2: every rank's chunks gathered into the full parameters; a collective
    void finish_loading_params() {
        for (int g = 0; g < plan_.num_groups() && policy_.gathers_after_update(); g++) start_gather_updated(g);
        for (Slot& slot : slots_) finish_gather_updated(slot);
        invalidate_slots();
    }

    // Parameters of group g, ready for the kernels. At stage 3 this all-gathers them unless the
    // group's slot already holds them (or waits for the gather prefetch() started).
    Tensors params(int g) {
        comm_.note(Communicator::Event::ParamsWanted, g);
        return params_gathered(g, Gather::AsComputed);
    }
    // Stage 3: start gathering group g (if it exists, is not already there and goes in one
    // piece) while the caller computes with another slot's group.
    void prefetch(int g) {
        if (!policy_.shards_params || g < 0 || g >= plan_.num_groups() || !pieces_.one_piece(g)) return;
        Slot& slot = slot_of(g);
        if (slot.params_group != g && slot.gather.piece.group != g) start_gather(slot, Piece{g, 0, plan_.group(g).shard_size}, Gather::AsComputed);
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
        Slot& slot = slot_of(g);
        if (slot.bucket_group != g) {
            Backend::zero(slot.bucket, group.size * sizeof(floatX));
            slot.bucket_group = g;
            zeroed_[g] = 1;
        }
        return tensors_at(slot.bucket, group, group_offset);
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
        if (policy_.shards_grads) slot_of(g).bucket_group = -1;
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
        for (Slot& slot : slots_) {
            // the slot's last reduce, then the across it may start
            finish_reduce(slot);
            offload_final_grads(finish_across(slot));
            if (slot.gather.active()) comm_.wait(slot.gather.ticket);  // of parameters about to change
            slot.gather = {};
        }
        for (int g = 0; g < plan_.num_groups() && host_; g++)  // what no reduction made final
            if (!host_->grads_sent(g)) offload_final_grads(g);

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
        for (Slot& slot : slots_) finish_gather_updated(slot);
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
        download_params(out.data(), Gather::AsComputed);
        return out;
    }

private:
    static constexpr int kSlots = 4;
    // A collective a slot has under way over a piece (piece.group < 0: none)
    struct InFlight {
        Piece piece;
        Communicator::Ticket ticket = 0;
        bool int8 = false;          // moves int8 rows (zero/quantized_exchange.h)
        bool last_of_step = false;  // a reduce that completes the group's gradient for the step
        bool gathering = false;     // an int8 across in its second half, the all-gather
        bool active() const { return piece.group >= 0; }
        static InFlight exact(const Piece& p, Communicator::Ticket t) {
            InFlight f;
            f.piece = p;
            f.ticket = t;
            return f;
        }
        static InFlight quantized(const Piece& p, Communicator::Ticket t) {
            InFlight f = exact(p, t);
            f.int8 = true;
            return f;
        }
    };
    // A slot: the buffers of its groups' collectives, and those it has under way (the protocol
    // at the top of this file)
    struct Slot {
        floatX* rank_major = nullptr;    // every rank's row of a piece
        floatX* my_piece = nullptr;      // this rank's row
        floatX* across_piece = nullptr;  // stage 1 with replicas: a piece all-reduced across groups
        floatX* bucket = nullptr;        // stages 2-3: the group's gradients of the micro-step
        floatX* params = nullptr;        // stage 3: the group's gathered parameters, in its layout
        floatX* gathered = nullptr;      // stage 3: the rank-major buffer they are gathered into
        QuantizedBuffers int8;           // the buffers of int8 rows (zero/quantized_exchange.h)
        int params_group = -1;  // the group whose parameters `params` holds or is receiving
        int bucket_group = -1;  // the group whose gradients `bucket` collects
        InFlight gather, reduce, across, updated;
    };
    // the parameters as the model computes with them (int8 gathers dequantized), or exactly as
    // the optimizer holds them
    enum class Gather { AsComputed, Exact };

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

    int slot_index(int g) const {
        int last = plan_.num_groups() - 1;
        return g == 0 ? 0 : g == last ? 1 : 2 + (g % 2);
    }
    Slot& slot_of(int g) { return slots_[slot_index(g)]; }
    // slot s's buffers, sized by the largest group and piece it serves
    void alloc_slot(int s) {
        Slot& slot = slots_[s];
        const int N = plan_.world();
        std::vector<int> groups;
        size_t size = 0, piece = 0;
        for (int g = 0; g < plan_.num_groups(); g++)
            if (slot_index(g) == s) {
                groups.push_back(g);
                size = std::max(size, plan_.group(g).size);
                piece = std::max(piece, std::min(pieces_.max(), plan_.group(g).shard_size));
            }
        slot.int8 = int8_.alloc_buffers(groups, owned_, &memory_.comm);
        owned_.alloc(&slot.rank_major, (size_t)N * piece, &memory_.comm);
        if (!policy_.all_reduces()) owned_.alloc(&slot.my_piece, piece, &memory_.comm);
        // stage 1 with replicas: a piece all-reduced across groups while the next one is reduce-scattered
        if (replicas_ && !policy_.shards_grads) owned_.alloc(&slot.across_piece, piece, &memory_.comm);
        if (policy_.shards_grads) owned_.alloc(&slot.bucket, size, &memory_.comm);
        if (policy_.shards_params) {
            owned_.alloc(&slot.params, size, &memory_.comm);
            owned_.alloc(&slot.gathered, (size_t)N * piece, &memory_.comm);
        }
    }
    void invalidate_slots() {
        for (Slot& slot : slots_) slot.params_group = -1;
    }

    // Group g's parameters in its slot, ready for the kernels: at stage 3 all-gathered unless the
    // slot holds them already or a prefetch() is gathering them
    Tensors params_gathered(int g, Gather how) {
        const auto& group = plan_.group(g);
        if (!policy_.shards_params) return tensors_at(params_full_, group, full_offset);
        Slot& slot = slot_of(g);
        if (slot.params_group != g) {
            // the last (or only) piece may have been started by prefetch()
            pieces_.for_each(g, [&](const Piece& p) {
                if (slot.gather.piece != p || slot.gather.int8 != gathers_int8(p, how)) {
                    prefetch_misses_ += g != 0;  // (for the tests) the embedding comes first: nothing runs before it
                    start_gather(slot, p, how);
                }
                comm_.wait(slot.gather.ticket);
                if (slot.gather.int8) int8_.finish_gather(slot.gathered, slot.int8, p);
                slot.gather = {};
                pieces_.unpack(slot.params, slot.gathered, group_offset, p);
            });
            slot.params_group = g;
        }
        return tensors_at(slot.params, group, group_offset);
    }
    bool gathers_int8(const Piece& p, Gather how) const { return how == Gather::AsComputed && int8_.gathers_int8(p); }
    // stage 3: gathers piece p of this rank's parameters into the slot
    void start_gather(Slot& slot, const Piece& p, Gather how) {
        if (slot.gather.active()) comm_.wait(slot.gather.ticket);  // an unused prefetch
        comm_.note(Communicator::Event::NextCollectiveMoves, p.group);
        const floatX* mine = params_shard_ + plan_.group(p.group).shard_offset + p.lo;
        if (gathers_int8(p, how)) slot.gather = InFlight::quantized(p, int8_.start_gather(slot.int8, mine, p));
        else slot.gather = InFlight::exact(p, comm_.all_gather_async(mine, slot.gathered, p.size(), dtype_));
    }
    // every group's parameters -> fp32 on the host; the slots are gathered afresh before and
    // after, so that int8-gathered and exact parameters never stand in for each other
    void download_params(float* host, Gather how) {
        invalidate_slots();
        for (int g = 0; g < plan_.num_groups(); g++) {
            Tensors p = params_gathered(g, how);
            const auto& tensors = plan_.group(g).tensors;
            for (size_t i = 0; i < tensors.size(); i++)
                Backend::download_fp32(host + tensors[i].slice.offset, p[i], tensors[i].slice.n);
        }
        invalidate_slots();
    }

    // Starts summing group g's gradients over ranks, piece by piece through its slot's
    // buffers: all-reduced in the full gradient, reduce-scattered from it, or reduce-scattered
    // from the micro-step's bucket, as the policy says.
    void reduce_group(int g) {
        reduced_[g] = 1;
        const bool last_of_step = policy_.reduces_once_per_step() || last_micro_step_;
        if (policy_.all_reduces() && comm_.world() == 1) {  // nothing to sum: final as it is
            if (last_of_step) offload_final_grads(g);
            return;
        }
        Slot& slot = slot_of(g);
        for (Slot& other : slots_) gather_across(other);  // each int8 across a group of compute ago
        pieces_.for_each(g, [&](const Piece& p) {
            finish_reduce(slot);  // the slot's piece before
            if (policy_.shards_grads) pieces_.pack(slot.rank_major, slot.bucket, group_offset, p);
            else pieces_.pack(slot.rank_major, grads_full_, full_offset, p);
            comm_.note(Communicator::Event::NextCollectiveMoves, g);
            if (int8_.reduces_int8(p)) slot.reduce = InFlight::quantized(p, int8_.start_reduce(slot.int8, slot.rank_major, p));
            else if (policy_.all_reduces()) slot.reduce = InFlight::exact(p, comm_.all_reduce_async(slot.rank_major, p.size(), dtype_));
            else slot.reduce = InFlight::exact(p, comm_.reduce_scatter_async(slot.rank_major, slot.my_piece, p.size(), dtype_));
            slot.reduce.last_of_step = last_of_step;
        });
    }
    // The slot's reduce, if any, finished (its across before it, whose buffers it may take), and
    // its result put where the optimizer reads it: back into the full gradient (all-reduced),
    // into this rank's chunks of it (reduce-scattered from it), added into the gradient shard
    // (from a bucket). With replicas, the step's last reduce of a piece then starts its across:
    // in the shard, or at stage 1 in a buffer of its own, so that the slot's next reduce-scatter
    // need not wait for it.
    void finish_reduce(Slot& slot) {
        const int final_across = finish_across(slot);
        int final_here = -1;
        InFlight& r = slot.reduce;
        if (r.active()) {
            comm_.wait(r.ticket);
            const Piece p = r.piece;
            if (r.int8) int8_.finish_reduce(slot.my_piece, slot.int8, p);
            const bool across = replicas_ && r.last_of_step && !policy_.all_reduces();
            if (policy_.all_reduces()) {
                pieces_.unpack(grads_full_, slot.rank_major, full_offset, p);
            } else if (!policy_.shards_grads) {
                if (across) std::swap(slot.my_piece, slot.across_piece);
                else pieces_.copy_from_my_piece(slot.my_piece, p, [&](const PartitionPlan::Tensor& t) { return grad_of(t); });
            } else {
                Backend::accumulate(grads_shard_ + plan_.group(p.group).shard_offset + p.lo, slot.my_piece, p.size());
            }
            if (across) start_across(slot, p);
            else if (r.last_of_step && p.hi == plan_.group(p.group).shard_size) final_here = p.group;
            r = {};
        }
        offload_final_grads(final_across);  // at most one of the two is a group
        offload_final_grads(final_here);
    }
    // the values of piece p of the gradient shard that the slot all-reduces across groups
    floatX* across_values(Slot& slot, const Piece& p) const {
        return policy_.shards_grads ? grads_shard_ + plan_.group(p.group).shard_offset + p.lo : slot.across_piece;
    }
    void start_across(Slot& slot, const Piece& p) {
        floatX* values = across_values(slot, p);
        replicas_->note(Communicator::Event::NextCollectiveMoves, p.group);
        if (int8_.across_int8(p)) slot.across = InFlight::quantized(p, int8_.start_across(slot.int8, values, p));
        else slot.across = InFlight::exact(p, replicas_->all_reduce_async(values, p.size(), dtype_));
    }
    // an int8 across in its first half: waited for, and its second half started
    void gather_across(Slot& slot) {
        InFlight& a = slot.across;
        if (!a.active() || !a.int8 || a.gathering) return;
        replicas_->wait(a.ticket);
        replicas_->note(Communicator::Event::NextCollectiveMoves, a.piece.group);
        a.ticket = int8_.gather_across(slot.int8, across_values(slot, a.piece), a.piece);
        a.gathering = true;
    }
    // The slot's across, if any, finished (int8: both halves), at stage 1 the piece then copied
    // into this rank's chunks of the full gradient; returns the group it made final, else -1
    int finish_across(Slot& slot) {
        gather_across(slot);
        InFlight& a = slot.across;
        if (!a.active()) return -1;
        replicas_->wait(a.ticket);
        const Piece p = a.piece;
        if (a.int8) int8_.finish_across(across_values(slot, p), slot.int8, p);
        if (!policy_.shards_grads) pieces_.copy_from_my_piece(slot.across_piece, p, [&](const PartitionPlan::Tensor& t) { return grad_of(t); });
        a = {};
        return p.hi == plan_.group(p.group).shard_size ? p.group : -1;
    }
    // group g's gradient is final for the step (g < 0: none is): offloaded, it leaves for the
    // host now, on the transfer stream, while the backward goes on
    void offload_final_grads(int g) {
        if (g < 0 || host_ == nullptr) return;
        comm_.note(Communicator::Event::GradsToHost, g);
        host_->send_grads(g, grads_base());
    }

    // After the update (stages 1-2): starts gathering every rank's new chunks of group g into
    // the full parameters, piece by piece through its slot's buffers; a slot's piece before is
    // finished first, so packing one overlaps the transfer of the one before.
    void start_gather_updated(int g) {
        Slot& slot = slot_of(g);
        pieces_.for_each(g, [&](const Piece& p) {
            finish_gather_updated(slot);
            pieces_.copy_to_my_piece(slot.my_piece, p, [&](const PartitionPlan::Tensor& t) { return param_of(t); });
            slot.updated = InFlight::exact(p, comm_.all_gather_async(slot.my_piece, slot.rank_major, p.size(), dtype_));
        });
    }
    // the slot's gather of updated parameters, if any, waited for and unpacked into the full parameters
    void finish_gather_updated(Slot& slot) {
        if (!slot.updated.active()) return;
        comm_.wait(slot.updated.ticket);
        pieces_.unpack(params_full_, slot.rank_major, full_offset, slot.updated.piece);
        slot.updated = {};
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
    floatX* param_at(const CheckpointRun& r) const { return policy_.shards_params ? params_shard_ + r.shard : params_full_ + r.flat; }
    // where array a (m, v, master) is held: on the host when offloaded (else null), else in backend memory
    float* host_state(CheckpointArray a) const {
        if (!host_) return nullptr;
        return a == CheckpointArray::AdamM ? host_->m() : a == CheckpointArray::AdamV ? host_->v() : host_->master();
    }
    float* device_state(CheckpointArray a) const { return a == CheckpointArray::AdamM ? adam_m_ : a == CheckpointArray::AdamV ? adam_v_ : master_; }
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
    void for_each_owned(F f) const {
        for (int g = 0; g < plan_.num_groups(); g++)
            for (const auto& t : plan_.group(g).tensors) {
                size_t len = PartitionPlan::unpadded(t, rank_);
                if (len > 0) f(t, len);
            }
    }

    ZeroPolicy policy_;
    std::unique_ptr<ShardGroups> own_shard_groups_;  // null when the caller made them
    const ShardGroups& shard_groups_;
    Communicator& comm_;         // this rank's shard group: the collectives of the stage
    Communicator* replicas_;     // the ranks holding the same shard in the other groups (null: none)
    DType dtype_;
    PartitionPlan plan_;
    int rank_;  // which chunk this rank owns (0 at stage 0: it owns everything)
    Pieces<Backend> pieces_;
    bool master_in_state_;
    ZeroMemory memory_;
    Allocations<Backend> owned_;
    QuantizedExchange<Backend> int8_;
    floatX *params_full_ = nullptr, *grads_full_ = nullptr;    // unsharded, in the flat layout
    floatX *params_shard_ = nullptr, *grads_shard_ = nullptr;  // this rank's chunks, in shard layout
    float *master_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr, *norm_acc_ = nullptr;  // in backend memory
    std::unique_ptr<HostOptimizer<Backend>> host_;  // offloaded: the optimizer state instead
    // the optimizer's table of this rank's shard (kernels/shard_table.h): its entries, and the
    // table the launches take (the entries in host and in backend memory)
    std::vector<ShardTensor> optimizer_entries_;
    ShardTable optimizer_table_;
    Slot slots_[kSlots];
    std::vector<char> reduced_;  // per group: its reduction of this step has started (stages 0-1)
    std::vector<char> zeroed_;   // per group: no grads_done since its gradients were zeroed
    bool last_micro_step_ = false;  // begin_micro_step(true) until the norm is taken
    int prefetch_misses_ = 0;
};
