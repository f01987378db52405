// GPT-2 training: the story of a run, from the flags to the last checkpoint, and main(). The
// model is model/gpt2.h's (its shape and parameter layout model/shape.h's), the flags
// train/flags.h's; kernels come from a backend (kernels/cpu_backend.h, and
// kernels/cuda_backend.cuh when built with nvcc); who holds which parameters, gradients and
// optimizer state across ranks is zero/'s business, driven from train_step() once per
// micro-step. Everything here runs the same on both backends.
#include <omp.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/io.h"
#include "common/watchdog.h"
#include "data/checkpoint.h"
#include "data/dataloader.h"
#include "data/tokenizer.h"
#include "kernels/allocations.h"
#include "kernels/cpu_backend.h"
#include "model/gpt2.h"
#include "model/shape.h"
#include "train/flags.h"
#include "train/hellaswag_eval.h"
#include "train/loss_sum.h"
#include "train/memory_plan.h"
#include "train/nonfinite.h"
#include "train/outlier_detector.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/sharded_checkpoint.h"
#include "train/state_file.h"
#include "zero/comm.h"
#include "zero/zero.h"
#ifdef __CUDACC__
#include "kernels/cuda_backend.cuh"
#endif
#ifndef NO_MPI
#include "zero/comm_mpi.h"
#ifdef __CUDACC__
#include "zero/comm_nccl.h"
#endif
#else
#include "zero/comm_single.h"
#endif

// learning rate at step (0-based) of max_steps
inline float learning_rate(const TrainConfig& cfg, int step, int max_steps) {
    if (step < cfg.warmup) return cfg.lr * (step + 1) / cfg.warmup;
    const float lr_min = cfg.lr * cfg.final_lr_frac;
    const float progress = max_steps > cfg.warmup ? (float)(step - cfg.warmup) / (max_steps - cfg.warmup) : 0.0f;
    if (cfg.schedule == "constant") return cfg.lr;
    if (cfg.schedule == "linear") return cfg.lr - progress * (cfg.lr - lr_min);
    if (cfg.schedule == "cosine") return lr_min + 0.5f * (1.0f + cosf((float)M_PI * progress)) * (cfg.lr - lr_min);
    // wsd: warmup, stable at the peak, then a linear decay over the last wsd_decay_frac of steps
    const float decay_start = 1.0f - cfg.wsd_decay_frac;
    if (progress <= decay_start || cfg.wsd_decay_frac == 0.0f) return cfg.lr;
    return cfg.lr - (progress - decay_start) / cfg.wsd_decay_frac * (cfg.lr - lr_min);
}

// ----------------------------------------------------------------------------
// training

struct StepRecord {  // no padding, so records compare with memcmp
    float loss, norm, lr;
    int skipped;            // the update was skipped: 0 it was not, kSkipOutlier (-sl, -sg), kSkipNonFinite
    double loss_z, grad_z;  // NaN while the outlier windows fill, and for a non-finite step
};

// the process's exit code after train(): a run that ends on a non-finite step stopped for it
inline int exit_status(const std::vector<StepRecord>& records) {
    return !records.empty() && records.back().skipped == kSkipNonFinite ? kExitNonFinite : 0;
}
template <class Backend>
using StepHook = std::function<void(int step, Zero<Backend>& zero)>;

inline uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

// Every rank must train the same model on the same data with the same flags: rank 0's hash of
// `mine` is compared everywhere, and a mismatch stops every rank with a message, not a hang.
inline void check_same_as_rank_0(Communicator& comm, const std::string& mine_text) {
    uint64_t mine = fnv1a(mine_text), root = mine;
    comm.broadcast_host(&root, sizeof(root), 0);
    bool differs = root != mine;
    if (comm.all_reduce_host(differs ? 1.0 : 0.0) == 0.0) return;
    if (differs)
        fprintf(stderr, "error: rank %d: flags, model or data differ from rank 0's (hash %016llx, rank 0 has %016llx); every rank must get the same\n",
                comm.rank(), (unsigned long long)mine, (unsigned long long)root);
    else
        fprintf(stderr, "error: rank %d: another rank's flags, model or data differ from rank 0's\n", comm.rank());
    comm.barrier();  // every rank has printed
    comm.abort(1);
}
// The flags, compared before any collective that depends on one (-b auto's): ranks that differ
// would otherwise meet in different collectives and wait there.
inline void check_flags_agree(Communicator& comm, const TrainConfig& cfg) {
    std::string s;
    for (const Flag& f : kFlags) {
        if (f.field == offsetof(TrainConfig, process_rank)) continue;  // differs by design
        const char* field = (const char*)&cfg + f.field;
        if (f.kind == 's') s += *(const std::string*)field;
        else if (f.kind == 'i') s += std::to_string(*(const int*)field);
        else if (f.kind == 'l') s += std::to_string(*(const long*)field);
        else {
            char exact[32];
            snprintf(exact, sizeof(exact), "%.9g", *(const float*)field);  // every float bit counts
            s += exact;
        }
        s += '\n';
    }
    check_same_as_rank_0(comm, s);
}
// Then what the flags name: the model, the data, and the contents of the files each rank reads
// itself (flag_files: --gemm-algos's table)
inline void check_model_and_data_agree(Communicator& comm, const GPT2Config& mc, const DataLoader& data, bool have_tokenizer,
                                       const std::string& flag_files) {
    std::string s = std::to_string(mc.num_layers) + ' ' + std::to_string(mc.channels) + ' ' + std::to_string(mc.vocab_size) + ' ' +
                    std::to_string(mc.max_seq_len);
    for (size_t n : data.sizes()) s += ' ' + std::to_string(n);
    s += have_tokenizer ? " tok" : " notok";
    s += flag_files;
    check_same_as_rank_0(comm, s);
}

// mean loss of this rank's first `batches` batches from `data`, summed in `sum` (left at zero)
template <class Backend>
double validation_loss(GPT2<Backend>& model, DataLoader& data, int batches, int B, int T, LossSum<Backend>& sum) {
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    data.reset();
    for (int i = 0; i < batches; i++) {
        data.next_batch(inputs.data(), targets.data());
        model.forward(inputs.data(), targets.data(), B, T, 0.0f);
        sum.add_batch_mean(model.device_losses(), B * T);
    }
    return sum.take() / batches;
}

// n tokens sampled one by one after an end-of-text token, from the model's softmax; rng is an
// xorshift state, so every rank draws the same tokens
template <class Backend>
std::string sample_text(GPT2<Backend>& model, const Tokenizer& tokenizer, int n, int T, uint64_t* rng) {
    const int V = model.config().vocab_size;
    std::vector<int> tokens(T, tokenizer.eot());
    std::vector<float> probs(V);
    std::string text;
    for (int t = 1; t <= n; t++) {
        model.forward(tokens.data(), nullptr, 1, t, 0.0f);
        model.logits_at(t - 1, probs.data());
        const float maxval = *std::max_element(probs.begin(), probs.end());
        double sum = 0.0;
        for (float& x : probs) sum += (x = expf(x - maxval));  // unnormalised: the coin scales instead
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        double coin = (*rng >> 11) * (1.0 / 9007199254740992.0) * sum, cdf = 0.0;
        int next = V - 1;
        for (int v = 0; v < V; v++)
            if ((cdf += probs[v]) > coin) {
                next = v;
                break;
            }
        tokens[t] = next;
        text += tokenizer.printable(next);
    }
    return text;
}

// One line for each llm.c flag given that this backend cannot act on, so none is silently ignored.
template <class Backend>
void note_inapplicable_flags(const TrainConfig& cfg) {
    if (given(cfg, "-w") && !Backend::params_narrower_than_fp32)
        printf("note: -w: the %s backend's parameters are fp32 already, so there are no separate master weights\n", Backend::name);
    if (given(cfg, "-f")) printf("note: -f: this trainer's matmuls never use TF32 (fp32 stays fp32), so there is nothing to switch\n");
    if (given(cfg, "-ge")) printf("note: -ge: GELU runs inside the matmuls in the bf16 CUDA build wherever cuBLASLt offers it, as its own kernel elsewhere, whatever -ge says\n");
    if (given(cfg, "-pg")) printf("note: -pg: each rank takes a GPU by its rank on the node (from mpirun), not from -pg\n");
    if (given(cfg, "-ps") || given(cfg, "-pf")) printf("note: -ps/-pf: used by llm.c's tcp/fs start only; ranks here meet through mpirun\n");
    if (cfg.shard_group != "all" && cfg.zero_stage == 0)
        printf("note: --shard-group: stage 0 shards nothing (every rank holds everything); gradients are all-reduced over all ranks\n");
}

// --fp8 where this backend cannot run it (a GPU before sm_89, a build without the fp8 path): one
// line and exit 2
template <class Backend>
void check_fp8_flag(const TrainConfig& cfg) {
    if (cfg.fp8 == "none") return;
    const std::string why = Backend::fp8_refusal();
    if (!why.empty()) fatal(2, "--fp8 %s: %s", cfg.fp8.c_str(), why.c_str());
}

// A usage error that every rank finds alike (after check_flags_agree): said once, by rank 0, and
// the job ends with code 2
[[noreturn]] inline void usage_error_everywhere(Communicator& comm, const std::string& line) {
    if (comm.rank() == 0) fatal(2, "%s", line.c_str());
    comm.barrier();  // rank 0's error ends every rank
    exit(2);
}

// Linear warmup when -u is not given: none from a checkpoint (llm.c's default, whose runs start
// from pretrained weights), 2/(1-beta2) steps from random weights, the untuned warmup that Ma &
// Yarats (2021, "On the adequacy of untuned warmup for adaptive optimization") find enough for
// Adam's second moment to settle (40 steps at beta2 = 0.95): without it a random d12 at lr 3e-4
// takes steps sized by a v estimated from a handful of gradients, and its loss jumps.
inline int default_warmup(bool from_random, float beta2) {
    return from_random ? (int)lround(2.0 / (1.0 - (double)beta2)) : 0;
}

// -y 1: the step of rank 0's latest complete checkpoint in -o (0: none, or not resuming), for
// every rank, so that no rank starts from other weights than the rest. Every rank then checks it
// can read that checkpoint: with -o on a disk of each node's own, the others would not see what
// rank 0 wrote. A collective.
inline int agreed_resume_step(Communicator& comm, const TrainConfig& cfg) {
    int step = comm.rank() == 0 && cfg.resume ? latest_checkpoint(cfg.output_dir) : 0;
    comm.broadcast_host(&step, sizeof(step), 0);
    for (const char* kind : {"model", "state"}) {
        const std::string path = checkpoint_path(cfg.output_dir, kind, step);
        if (step > 0 && access(path.c_str(), R_OK) != 0)
            fatal(1, "-y 1: rank %d on %s cannot read %s (%s), the checkpoint of step %d that rank 0 resumes from; -y 1 needs the output "
                     "directory (-o) on a file system every rank reads",
                  comm.rank(), host_name().c_str(), path.c_str(), strerror(errno), step);
    }
    return step;
}

// What the flags make of a run on `world` ranks whose nodes hold `node_ranks` each (0: the nodes
// differ), resuming at `resume_step` (0: not): the model and where its weights come from, T, the
// shard group, and what of zero/'s flags this world cannot do. Reads a checkpoint's header at
// most. The run and --plan both start from it.
struct ResolvedRun {
    GPT2Config model;
    std::string weights;       // the checkpoint the weights come from ("": random)
    bool from_random = false;  // -e names a shape, not a checkpoint (the default warmup's question)
    int T = 0;
    int shard_group = 0;       // ranks per shard group (shard_group_ranks(); 0: one group)
    std::string zero_flags_error;  // one line, "" when zero/'s flags can all be done
};
inline ResolvedRun resolve_run(const TrainConfig& cfg, bool on_gpu, int world, int node_ranks, int resume_step) {
    ResolvedRun r;
    r.from_random = config_from_descriptor(cfg.init, &r.model);
    r.weights = resume_step > 0 ? checkpoint_path(cfg.output_dir, "model", resume_step) : r.from_random ? "" : cfg.init;
    if (!r.weights.empty()) r.model = checkpoint_config(r.weights);
    r.T = cfg.T > 0 ? cfg.T : default_seq_len(on_gpu);
    if (r.T > r.model.max_seq_len) fatal(2, "-t %d: expected 1..%d (the model's maxT)", r.T, r.model.max_seq_len);
    r.zero_flags_error = zero_flags_error(cfg, world, node_ranks);
    r.shard_group = r.zero_flags_error.empty() ? shard_group_ranks(cfg, world, node_ranks) : 0;
    return r;
}

// -d's tokens per step as micro-steps of B*T tokens on each rank; one line and exit 2 where they
// do not divide it (0: one micro-step)
inline int accumulation_steps(long total_batch, int B, int T, int world) {
    const long per_micro = (long)B * T * world;
    if (total_batch > 0 && total_batch % per_micro != 0) fatal(2, "-d %ld: expected a multiple of B*T*ranks = %ld", total_batch, per_micro);
    return total_batch > 0 ? (int)(total_batch / per_micro) : 1;
}

// the flags and model that decide a rank's memory (train/memory_plan.h)
// (shard_group: ranks per shard group, shard_group_ranks(); 0: one group)
inline RunShape run_shape(const TrainConfig& cfg, const GPT2Config& mc, int B, int T, int world, int shard_group) {
    GPT2Config unused;
    const bool loads_file = !config_from_descriptor(cfg.init, &unused), saves = !cfg.output_dir.empty();
    return {mc, B, T, world, cfg.zero_stage, cfg.recompute, cfg.offload == "cpu", cfg.master_weights == 1, shard_group,
            cfg.quantize_weights == "int8", cfg.quantize_grads == "int8", cfg.fp8 == "e4m3", saves || loads_file,
            saves && cfg.async_checkpoint == 1};
}

// ----------------------------------------------------------------------------
// the run

// Everything a run holds, made from the flags: the model and its ZeRO state, the data, the evals,
// the log, and where the run is. train() below is its story.
template <class Backend>
struct Run {
    TrainConfig cfg;  // the flags, with the defaults that depend on the run filled in (-u)
    Communicator& comm;
    int rank, world;
    bool prints_run;  // this rank prints the run's lines: rank 0, unless --quiet
    GPT2Config mc;
    int B, T, resume_step = 0, max_steps = 0, accum = 1, val_batches = 0;
    int shard_group = 0;  // ranks per shard group (--shard-group, shard_group_ranks(); 0: one group of every rank)
    Communicator::NodeRanks node;  // how the ranks sit on nodes
    size_t gemm_table_shapes = 0;  // GEMM shapes whose algorithm the --gemm-algos table names
    long total_batch = 0;
    std::unique_ptr<DataLoader> train_data, val_data;
    std::unique_ptr<HellaSwag> hellaswag;
    std::unique_ptr<Tokenizer> tokenizer;
    std::unique_ptr<ShardGroups> shard_groups;  // --shard-group's communicators (null: one group)
    std::unique_ptr<Zero<Backend>> zero;        // after shard_groups: it holds a reference to them
    std::unique_ptr<GPT2<Backend>> model;  // after zero: it holds a reference to it
    std::unique_ptr<CheckpointWriter<Backend>> checkpoints;  // after zero, likewise
    RunShape shape;  // what decides this rank's memory
    LossSum<Backend> train_loss, eval_loss;  // kLossSums of them
    // a micro-step's forward and backward as a CUDA graph (--cuda-graph): one for a step's first
    // micro-step, whose gradients start from zero (cuBLASLt then writes the bias gradients), one for
    // the others. Only where no collective or host transfer runs inside them: one rank at stage 0
    // (whose reductions are then nothing; stage 1's reduce-scatter goes through the communicator),
    // nothing offloaded.
    typename Backend::CapturedWork micro_step_graphs[2];
    bool graphs_apply() const { return cfg.cuda_graph == 1 && world == 1 && cfg.zero_stage == 0 && cfg.offload == "none"; }
    uint64_t sample_rng;
    OutlierDetector loss_z, grad_z;
    NonFiniteSteps nonfinite;
    FILE* log = nullptr;
    std::vector<int> inputs, targets;

    Run(const TrainConfig& flags, Communicator& c)
        : cfg(flags), comm(c), rank(c.rank()), world(c.world()), prints_run(c.rank() == 0 && !flags.quiet), B(flags.B), T(flags.T),
          sample_rng((uint64_t)flags.seed * 2654435761u + 1), nonfinite(flags.nonfinite_limit) {
        watchdog().set_timeout(cfg.collective_timeout);
        watchdog().set_rank(rank);
        watchdog().set_activity("the run's start");
        if (cfg.num_processes > 0 && cfg.num_processes != world) fatal(2, "-pn %d: mpirun started %d rank(s)", cfg.num_processes, world);
        if (cfg.process_rank >= 0 && cfg.process_rank != rank) fatal(2, "-pr %d: mpirun made this rank %d", cfg.process_rank, rank);
        const std::string& dir = cfg.output_dir;
        if (cfg.resume && dir.empty()) fatal(2, "-y 1 needs the output directory (-o) that holds the checkpoints");
        check_flags_agree(comm, cfg);
        check_fp8_flag<Backend>(cfg);
        if (rank == 0 && !dir.empty()) {
            mkdir(dir.c_str(), 0755);
            remove_partial_writes(dir);
        }
        resume_step = agreed_resume_step(comm, cfg);
        if (cfg.resume && resume_step == 0 && prints_run) printf("-y 1: no complete checkpoint in %s, starting fresh\n", dir.c_str());
        // every rank asks for its node, whatever its flags, so that none waits in that collective
        // alone; what zero/'s flags ask that cannot be done is said once the ranks agree on them
        node = comm.node_ranks();
        ResolvedRun resolved;  // what is wrong with the checkpoint's header (or -t) said once
        rank_0_first(comm, [&] { resolved = resolve_run(cfg, !Backend::device_is_host, world, node.per_node, resume_step); });
        mc = resolved.model;
        T = resolved.T;
        shard_group = resolved.shard_group;
        // the shard groups' communicators, and what they take on first use, before the memory is read
        if (resolved.zero_flags_error.empty() && cfg.zero_stage > 0 && shard_group > 0) {
            shard_groups = std::make_unique<ShardGroups>(comm, shard_group);
            shard_groups->group().warm_up();
            if (shard_groups->replicas()) shard_groups->replicas()->warm_up();
        }
        size_memory();  // before the model's parameters take their memory
        if (cfg.warmup < 0) cfg.warmup = default_warmup(resolved.from_random, cfg.beta2);
        inputs.resize((size_t)B * T);
        targets.resize((size_t)B * T);

        train_data = std::make_unique<DataLoader>(cfg.train_data, B, T, rank, world, mc.vocab_size);
        if (cfg.shuffle) train_data->shuffle((uint64_t)cfg.seed);
        if (cfg.val_every > 0) val_data = std::make_unique<DataLoader>(cfg.val_data, B, T, rank, world, mc.vocab_size);
        val_batches = !val_data ? 0 : cfg.val_steps > 0 ? cfg.val_steps : (int)std::max<size_t>(1, val_data->windows() / world);
        if (cfg.hellaswag) hellaswag = std::make_unique<HellaSwag>(cfg.hellaswag_file, mc.vocab_size, B, T, rank, world);
        accum = accumulation_steps(cfg.total_batch, B, T, world);
        total_batch = (long)B * T * world * accum;
        max_steps = cfg.max_steps > 0 ? cfg.max_steps : (int)std::max<long>(1, (long)train_data->total_tokens() / total_batch);
        open_tokenizer();
        const GemmChoices gemm_choices = cfg.gemm_algos.empty() ? GemmChoices{} : read_gemm_choices(cfg.gemm_algos);
        check_model_and_data_agree(comm, mc, *train_data, tokenizer != nullptr, cfg.gemm_algos.empty() ? "" : format_gemm_choices(gemm_choices));
        // the ranks agree on the flags: what they ask is said once, if it cannot be done
        if (!resolved.zero_flags_error.empty()) usage_error_everywhere(comm, resolved.zero_flags_error);
        if (resume_step > max_steps)
            usage_error_everywhere(comm, "-y 1: the latest checkpoint in " + dir + " is of step " + std::to_string(resume_step) + ", past this run's " +
                                             std::to_string(max_steps) + " steps; give -x " + std::to_string(resume_step) + " or more, or another -o");
        if (!cfg.gemm_algos.empty()) {  // before the first GEMM
            const std::string differs = Backend::use_gemm_choices(gemm_choices);
            if (!differs.empty()) fatal(2, "--gemm-algos %s: %s", cfg.gemm_algos.c_str(), differs.c_str());
            gemm_table_shapes = gemm_choices.algorithm.size();
        }
        shape = run_shape(cfg, mc, B, T, world, shard_group);
        Backend::reserve(GPT2<Backend>::op_shapes(mc, B, T));
        zero = make_zero<Backend>(shape, comm, shard_groups.get());
        if (resolved.weights.empty()) zero->load(random_init(mc, (uint64_t)cfg.seed).data());
        else load_params(*zero, comm, resolved.weights, mc);
        checkpoints = std::make_unique<CheckpointWriter<Backend>>(comm, *zero, mc, shape.async_checkpoint);
        model = make_model<Backend>(shape, *zero);
        if (resume_step > 0) restore_state(checkpoint_path(dir, "state", resume_step));
        print_setup();
        // a resumed run appends, after dropping what the interrupted one logged past its checkpoint
        if (rank == 0 && !dir.empty()) {
            if (resume_step > 0) truncate_log(dir + "/main.log", resume_step);
            log = open_file(dir + "/main.log", resume_step > 0 ? "a" : "w");
        }
    }
    ~Run() {
        if (log) fclose(log);
    }
    // what this rank holds, by category, as its objects count it
    MemoryUse memory() const { return memory_use(*zero, *model, Backend::memory(), shape); }

private:
    // text samples need the tokenizer; without it (or with another vocabulary) there are none
    void open_tokenizer() {
        if (cfg.sample_every <= 0) return;
        if (FILE* tf = fopen(cfg.tokenizer.c_str(), "rb")) {
            fclose(tf);
            tokenizer = std::make_unique<Tokenizer>(cfg.tokenizer);
            if (tokenizer->vocab_size() != mc.vocab_size) {
                if (prints_run) printf("tokenizer has %d tokens but the model %d: no text samples\n", tokenizer->vocab_size(), mc.vocab_size);
                tokenizer.reset();
            }
        } else if (prints_run) {
            printf("no tokenizer at %s: no text samples\n", cfg.tokenizer.c_str());
        }
    }
    // -b auto (with -d, a B that divides it, so accumulation keeps it), and whether this rank's
    // memory fits, from the run's plan (train/memory_plan.h), before anything large is
    // allocated: one line and exit 1 when it does not
    void size_memory() {
        check_offload_flags(cfg, Backend::params_narrower_than_fp32);
        const Planner plan = plan_memory<Backend>;
        // read before check_host_memory's collective, which no rank passes (to allocate) before
        // every rank has read it
        const size_t host_available = host_memory_available();
        const MemoryBudget budget = memory_budget<Backend>(cfg.device_memory, ranks_sharing_memory());
        RunShape shape = run_shape(cfg, mc, B, T, world, shard_group);
        if (B == kAutoBatch) {  // the largest B that fits every rank
            shape.B = min_over_ranks(comm, auto_micro_batch(plan, shape, budget, cfg.total_batch));
            if (shape.B == 0) {
                shape.B = 1;
                if (rank != 0) comm.barrier();  // rank 0 says why and ends the job
                fatal(1, "-b auto: not even B=1 fits: %s", does_not_fit_words(plan, shape, rank, budget, offload_allowed(cfg, Backend::params_narrower_than_fp32)).c_str());
            }
            if (prints_run) printf("%s\n", auto_batch_words(plan, shape, budget, cfg.total_batch).c_str());
            B = shape.B;
        }
        const MemoryUse mine = plan(shape, rank);
        check_host_memory(mine, shape, host_available);
        if (!fits(mine, budget)) fatal(1, "%s", does_not_fit_words(plan, shape, rank, budget, offload_allowed(cfg, Backend::params_narrower_than_fp32)).c_str());
    }

    // The ranks of a node share its host memory: what they need there (the host categories) is
    // summed by node (by host name), and every rank learns every node's verdict; the first rank
    // of the first node where it does not fit says why, and the job ends. (On the CPU backend the
    // budget below holds the host categories too; this says what of them is the host's.) A
    // collective.
    void check_host_memory(const MemoryUse& mine, const RunShape& shape, size_t available) {
        struct Need {
            uint64_t node, bytes, available;
        };
        const std::vector<Need> all = gather_everywhere(comm, Need{std::hash<std::string>{}(host_name()), memory_total(mine, true), available});
        for (int first = 0; first < world; first++) {
            size_t node_bytes = 0;
            int node_ranks = 0, lowest = first;
            for (int r = 0; r < world; r++)
                if (all[r].node == all[first].node) node_bytes += all[r].bytes, node_ranks++, lowest = std::min(lowest, r);
            if (lowest != first || all[first].available == 0 || node_bytes <= all[first].available) continue;
            bool fits = false;
            if (rank == first) fatal(1, "%s", host_memory_words(mine, rank, node_bytes, node_ranks, shape, available, &fits).c_str());
            comm.barrier();  // that rank's error ends every rank
            exit(1);
        }
    }

    // How many of the run's ranks share this rank's memory: on a GPU the ranks whose GPU is this
    // rank's (by the GPUs' ids, however many devices each rank sees), on the CPU backend the
    // ranks of this node. A collective.
    int ranks_sharing_memory() {
        if constexpr (Backend::device_is_host) return node.here;
        else return ranks_sharing_gpu(gather_everywhere(comm, Backend::device_uuid()), rank);
    }

    void restore_state(const std::string& path) {
        const OptimizerState state = load_state(*zero, comm, path, resume_step, mc);
        sample_rng = state.sample_rng;
        train_data->restore(state.loader);
        if (!loss_z.restore(state.loss_z) || !grad_z.restore(state.grad_z)) fatal(1, "%s: outlier detector state out of range", path.c_str());
        if (prints_run) printf("resuming from step %d of %s\n", resume_step, cfg.output_dir.c_str());
    }
    // hybrid sharding, for the setup line: "" with one group
    std::string shard_groups_said() const {
        if (shard_group == 0) return "";
        return " in " + std::to_string(world / shard_group) + " groups of " + std::to_string(shard_group) + " rank(s), one replica each";
    }
    void print_setup() const {
        if (prints_run) {
            printf("model: L=%d NH=%d C=%d V=%d (padded %d) maxT=%d, %zu parameters\n", mc.num_layers, mc.num_heads, mc.channels,
                   mc.vocab_size, mc.padded_vocab_size, mc.max_seq_len, zero->plan().total());
            printf("backend %s, %d rank(s), ZeRO stage %d%s | B=%d T=%d, %ld tokens/step, %d accumulation step(s) | %d steps, warmup %d\n",
                   Backend::name, world, cfg.zero_stage, shard_groups_said().c_str(), B, T, total_batch, accum, max_steps, cfg.warmup);
            printf("train %zu tokens in %zu file(s)%s\n", train_data->total_tokens(), train_data->files().size(),
                   cfg.shuffle ? ", shuffled each epoch" : "");
#ifdef KERNELS_CANDIDATE
            printf("attention: %s\n", Backend::attention_kernels(mc.channels, mc.num_heads).c_str());
#endif
            note_inapplicable_flags<Backend>(cfg);
            if (!cfg.gemm_algos.empty())
                printf("GEMM algorithms: %s names %zu shape(s); the others run cuBLASLt's first\n", cfg.gemm_algos.c_str(),
                       gemm_table_shapes);
            if (cfg.quantize_weights != "none" && shard_group == 1)
                printf("note: --quantize-weights: a shard group of one rank gathers nothing, so nothing is quantized\n");
            if (cfg.quantize_grads != "none" && world == 1)
                printf("note: --quantize-grads: one rank reduces nothing, so nothing is quantized\n");
            if (cfg.fp8 != "none" && !fp8_gemm_shape(B * T, mc.channels, mc.channels))
                printf("note: --fp8: fp8 GEMMs need B*T and C multiples of %d (B*T=%d, C=%d): the matmuls run as without --fp8\n",
                       kFp8DimMultiple, B * T, mc.channels);
        }
        if (!cfg.quiet) printf("%s\n", memory_line(rank, memory()).c_str());
    }
};

// true at multiples of `period` (0: never)
inline bool every(int period, int step) { return period > 0 && step % period == 0; }

// The evaluations due after `step` updates, logged as s:<step>: validation every -v steps,
// HellaSwag every -v steps after the first, a text sample every -s steps after the first, and
// all of them after the last update. They share no state with training.
template <class Backend>
void evaluate_when_due(Run<Backend>& run, int step, bool last) {
    watchdog().set_activity("the evaluations after step " + std::to_string(step));
    const TrainConfig& cfg = run.cfg;
    GPT2<Backend>& model = *run.model;
    if (run.val_data && (every(cfg.val_every, step) || last)) {
        const double mine = validation_loss(model, *run.val_data, run.val_batches, run.B, run.T, run.eval_loss);
        const float val_loss = (float)(run.comm.all_reduce_host(mine) / run.world);
        if (run.prints_run) printf("val loss %.6f\n", val_loss);
        if (run.log) fprintf(run.log, "s:%d tel:%f\n", step, val_loss);
    }
    if (run.hellaswag && ((step > 0 && every(cfg.val_every, step)) || last)) {
        HellaSwagScore score = run.hellaswag->evaluate(model, run.comm);
        if (run.prints_run) printf("HellaSwag: %d/%d = %f\n", score.correct, score.total, score.accuracy());
        if (run.log) fprintf(run.log, "s:%d eval:%f\n", step, score.accuracy());
        if (run.rank == 0 && !cfg.hellaswag_dump.empty()) run.hellaswag->write_losses(cfg.hellaswag_dump, score);
    }
    if (run.tokenizer && ((step > 0 && every(cfg.sample_every, step)) || last)) {
        // every rank generates (stage 3 needs them all for the gathers); rank 0 prints
        std::string text = sample_text(model, *run.tokenizer, std::min(cfg.gen_len, run.T - 1), run.T, &run.sample_rng);
        if (run.prints_run) printf("generating:\n---\n%s\n---\n", text.c_str());
    }
}

// Update number step + 1: the micro-steps' forward and backward, then AdamW, unless the loss or
// the gradient norm is not finite (train/nonfinite.h) or an outlier (-sl, -sg; every rank sees
// the same two, so all skip or none).
template <class Backend>
StepRecord train_step(Run<Backend>& run, int step) {
    const TrainConfig& cfg = run.cfg;
    Zero<Backend>& zero = *run.zero;
    zero.zero_grads();
    run.model->take_nonfinite_fp8_amaxes();  // the evaluations' since the last step are not this step's
    const float dloss = 1.0f / ((float)run.B * run.T * run.accum * run.world);
    for (int micro = 0; micro < run.accum; micro++) {
        if (cfg.overfit) run.train_data->reset();
        run.train_data->next_batch(run.inputs.data(), run.targets.data());
        zero.begin_micro_step(micro == run.accum - 1);
        run.model->upload_batch(run.inputs.data(), run.targets.data(), run.B * run.T);
        auto forward_backward = [&] {
            run.model->forward_uploaded(true, run.B, run.T, dloss);
            run.train_loss.add_batch_mean(run.model->device_losses(), run.B * run.T);
            run.model->backward(run.B, run.T);
        };
        if (run.graphs_apply()) Backend::run_captured(run.micro_step_graphs[micro == 0 ? 0 : 1], forward_backward);
        else forward_backward();
    }
    StepRecord r{};
    // an fp8 cast that met an infinity or NaN saturated it away: the step is as non-finite as its
    // loss would otherwise have been (on every rank: the loss is summed over them)
    const unsigned nonfinite_amaxes = run.model->take_nonfinite_fp8_amaxes();
    const double loss = run.train_loss.take() / run.accum;
    r.loss = (float)(run.comm.all_reduce_host(nonfinite_amaxes > 0 ? NAN : loss) / run.world);
    r.lr = learning_rate(cfg, step, run.max_steps);
    r.norm = zero.grad_norm();
    if (!run.nonfinite.record(r.loss, r.norm)) {
        r.loss_z = r.grad_z = NAN;
        r.skipped = kSkipNonFinite;
        if (run.prints_run)
            printf("skipping update: loss %f, grad norm %f: not finite%s (%d step(s) in a row; the run stops at %d, --nonfinite-limit)\n",
                   r.loss, r.norm, nonfinite_amaxes > 0 ? ", an fp8 cast met an infinity or NaN on rank 0" : "", run.nonfinite.in_a_row(),
                   run.nonfinite.limit());
        return r;
    }
    r.loss_z = run.loss_z.update(r.loss, cfg.skip_loss_z);
    r.grad_z = run.grad_z.update(r.norm, cfg.skip_grad_z);
    const bool skip_loss = cfg.skip_loss_z > 0 && r.loss_z > cfg.skip_loss_z, skip_grad = cfg.skip_grad_z > 0 && r.grad_z > cfg.skip_grad_z;
    r.skipped = skip_loss || skip_grad ? kSkipOutlier : kNotSkipped;
    if (r.skipped) {
        if (run.prints_run) printf("skipping update due to %s z-score of %f\n", skip_loss ? "loss" : "grad", skip_loss ? r.loss_z : r.grad_z);
    } else {
        zero.update(AdamWStep{r.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, clip_scale(r.norm, cfg.grad_clip), step + 1,
                              (uint32_t)cfg.seed + 7919u * step});
    }
    return r;
}

// The step line and its main.log line (s:<step>, as llm.c numbers them: the update's index).
// MFU on the GPU: per rank, against one GPU's peak.
template <class Backend>
void report_step(const Run<Backend>& run, int step, const StepRecord& r, double ms, double elapsed) {
    const double tok_per_s = run.total_batch / (ms / 1000.0);
    if (run.prints_run) {
        char mfu[32] = "";
        if (strcmp(Backend::name, "cuda") == 0) {
            const double peak = peak_flops(Backend::device_name(), sizeof(typename Backend::floatX) == 2);
            const double flops = flops_per_token(run.zero->plan().total(), run.mc.num_layers, run.mc.channels, run.T) * (run.total_batch / run.world);
            if (peak > 0) snprintf(mfu, sizeof(mfu), " | MFU %.1f%%", 100.0 * flops / (ms / 1000.0) / peak);
            else snprintf(mfu, sizeof(mfu), " | MFU n/a");
        }
        printf("step %4d/%d | loss %.6f (%+.2fz) | norm %.4f (%+.2fz) | lr %.2e | %.2f ms | %.0f tok/s%s | elapsed %s | ETA %s\n",
               step + 1, run.max_steps, r.loss, r.loss_z, r.norm, r.grad_z, r.lr, ms, tok_per_s, mfu, format_duration(elapsed).c_str(),
               format_duration(eta_seconds(elapsed, step + 1 - run.resume_step, run.max_steps - step - 1)).c_str());
    }
    if (run.log) fprintf(run.log, "s:%d trl:%f norm:%f lr:%e ms:%f tok/s:%f\n", step, r.loss, r.norm, r.lr, ms, tok_per_s);
}

// bytes per collective, for the step line's companion
inline std::string bytes_said(const CommCounters& c) {
    char line[160];
    snprintf(line, sizeof(line), "all-reduce %llu | reduce-scatter %llu | all-gather %llu | all-to-all %llu", (unsigned long long)c.all_reduce,
             (unsigned long long)c.reduce_scatter, (unsigned long long)c.all_gather, (unsigned long long)c.all_to_all);
    return line;
}

// The checkpoint after `step` updates: model_N.bin (fp32 from an fp32 build, bf16 from a bf16
// one, as llm.c), state_N.bin (everything else -y 1 needs), then DONE_N, then the checkpoint
// -nk/-nm retire; every rank writes its own part (train/sharded_checkpoint.h), in the
// background with --async-checkpoint. A collective; the log reaches the disk first.
template <class Backend>
void save_checkpoint(Run<Backend>& run, int step, uint64_t sample_rng) {
    watchdog().set_activity("the checkpoint after step " + std::to_string(step));
    if (run.log) fflush(run.log);
    OptimizerState rest;  // the state but its arrays, which each rank writes its part of
    rest.step = step;
    rest.sample_rng = sample_rng;
    rest.loader = run.train_data->state();
    rest.loss_z = run.loss_z.state();
    rest.grad_z = run.grad_z.state();
    const TrainConfig& cfg = run.cfg;
    const int retire = checkpoint_to_delete(step, cfg.checkpoint_every, cfg.checkpoints_keep, cfg.major_every);
    run.checkpoints->save(cfg.output_dir, step, rest, retire);
}

// What a run says about its steps besides their records: each step's time and the step line
// (report_step), the first step's bytes moved, launches and memory, the second step's launches
// with CUDA graphs, the peak device memory at the end; and the profiler's window around the
// last step (Nsight Compute in scripts/bench_gpu.sh sees that step alone).
template <class Backend>
class StepTelemetry {
public:
    explicit StepTelemetry(const Run<Backend>& run) : run_(run), run_start_(std::chrono::steady_clock::now()) {}
    void before(int step) {
        Backend::synchronize();
        profiled_ = step + 1 == run_.max_steps;
        if (profiled_) Backend::profiler_start();
        start_ = std::chrono::steady_clock::now();
        run_.zero->reset_traffic();  // count this step's training traffic only
        launches_before_ = Backend::launches();
    }
    void after(int step, const StepRecord& r) {
        Backend::synchronize();
        if (profiled_) Backend::profiler_stop();
        const uint64_t launches = Backend::launches() - launches_before_;
        const auto now = std::chrono::steady_clock::now();
        report_step(run_, step, r, std::chrono::duration<double, std::milli>(now - start_).count(),
                    std::chrono::duration<double>(now - run_start_).count());
        if (step == run_.resume_step && !run_.cfg.quiet) first_step(launches);
        // the step after the first runs the micro-steps' graphs (the first ran without them)
        if (step == run_.resume_step + 1 && launches > 0 && run_.graphs_apply() && !run_.cfg.quiet)
            printf("rank %d kernel launches per step with CUDA graphs: %llu (a micro-step's forward and backward: one graph of %llu)\n",
                   run_.rank, (unsigned long long)launches, (unsigned long long)run_.micro_step_graphs[0].launches);
        peak_device_bytes_ = std::max(peak_device_bytes_, Backend::device_memory_in_use());
    }
    void finish() const {
        if (peak_device_bytes_ > 0 && !run_.cfg.quiet)
            printf("rank %d peak device memory in use after a step (every process on the GPU): %.2f MiB\n", run_.rank,
                   peak_device_bytes_ / 1048576.0);
    }

private:
    void first_step(uint64_t launches) const {
        const ZeroTraffic t = run_.zero->traffic();
        if (run_.zero->replica_count() == 1) printf("rank %d bytes moved per step: %s\n", run_.rank, bytes_said(t.inside).c_str());
        else
            printf("rank %d bytes moved per step: inside its group of %d: %s || across the %d groups: %s\n", run_.rank,
                   run_.zero->group_size(), bytes_said(t.inside).c_str(), run_.zero->replica_count(), bytes_said(t.across).c_str());
        if (launches > 0) printf("rank %d kernel launches per step: %llu\n", run_.rank, (unsigned long long)launches);
        if (const size_t taken = Backend::device_memory_taken())  // on a GPU: the buffers (as planned) against what the GPU lost
            printf("rank %d device memory after step 1: %.2f MiB in the run's buffers, %.2f MiB taken since the CUDA context was made, %.2f MiB in use on the GPU\n",
                   run_.rank, memory_total(run_.memory(), false) / 1048576.0, taken / 1048576.0, Backend::device_memory_in_use() / 1048576.0);
    }

    const Run<Backend>& run_;
    const std::chrono::steady_clock::time_point run_start_;
    std::chrono::steady_clock::time_point start_;
    bool profiled_ = false;
    uint64_t launches_before_ = 0;
    size_t peak_device_bytes_ = 0;  // on a GPU
};

// The story of a run, as llm.c tells it: for step 0..N, first what is due after `step` updates
// (evaluations, text sample, checkpoint; at N all of them), then stop at N, else one update.
// Returns each update's record; hook(step, zero) runs after each update (for tests).
template <class Backend>
std::vector<StepRecord> train(const TrainConfig& cfg, Communicator& comm, const StepHook<Backend>& hook = {}) {
    Run<Backend> run(cfg, comm);
    StepTelemetry<Backend> telemetry(run);
    std::vector<StepRecord> records;
    for (int step = run.resume_step;; step++) {
        const bool last = step == run.max_steps;
        // the checkpoint keeps the sampler as it was before this step's evaluations: a run
        // resumed here does them again (its log drops theirs), and must draw the same sample
        const uint64_t sample_rng_before = run.sample_rng;
        evaluate_when_due(run, step, last);
        const bool checkpoint_due = !run.cfg.output_dir.empty() && step > run.resume_step && (every(run.cfg.checkpoint_every, step) || last);
        if (checkpoint_due && run.nonfinite.in_a_row() == 0) save_checkpoint(run, step, sample_rng_before);
        else if (checkpoint_due && !last && run.prints_run) printf("no checkpoint at step %d: its last step was not finite\n", step);
        if (last && run.nonfinite.in_a_row() > 0 && run.rank == 0) run.nonfinite.print_stop(step, checkpoint_kept(run.cfg.output_dir));
        if (last) break;

        watchdog().set_activity("step " + std::to_string(step + 1));
        run.checkpoints->poll();  // an async save's parts, all durable: it completes
        telemetry.before(step);
        records.push_back(train_step(run, step));
        telemetry.after(step, records.back());
        if (hook) hook(step, *run.zero);
        if (run.nonfinite.limit_reached()) {
            if (run.rank == 0) run.nonfinite.print_stop(step + 1, checkpoint_kept(run.cfg.output_dir));
            break;
        }
    }
    run.checkpoints->finish();
    telemetry.finish();
    return records;
}

// Where mpirun placed this process, as it tells it before MPI starts (OpenMPI's variables; a
// process not started by mpirun is rank 0 of 1, alone on its node). Read only where MPI has not
// started: --plan, which runs without it, and what is done before MPI_Init.
struct LauncherPlace {
    bool by_mpirun = false;
    int rank = 0, world = 1, node_ranks = 1;
};
inline LauncherPlace launcher_place() {
    auto number = [](const char* name, int otherwise) {
        const char* v = getenv(name);
        return v != nullptr && atoi(v) > 0 ? atoi(v) : otherwise;
    };
    return {getenv("OMPI_COMM_WORLD_SIZE") != nullptr, number("OMPI_COMM_WORLD_RANK", 0), number("OMPI_COMM_WORLD_SIZE", 1),
            number("OMPI_COMM_WORLD_LOCAL_SIZE", 1)};
}

// --plan: the memory plan of the run the flags describe on -pn ranks (else as many as mpirun
// started, else one), printed by rank 0 alone, without MPI, data or model memory. `device_seen`:
// this backend's device is here to ask for its free memory (else --device-memory must say).
// On a GPU it plans for a GPU per rank; on the CPU backend the ranks mpirun put on this node
// share its memory (-pn's are elsewhere).
template <class Backend>
void print_memory_plan(TrainConfig cfg, bool device_seen) {
    const LauncherPlace place = launcher_place();
    if (place.rank != 0) return;
    const int world = cfg.num_processes > 0 ? cfg.num_processes : place.world;
    const int resume_step = cfg.resume && !cfg.output_dir.empty() ? latest_checkpoint(cfg.output_dir) : 0;
    const ResolvedRun resolved = resolve_run(cfg, !Backend::device_is_host, world, place.node_ranks, resume_step);
    check_offload_flags(cfg, Backend::params_narrower_than_fp32);
    check_fp8_flag<Backend>(cfg);
    if (!device_seen && cfg.device_memory.empty())
        fatal(2, "--plan --device %s: no GPU here to ask for its free memory; give --device-memory (e.g. 80GiB)", cfg.device.c_str());
    const Planner plan = plan_memory<Backend>;
    const int sharing = Backend::device_is_host && cfg.num_processes == 0 ? place.node_ranks : 1;
    const MemoryBudget budget = memory_budget<Backend>(cfg.device_memory, sharing);
    // --shard-group node: the ranks mpirun put on this node (-pn's are elsewhere: not known)
    if (cfg.shard_group == "node" && cfg.num_processes > 0 && cfg.zero_stage > 0)
        fatal(2, "--plan -pn %d --shard-group node: the plan cannot see how many ranks each node will hold; give the group size (--shard-group N)",
              cfg.num_processes);
    if (!resolved.zero_flags_error.empty()) fatal(2, "%s", resolved.zero_flags_error.c_str());
    RunShape shape = run_shape(cfg, resolved.model, cfg.B, resolved.T, world, resolved.shard_group);
    if (cfg.B == kAutoBatch) {
        shape.B = std::max(1, auto_micro_batch(plan, shape, budget, cfg.total_batch));
        printf("-b auto: B=%d\n", shape.B);
    }
    print_plan(plan, shape, accumulation_steps(cfg.total_batch, shape.B, shape.T, world), budget, offload_allowed(cfg, Backend::params_narrower_than_fp32), Backend::name, stdout);
    if (!Backend::device_is_host) {  // the host categories of the ranks mpirun put on this node, as mpirun places them
        const int node_ranks = std::min(place.node_ranks, world);
        const MemoryUse rank_0 = plan(shape, 0);
        size_t node_bytes = memory_total(rank_0, true);
        for (int r = 1; r < node_ranks; r++) node_bytes += memory_total(plan(shape, r), true);
        bool fits = true;
        printf("%s\n", host_memory_words(rank_0, 0, node_bytes, node_ranks, shape, host_memory_available(), &fits).c_str());
    }
}

// ----------------------------------------------------------------------------

#ifndef TESTING
// OpenMPI's mpirun binds a lone rank to one core, which would leave the other cores to idle: a rank alone
// on its node takes them all back (and one thread per core unless OMP_NUM_THREADS says otherwise).
static void use_all_cores_if_alone() {
    const LauncherPlace place = launcher_place();
    if (!place.by_mpirun || place.node_ranks != 1) return;  // not mpirun's binding, or not alone
    cpu_set_t all;
    CPU_ZERO(&all);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < cores && c < CPU_SETSIZE; c++) CPU_SET(c, &all);
    if (sched_setaffinity(0, sizeof(all), &all) == 0 && getenv("OMP_NUM_THREADS") == nullptr) omp_set_num_threads((int)cores);
}

int main(int argc, char** argv) {
    use_all_cores_if_alone();
    TrainConfig cfg = parse_args(argc, argv);
#ifdef __CUDACC__
    std::string no_cuda;  // CUDA's reason, when it finds no GPU
    bool use_cuda = cfg.device != "cpu" && CudaBackend::available(&no_cuda);
    if (cfg.plan) {  // a plan for a GPU may be made where there is none
        if (use_cuda || cfg.device == "cuda") print_memory_plan<CudaBackend>(cfg, use_cuda);
        else print_memory_plan<CpuBackend>(cfg, true);
        return 0;
    }
    if (cfg.device == "cuda" && !use_cuda) fatal(2, "--device cuda: no CUDA GPU is visible (%s)", no_cuda.c_str());
    // said once, by rank 0 (OpenMPI names it before MPI starts)
    if (cfg.device == "auto" && !use_cuda && !cfg.quiet && launcher_place().rank == 0)
        printf("no CUDA GPU visible (%s): using the CPU backend\n", no_cuda.c_str());
#else
    if (cfg.device == "cuda") fatal(2, "--device cuda: this binary was built without CUDA (build with nvcc)");
    const bool use_cuda = false;
    if (cfg.plan) {
        print_memory_plan<CpuBackend>(cfg, true);
        return 0;
    }
#endif
#ifdef NO_MPI
#ifdef __CUDACC__
    if (use_cuda) {
        CudaBackend::init(0);
        SingleComm comm(CudaBackend::copy);
        return exit_status(train<CudaBackend>(cfg, comm));
    }
#endif
    SingleComm comm(CpuBackend::copy);
    return exit_status(train<CpuBackend>(cfg, comm));
#else
    int status = 0;
    MPI_Init(&argc, &argv);
    {
        int world = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (world > 1) g_fatal_hook = abort_all_ranks;
        int world_rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        watchdog().set_timeout(cfg.collective_timeout);  // the waits before the run starts too
        watchdog().set_rank(world_rank);
#ifdef __CUDACC__
        // one backend for all ranks: with auto, a rank without a GPU puts everyone on the CPU
        int all_cuda = use_cuda ? 1 : 0;
        MPI_Request agreed;
        MPI_Iallreduce(MPI_IN_PLACE, &all_cuda, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &agreed);
        mpi_await(agreed, [] { return std::string("every rank's choice of backend (a rank still starting CUDA?)"); });
        use_cuda = all_cuda == 1;
#endif
#ifdef __CUDACC__
        if (use_cuda) {
            // the ranks of a node take GPUs round-robin; NCCL needs one GPU per rank
            MPI_Comm node;
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
            int local_rank = 0;
            MPI_Comm_rank(node, &local_rank);
            CudaBackend::init(local_rank);
            const bool nccl = nccl_usable(node, CudaBackend::device_uuid(), !cfg.quiet);
            MPI_Comm_free(&node);
            if (nccl) {
                NcclComm comm(MPI_COMM_WORLD, gpu::stream());
                comm.warm_up();  // before the run reads what memory is free
                status = exit_status(train<CudaBackend>(cfg, comm));
            } else {
                MpiComm comm(MPI_COMM_WORLD, CudaBackend::to_host, CudaBackend::from_host);
                status = exit_status(train<CudaBackend>(cfg, comm));
            }
        }
#endif
        if (!use_cuda) {
            MpiComm comm(MPI_COMM_WORLD);
            status = exit_status(train<CpuBackend>(cfg, comm));
        }
    }
    MPI_Finalize();
    return status;
#endif
}
#endif
