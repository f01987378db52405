// GPT-2 training in one file: the model, the flags, the training loop and main().
// The model's shape and parameter layout are model/shape.h's; kernels come from a backend
// (kernels/cpu_backend.h, and kernels/cuda_backend.cuh when built with nvcc); who holds which
// parameters, gradients and optimizer state across ranks is zero/'s business, driven from
// train_step() once per micro-step. Everything here runs the same on both backends.
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
#include "train/hellaswag_eval.h"
#include "train/memory_plan.h"
#include "train/nonfinite.h"
#include "train/outlier_detector.h"
#include "train/progress.h"
#include "train/run_dir.h"
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

// ----------------------------------------------------------------------------
// command line: flags follow llm.c's train_gpt2cu where the meaning is the same

struct TrainConfig {
    std::string train_data = "data/tinyshakespeare/tiny_shakespeare_train.bin";
    std::string val_data = "data/tinyshakespeare/tiny_shakespeare_val.bin";
    std::string tokenizer = "data/tinyshakespeare/gpt2_tokenizer.bin";
    std::string init = "d12";   // checkpoint path or model descriptor
    std::string output_dir = "out";
    int B = 4;                  // kAutoBatch: -b auto
    int T = 0;                  // 0: 1024 on cuda, 64 on cpu
    long total_batch = 0;       // tokens per step; 0: B*T*ranks
    int max_steps = 0;          // 0 (or -1, llm.c's): one epoch of the training data
    float lr = 3e-4f;
    int warmup = -1;            // -1: default_warmup(), by how the run starts
    float final_lr_frac = 1.0f;
    std::string schedule = "cosine";
    float wsd_decay_frac = 0.2f;
    float weight_decay = 0.0f;
    int val_every = 20;
    int val_steps = 20;         // 0 or -1: the whole validation split
    int sample_every = 20;
    int hellaswag = 0;
    std::string hellaswag_file = "data/hellaswag/hellaswag_val.bin";
    std::string hellaswag_dump;  // each ending's mean loss, written at every HellaSwag eval
    int gen_len = 64;
    int overfit = 0;
    int checkpoint_every = 0;
    int checkpoints_keep = 0;   // 0: keep all
    int major_every = 0;        // checkpoints at multiples of this are never deleted (0: none are major)
    int resume = 0;
    float skip_loss_z = 0.0f, skip_grad_z = 0.0f;  // 0: off
    int nonfinite_limit = 5;    // non-finite steps in a row that stop the run
    float collective_timeout = 600.0f;  // seconds a rank waits for the others before the job ends (0: forever)
    int shuffle = 1;
    int zero_stage = 0;
    std::string offload = "none";  // cpu: optimizer state and update on the host (zero/offload.h)
    std::string shard_group = "all";  // ranks per shard group (hybrid sharding, zero/zero.h): all, node or N
    std::string quantize_weights = "none";  // int8: stage 3's gathers as int8 blocks (zero/zero.h)
    std::string quantize_grads = "none";    // int8: reductions at stages 1-3 as int8 blocks (zero/zero.h)
    int recompute = 1;
    int cuda_graph = 1;         // where it applies: one rank, -z 0, no offload (Run::graphs_apply)
    std::string gemm_algos;     // a table of cuBLASLt algorithms by GEMM shape (kernels/gemm_choices.h); "": none
    int master_weights = 1;
    int tf32 = 1;
    int gelu_fusion = 0;
    // multi-node flags of llm.c; ranks here always come from mpirun (llm.c's -pi mpi)
    int num_processes = 0;      // 0: as mpirun says
    int process_rank = -1;      // -1: as mpirun says
    int gpus_per_node = 8;
    std::string init_method = "mpi";
    std::string server_ip, fs_path;
    long seed = 1337;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, grad_clip = 1.0f;
    std::string device = "auto";
    std::string device_memory;  // per rank, for -b auto, the fit check and --plan ("": as the device says)
    int plan = 0;               // --plan: print the memory plan and stop
    int quiet = 0;
    std::vector<std::string> given;  // the flags on the command line, as typed
};

constexpr int kAutoBatch = 0;  // -b auto: the largest micro-batch that fits (train/memory_plan.h)

struct Flag {
    const char* short_name;  // "" when there is none
    const char* long_name;
    char kind;               // i: int, l: long, f: float, s: string
    size_t field;            // offsetof(TrainConfig, ...)
    double min, max;         // for numbers
    const char* help;
};

#define FIELD(name) offsetof(TrainConfig, name)
static const Flag kFlags[] = {
    {"-i", "--train", 's', FIELD(train_data), 0, 0, "training token shards (glob pattern)"},
    {"-j", "--val", 's', FIELD(val_data), 0, 0, "validation token shards (glob pattern)"},
    {"-e", "--init", 's', FIELD(init), 0, 0, "checkpoint file, dX|gpt2:dX (d12 d24 d36 d48), gpt3:cX, or L=,NH=,C=[,V=,maxT=]"},
    {"-o", "--output", 's', FIELD(output_dir), 0, 0, "output directory for log and checkpoints ('' for none)"},
    {"", "--tokenizer", 's', FIELD(tokenizer), 0, 0, "tokenizer file for samples"},
    {"-b", "--batch", 'i', FIELD(B), 1, 65536, "micro-batch size B (sequences per rank); auto: the largest that fits"},
    {"-t", "--seq-len", 'i', FIELD(T), 0, 1 << 20, "sequence length T (0: 1024 on cuda, 64 on cpu)"},
    {"-d", "--total-batch", 'l', FIELD(total_batch), 0, 1e12, "tokens per step (0: B*T*ranks); sets accumulation"},
    {"-x", "--max-steps", 'i', FIELD(max_steps), -1, 1e9, "training steps (0 or -1: one epoch)"},
    {"-l", "--lr", 'f', FIELD(lr), 0, 10, "peak learning rate"},
    {"-u", "--warmup", 'i', FIELD(warmup), 0, 1e9, "linear warmup steps (default: 0 from a checkpoint, 2/(1-beta2) from random weights)"},
    {"-q", "--final-lr-frac", 'f', FIELD(final_lr_frac), 0, 1, "final learning rate as a fraction of the peak"},
    {"-k", "--schedule", 's', FIELD(schedule), 0, 0, "cosine | linear | constant | wsd"},
    {"", "--wsd-decay-frac", 'f', FIELD(wsd_decay_frac), 0, 1, "wsd: fraction of steps spent decaying"},
    {"-c", "--weight-decay", 'f', FIELD(weight_decay), 0, 10, "AdamW weight decay (2-D weights only)"},
    {"-sl", "--skip-loss-z", 'f', FIELD(skip_loss_z), 0, 1e9, "skip the update when the loss z-score (128 steps) exceeds this (0: off)"},
    {"-sg", "--skip-grad-z", 'f', FIELD(skip_grad_z), 0, 1e9, "skip the update when the grad-norm z-score exceeds this (0: off)"},
    {"", "--nonfinite-limit", 'i', FIELD(nonfinite_limit), 1, 1e9, "stop (exit code 3) after N steps in a row whose loss or grad norm is not finite"},
    {"", "--collective-timeout", 'f', FIELD(collective_timeout), 0, 1e7, "seconds a rank waits for the others (a collective, or GPU work behind one) before it ends the job saying why (0: forever)"},
    {"-v", "--val-every", 'i', FIELD(val_every), 0, 1e9, "validation loss every N steps (0: never)"},
    {"-m", "--val-steps", 'i', FIELD(val_steps), -1, 1e9, "validation batches per evaluation (0 or -1: the whole split)"},
    {"-h", "--hellaswag", 'i', FIELD(hellaswag), 0, 1, "1: HellaSwag accuracy every -v steps and at the end"},
    {"", "--hellaswag-file", 's', FIELD(hellaswag_file), 0, 0, "HellaSwag eval file (data/hellaswag.py writes it)"},
    {"", "--hellaswag-dump", 's', FIELD(hellaswag_dump), 0, 0, "file for each HellaSwag ending's mean loss ('': none)"},
    {"-s", "--sample-every", 'i', FIELD(sample_every), 0, 1e9, "text sample every N steps (0: never)"},
    {"-g", "--gen-len", 'i', FIELD(gen_len), 1, 1 << 20, "tokens per sample"},
    {"-a", "--overfit", 'i', FIELD(overfit), 0, 1, "1: train on the first batch only"},
    {"-n", "--checkpoint-every", 'i', FIELD(checkpoint_every), 0, 1e9, "checkpoint every N steps (0: only at the end)"},
    {"-nk", "--checkpoints-keep", 'i', FIELD(checkpoints_keep), 0, 1e9, "keep the last N checkpoints, deleting older ones (0: keep all)"},
    {"-nm", "--major-every", 'i', FIELD(major_every), 0, 1e9, "checkpoints at multiples of N steps are never deleted (0: none)"},
    {"-y", "--resume", 'i', FIELD(resume), 0, 1, "1: continue from the latest checkpoint in the output directory, if any"},
    {"", "--shuffle", 'i', FIELD(shuffle), 0, 1, "1: each epoch permutes shards and windows (from --seed); 0: file order"},
    {"-z", "--zero", 'i', FIELD(zero_stage), 0, 3, "ZeRO stage 0-3"},
    {"", "--offload", 's', FIELD(offload), 0, 0, "none | cpu: fp32 master weights, Adam m and v in host memory, AdamW on the host"},
    {"", "--shard-group", 's', FIELD(shard_group), 0, 0, "stages 1-3 shard within groups of N consecutive ranks, one replica per group: N | node | all"},
    {"", "--quantize-weights", 's', FIELD(quantize_weights), 0, 0, "none | int8: stage 3 gathers parameters as int8 blocks with a scale each"},
    {"", "--quantize-grads", 's', FIELD(quantize_grads), 0, 0, "none | int8: stages 1-3 reduce gradients as int8 blocks (an all-to-all), summed in fp32"},
    {"-r", "--recompute", 'i', FIELD(recompute), 0, 2, "0: keep activations, 1: recompute GELU, 2: also layernorm"},
    {"", "--cuda-graph", 'i', FIELD(cuda_graph), 0, 1, "1: each micro-step's forward and backward as one CUDA graph (one rank, -z 0, no offload)"},
    {"", "--gemm-algos", 's', FIELD(gemm_algos), 0, 0, "cuda: cuBLASLt algorithm by GEMM shape, from a table scripts/bench_gemm --write timed here ('': the heuristic's first)"},
    {"-w", "--master-weights", 'i', FIELD(master_weights), 0, 1, "1: fp32 master copy of bf16 weights for the update"},
    {"-f", "--tf32", 'i', FIELD(tf32), 0, 1, "llm.c's TF32 switch (matmuls here never use TF32)"},
    {"-ge", "--gelu-fusion", 'i', FIELD(gelu_fusion), 0, 2, "llm.c's GELU fusion into matmuls (here: in bf16 always, where cuBLASLt offers it)"},
    {"-pn", "--num-processes", 'i', FIELD(num_processes), 0, 1 << 20, "ranks, checked against mpirun's (0: as mpirun says)"},
    {"-pr", "--process-rank", 'i', FIELD(process_rank), -1, 1 << 20, "this rank, checked against mpirun's (-1: as mpirun says)"},
    {"-pg", "--gpus-per-node", 'i', FIELD(gpus_per_node), 1, 1 << 20, "llm.c's GPUs per node (here: each node's rank count)"},
    {"-pi", "--init-method", 's', FIELD(init_method), 0, 0, "how ranks meet: mpi (mpirun; llm.c's tcp and fs are not offered)"},
    {"-ps", "--server-ip", 's', FIELD(server_ip), 0, 0, "llm.c's tcp server address (unused with mpi)"},
    {"-pf", "--fs-path", 's', FIELD(fs_path), 0, 0, "llm.c's shared-file path (unused with mpi)"},
    {"", "--seed", 'l', FIELD(seed), 0, 4294967295.0, "seed for init, shuffling, sampling and rounding"},
    {"", "--beta1", 'f', FIELD(beta1), 0, 0.999999, "AdamW beta1"},
    {"", "--beta2", 'f', FIELD(beta2), 0, 0.999999, "AdamW beta2"},
    {"", "--eps", 'f', FIELD(eps), 1e-30, 1, "AdamW epsilon"},
    {"", "--grad-clip", 'f', FIELD(grad_clip), 0, 1e9, "clip the global gradient norm to this (0: off)"},
    {"", "--device", 's', FIELD(device), 0, 0, "cpu | cuda | auto"},
    {"", "--device-memory", 's', FIELD(device_memory), 0, 0, "memory per rank for -b auto and --plan, e.g. 80GiB (default: free GPU / available host memory)"},
    {"", "--quiet", 'i', FIELD(quiet), 0, 1, "1: print only errors"},
};
#undef FIELD

inline void print_usage(FILE* out) {
    fprintf(out, "usage: train_gpt [flags]   (mpirun -np N train_gpt [flags] for N ranks)\n");
    for (const Flag& f : kFlags) {
        char names[48];
        snprintf(names, sizeof(names), "%-3s %s", f.short_name, f.long_name);
        fprintf(out, "  %-26s %s\n", names, f.help);
    }
    fprintf(out, "  %-26s %s\n", "    --plan", "print the memory plan of the run the other flags describe, and stop");
    fprintf(out, "  %-26s %s\n", "    --help", "this table (so is -h without a value)");
}

inline bool one_of(const std::string& v, std::initializer_list<const char*> options) {
    for (const char* o : options)
        if (v == o) return true;
    return false;
}

// a whole number in [1, max] written in decimal, else 0
inline long parse_count(const std::string& v, long max) {
    char* end = nullptr;
    const long n = strtol(v.c_str(), &end, 10);
    return !v.empty() && isdigit((unsigned char)v[0]) && *end == '\0' && n >= 1 && n <= max ? n : 0;
}

// Exits with code 2 and one line on any unknown flag or value out of range.
inline TrainConfig parse_args(int argc, char** argv) {
    TrainConfig cfg;
    for (int i = 1; i < argc; i++) {
        std::string name = argv[i];
        // -h takes 0|1 as in llm.c; without a value (last, or before another flag) it is help
        const bool value_follows = i + 1 < argc && (argv[i + 1][0] != '-' || isdigit((unsigned char)argv[i + 1][1]));
        if (name == "--help" || (name == "-h" && !value_follows)) {
            print_usage(stdout);
            exit(0);
        }
        if (name == "--plan") {
            cfg.plan = 1;
            continue;
        }
        const Flag* flag = nullptr;
        for (const Flag& f : kFlags)
            if (name == f.short_name || name == f.long_name) flag = &f;
        if (flag == nullptr) fatal(2, "unknown flag %s (see --help)", name.c_str());
        if (i + 1 >= argc) fatal(2, "flag %s needs a value", name.c_str());
        const char* value = argv[++i];
        cfg.given.push_back(name);
        char* field = (char*)&cfg + flag->field;
        if (flag->field == offsetof(TrainConfig, B) && strcmp(value, "auto") == 0) {
            cfg.B = kAutoBatch;
            continue;
        }
        if (flag->kind == 's') {
            *(std::string*)field = value;
            continue;
        }
        char* end = nullptr;
        double v = flag->kind == 'f' ? strtod(value, &end) : (double)strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || !std::isfinite(v) || v < flag->min || v > flag->max)
            fatal(2, "%s %s: expected %s in [%g, %g]", name.c_str(), value, flag->kind == 'f' ? "a number" : "an integer", flag->min, flag->max);
        if (flag->kind == 'i') *(int*)field = (int)v;
        else if (flag->kind == 'l') *(long*)field = (long)v;
        else *(float*)field = (float)v;
    }
    if (!one_of(cfg.schedule, {"cosine", "linear", "constant", "wsd"}))
        fatal(2, "-k %s: expected cosine, linear, constant or wsd", cfg.schedule.c_str());
    if (!one_of(cfg.device, {"cpu", "cuda", "auto"})) fatal(2, "--device %s: expected cpu, cuda or auto", cfg.device.c_str());
    if (!one_of(cfg.offload, {"none", "cpu"})) fatal(2, "--offload %s: expected none or cpu", cfg.offload.c_str());
    if (!one_of(cfg.shard_group, {"all", "node"}) && parse_count(cfg.shard_group, 1 << 20) == 0)
        fatal(2, "--shard-group %s: expected all, node or a number of ranks in [1, 1048576]", cfg.shard_group.c_str());
    if (!one_of(cfg.quantize_weights, {"none", "int8"})) fatal(2, "--quantize-weights %s: expected none or int8", cfg.quantize_weights.c_str());
    if (!one_of(cfg.quantize_grads, {"none", "int8"})) fatal(2, "--quantize-grads %s: expected none or int8", cfg.quantize_grads.c_str());
    size_t bytes = 0;
    if (!cfg.device_memory.empty() && !parse_size(cfg.device_memory, &bytes))
        fatal(2, "--device-memory %s: expected a size such as 80GiB, 24GB, 512MiB or a number of bytes", cfg.device_memory.c_str());
    if (cfg.init_method != "mpi")
        fatal(2, "-pi %s: expected mpi (ranks are started by mpirun; llm.c's tcp and fs are not offered)", cfg.init_method.c_str());
    return cfg;
}

// whether the flag (by either name) was on the command line
inline bool given(const TrainConfig& cfg, const char* short_name) {
    for (const Flag& f : kFlags)
        if (strcmp(f.short_name, short_name) == 0)
            for (const std::string& g : cfg.given)
                if (g == f.short_name || g == f.long_name) return true;
    return false;
}

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

// Every rank must train the same model on the same data with the same flags; rank 0's hash of
// all of it is compared everywhere, and a mismatch stops every rank with a message, not a hang.
// flag_files: the contents of the files the flags name that each rank reads itself (--gemm-algos).
inline void check_ranks_agree(Communicator& comm, const TrainConfig& cfg, const GPT2Config& mc,
                              const DataLoader& data, bool have_tokenizer, const std::string& flag_files) {
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
    s += std::to_string(mc.num_layers) + ' ' + std::to_string(mc.channels) + ' ' + std::to_string(mc.vocab_size) + ' ' + std::to_string(mc.max_seq_len);
    for (size_t n : data.sizes()) s += ' ' + std::to_string(n);
    s += have_tokenizer ? " tok" : " notok";
    s += flag_files;
    uint64_t mine = fnv1a(s), root = mine;
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

// A sum of batch mean losses kept in backend memory, so that a training step reads the device
// once (take()); each evaluation and the training loss keep their own, so none leaks into another.
template <class Backend>
class LossSum {
public:
    LossSum() : sum_((double*)Backend::alloc(kBytes)) {}
    ~LossSum() { Backend::release(sum_); }
    LossSum(const LossSum&) = delete;
    LossSum& operator=(const LossSum&) = delete;
    static constexpr size_t kBytes = sizeof(double);  // of backend memory
    // adds the mean of the N per-position losses (in backend memory)
    void add_batch_mean(const float* losses, int N) { Backend::mean_loss_add(sum_, losses, N); }
    // the sum since the last take(), which starts it again from zero
    double take() {
        double sum = 0.0;
        Backend::to_host(&sum, sum_, sizeof(double));
        Backend::zero(sum_, sizeof(double));
        return sum;
    }

private:
    double* sum_;
};

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
    if (given(cfg, "-w") && !Backend::has_master_weights)
        printf("note: -w: the %s backend's parameters are fp32 already, so there are no separate master weights\n", Backend::name);
    if (given(cfg, "-f")) printf("note: -f: this trainer's matmuls never use TF32 (fp32 stays fp32), so there is nothing to switch\n");
    if (given(cfg, "-ge")) printf("note: -ge: GELU runs inside the matmuls in the bf16 CUDA build wherever cuBLASLt offers it, as its own kernel elsewhere, whatever -ge says\n");
    if (given(cfg, "-pg")) printf("note: -pg: each rank takes a GPU by its rank on the node (from mpirun), not from -pg\n");
    if (given(cfg, "-ps") || given(cfg, "-pf")) printf("note: -ps/-pf: used by llm.c's tcp/fs start only; ranks here meet through mpirun\n");
    if (cfg.shard_group != "all" && cfg.zero_stage == 0)
        printf("note: --shard-group: stage 0 shards nothing (every rank holds everything); gradients are all-reduced over all ranks\n");
}

// --offload cpu keeps fp32 master weights on the host (DeepSpeed's layout); where the backend's
// parameters are narrower than fp32, -w 0 would ask for none
inline void check_offload_flags(const TrainConfig& cfg, bool params_narrower_than_fp32) {
    if (cfg.offload == "cpu" && params_narrower_than_fp32 && cfg.master_weights == 0)
        fatal(2, "--offload cpu keeps fp32 master weights on the host; it cannot go with -w 0");
}

// --shard-group as ranks per group: `node` the ranks mpirun put on each node (node_ranks, 0
// when nodes differ), `all` (or stage 0, which shards nothing) the world
inline int shard_group_ranks(const TrainConfig& cfg, int world, int node_ranks) {
    if (cfg.zero_stage == 0 || cfg.shard_group == "all") return world;
    return cfg.shard_group == "node" ? node_ranks : (int)parse_count(cfg.shard_group, 1 << 20);
}

// What the flags of zero/'s collectives (--shard-group, --quantize-*) ask that this run cannot
// do, in one line ("" when nothing)
inline std::string zero_flags_error(const TrainConfig& cfg, int world, int node_ranks) {
    if (cfg.quantize_weights != "none" && cfg.zero_stage != 3)
        return "--quantize-weights " + cfg.quantize_weights + ": only stage 3 gathers parameters (-z 3); this run is -z " + std::to_string(cfg.zero_stage);
    if (cfg.quantize_grads != "none" && cfg.zero_stage == 0)
        return "--quantize-grads " + cfg.quantize_grads + ": stage 0 all-reduces gradients, it has no reduce-scatter to quantize; use -z 1, 2 or 3";
    const int N = shard_group_ranks(cfg, world, node_ranks);
    if (N == 0) return "--shard-group node: the nodes hold different numbers of ranks, or ranks that are not consecutive; give the group size instead";
    if (world % N != 0)
        return "--shard-group " + cfg.shard_group + ": expected a divisor of the " + std::to_string(world) + " rank(s), each group a replica";
    return "";
}

// A usage error that every rank finds alike (after check_ranks_agree): said once, by rank 0, and
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

// ----------------------------------------------------------------------------
// memory: what a rank allocates, made by the same calls in the run and in its plan

// the flags and model that decide a rank's memory
// (shard_group: ranks per shard group, shard_group_ranks(); the world: one group)
inline RunShape run_shape(const TrainConfig& cfg, const GPT2Config& mc, int B, int T, int world, int shard_group) {
    return {mc, B, T, world, cfg.zero_stage, cfg.recompute, cfg.offload == "cpu", cfg.master_weights == 1, shard_group == world ? 0 : shard_group,
            cfg.quantize_weights == "int8", cfg.quantize_grads == "int8"};
}
template <class Backend>
std::unique_ptr<Zero<Backend>> make_zero(const RunShape& s, Communicator& comm) {
    return std::make_unique<Zero<Backend>>(s.stage, param_groups(s.model), comm,
                                           ZeroOptions{s.master_weights, s.offload, s.shard_group, s.quantize_weights, s.quantize_grads});
}
template <class Backend>
std::unique_ptr<GPT2<Backend>> make_model(const RunShape& s, Zero<Backend>& zero) {
    return std::make_unique<GPT2<Backend>>(s.model, s.B, s.T, s.recompute, zero);
}
constexpr int kLossSums = 2;  // a run's: the training loss's and the evaluations'
// what a rank holds, by category, as the objects holding it count it
template <class Backend>
MemoryUse memory_use(const Zero<Backend>& zero, const GPT2<Backend>& model, const BackendMemory& backend) {
    MemoryUse m;
    m.zero = zero.memory();
    m.activations = model.activation_bytes();
    m.scratch = model.scratch_bytes();
    m.loss_sums = kLossSums * LossSum<Backend>::kBytes;
    m.backend = backend;
    return m;
}

// The memory rank `rank` of the run `shape` would hold, allocating none: the run's own
// constructors (make_zero, make_model, its loss sums) on CountingBackend, and what the backend
// reserves for the model's shapes. Bytes the counting backend handed out beyond the categories
// are `unnamed` (the tests check there are none).
template <class Backend>
MemoryUse plan_memory(const RunShape& shape, int rank) {
    using Counting = CountingBackend<Backend>;
    Counting::reset_counts();
    PlanComm comm(rank, shape.world);
    std::unique_ptr<Zero<Counting>> zero = make_zero<Counting>(shape, comm);
    std::unique_ptr<GPT2<Counting>> model = make_model<Counting>(shape, *zero);
    LossSum<Counting> loss_sums[kLossSums];
    MemoryUse m = memory_use(*zero, *model, Backend::planned_memory(GPT2<Backend>::op_shapes(shape.model, shape.B, shape.T)));
    m.unnamed = Counting::device_bytes - (memory_total(m, false) - m.backend.context - m.backend.kernel_scratch);
    m.device_allocations = Counting::device_allocations + m.backend.device_allocations;
    return m;
}

// --offload cpu keeps fp32 master weights: not with -w 0 where parameters are narrower
template <class Backend>
bool offload_allowed(const TrainConfig& cfg) {
    return !Backend::has_master_weights || cfg.master_weights == 1;
}

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
    int shard_group = 1;  // ranks per shard group (the world without --shard-group)
    Communicator::NodeRanks node;  // how the ranks sit on nodes
    size_t gemm_table_shapes = 0;  // GEMM shapes whose algorithm the --gemm-algos table names
    long total_batch = 0;
    std::unique_ptr<DataLoader> train_data, val_data;
    std::unique_ptr<HellaSwag> hellaswag;
    std::unique_ptr<Tokenizer> tokenizer;
    std::unique_ptr<Zero<Backend>> zero;
    std::unique_ptr<GPT2<Backend>> model;  // after zero: it holds a reference to it
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
        if (rank == 0 && !dir.empty()) {
            mkdir(dir.c_str(), 0755);
            remove_partial_writes(dir);
        }
        std::vector<float> init;
        resume_step = agreed_resume_step(comm, cfg);
        if (cfg.resume && resume_step == 0 && prints_run) printf("-y 1: no complete checkpoint in %s, starting fresh\n", dir.c_str());
        const bool from_random = config_from_descriptor(cfg.init, &mc);
        const std::string weights = resume_step > 0 ? checkpoint_path(dir, "model", resume_step) : from_random ? "" : cfg.init;
        if (!weights.empty()) mc = checkpoint_config(weights);
        if (T <= 0 || T > mc.max_seq_len) fatal(2, "-t %d: expected 1..%d (the model's maxT)", T, mc.max_seq_len);
        // the shard group the plan and zero/ take: --shard-group's where it can be done (else the
        // error is said once the ranks agree on the flags, below); every rank asks for its node,
        // whatever its flags, so that none waits in that collective alone
        node = comm.node_ranks();
        const std::string flags_error = zero_flags_error(cfg, world, node.per_node);
        shard_group = flags_error.empty() ? shard_group_ranks(cfg, world, node.per_node) : world;
        size_memory();  // before the model's parameters take their memory
        init = weights.empty() ? random_init(mc, (uint64_t)cfg.seed) : load_checkpoint(weights, &mc);
        if (cfg.warmup < 0) cfg.warmup = default_warmup(from_random, cfg.beta2);
        inputs.resize((size_t)B * T);
        targets.resize((size_t)B * T);

        train_data = std::make_unique<DataLoader>(cfg.train_data, B, T, rank, world, mc.vocab_size);
        if (cfg.shuffle) train_data->shuffle((uint64_t)cfg.seed);
        if (cfg.val_every > 0) val_data = std::make_unique<DataLoader>(cfg.val_data, B, T, rank, world, mc.vocab_size);
        val_batches = !val_data ? 0 : cfg.val_steps > 0 ? cfg.val_steps : (int)std::max<size_t>(1, val_data->windows() / world);
        if (cfg.hellaswag) hellaswag = std::make_unique<HellaSwag>(cfg.hellaswag_file, mc.vocab_size, B, T, rank, world);
        const long tokens_per_micro = (long)B * T * world;
        total_batch = cfg.total_batch > 0 ? cfg.total_batch : tokens_per_micro;
        if (total_batch % tokens_per_micro != 0) fatal(2, "-d %ld: expected a multiple of B*T*ranks = %ld", total_batch, tokens_per_micro);
        accum = (int)(total_batch / tokens_per_micro);
        max_steps = cfg.max_steps > 0 ? cfg.max_steps : (int)std::max<long>(1, (long)train_data->total_tokens() / total_batch);
        open_tokenizer();
        const GemmChoices gemm_choices = cfg.gemm_algos.empty() ? GemmChoices{} : read_gemm_choices(cfg.gemm_algos);
        check_ranks_agree(comm, cfg, mc, *train_data, tokenizer != nullptr, cfg.gemm_algos.empty() ? "" : format_gemm_choices(gemm_choices));
        // the ranks agree on the flags: what they ask is said once, if it cannot be done
        if (!flags_error.empty()) usage_error_everywhere(comm, flags_error);
        if (!cfg.gemm_algos.empty()) {  // before the first GEMM
            const std::string differs = Backend::use_gemm_choices(gemm_choices);
            if (!differs.empty()) fatal(2, "--gemm-algos %s: %s", cfg.gemm_algos.c_str(), differs.c_str());
            gemm_table_shapes = gemm_choices.algorithm.size();
        }
        const RunShape shape = run_shape(cfg, mc, B, T, world, shard_group);
        Backend::reserve(GPT2<Backend>::op_shapes(mc, B, T));
        zero = make_zero<Backend>(shape, comm);
        zero->load(init.data());
        init = std::vector<float>();
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
    MemoryUse memory() const { return memory_use(*zero, *model, Backend::memory()); }

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
        check_offload_flags(cfg, Backend::has_master_weights);
        const Planner plan = plan_memory<Backend>;
        const MemoryBudget budget = memory_budget<Backend>(cfg.device_memory, ranks_sharing_memory());
        RunShape shape = run_shape(cfg, mc, B, T, world, shard_group);
        if (B == kAutoBatch) {  // the largest B that fits every rank
            shape.B = min_over_ranks(comm, auto_micro_batch(plan, shape, budget, cfg.total_batch));
            if (shape.B == 0) {
                shape.B = 1;
                if (rank != 0) comm.barrier();  // rank 0 says why and ends the job
                fatal(1, "-b auto: not even B=1 fits: %s", does_not_fit_words(plan, shape, rank, budget, offload_allowed<Backend>(cfg)).c_str());
            }
            if (prints_run) printf("%s\n", auto_batch_words(plan, shape, budget, cfg.total_batch).c_str());
            B = shape.B;
        }
        const MemoryUse mine = plan(shape, rank);
        const size_t host_state = mine.zero.host_optimizer + mine.zero.host_staging, available = host_memory_available();
        if (available > 0 && host_state > available) offload_does_not_fit(host_state, available);
        if (!fits(mine, budget)) fatal(1, "%s", does_not_fit_words(plan, shape, rank, budget, offload_allowed<Backend>(cfg)).c_str());
    }

    // How many of the run's ranks share this rank's memory: on a GPU the ranks whose GPU is this
    // rank's (by the GPUs' ids, however many devices each rank sees), on the CPU backend the
    // ranks of this node. A collective.
    int ranks_sharing_memory() {
        if constexpr (Backend::device_is_host) return node.here;
        else return ranks_sharing_gpu(gather_everywhere(comm, Backend::device_uuid()), rank);
    }

    void restore_state(const std::string& path) {
        OptimizerState state = read_state(path, resume_step, mc, zero->has_master_weights());
        if (zero->has_master_weights() && state.master.empty())
            fatal(1, "-y 1: the state at step %d has no master weights (written with -w 0 or by an fp32 build); resume with -w 0", resume_step);
        zero->load_state(state.m.data(), state.v.data(), state.master.data());
        sample_rng = state.sample_rng;
        train_data->restore(state.loader);
        if (!loss_z.restore(state.loss_z) || !grad_z.restore(state.grad_z)) fatal(1, "%s: outlier detector state out of range", path.c_str());
        if (prints_run) printf("resuming from step %d of %s\n", resume_step, cfg.output_dir.c_str());
    }
    // hybrid sharding, for the setup line: "" with one group
    std::string shard_groups_said() const {
        if (shard_group == world) return "";
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
    r.loss = (float)(run.comm.all_reduce_host(run.train_loss.take() / run.accum) / run.world);
    r.lr = learning_rate(cfg, step, run.max_steps);
    r.norm = zero.grad_norm();
    if (!run.nonfinite.record(r.loss, r.norm)) {
        r.loss_z = r.grad_z = NAN;
        r.skipped = kSkipNonFinite;
        if (run.prints_run)
            printf("skipping update: loss %f, grad norm %f: not finite (%d step(s) in a row; the run stops at %d, --nonfinite-limit)\n", r.loss,
                   r.norm, run.nonfinite.in_a_row(), run.nonfinite.limit());
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

// The slowest disk a checkpoint is written to that the watchdog allows for (a network file
// system under load): the other ranks wait for rank 0's write that much longer than the timeout.
constexpr double kSlowestDiskBytesPerSecond = 25e6;

// The checkpoint after `step` updates: model_N.bin (fp32 from an fp32 build, bf16 from a bf16
// one, as llm.c), state_N.bin (state brings everything but the optimizer's arrays), then DONE_N,
// then the checkpoint -nk/-nm retire. A collective; rank 0 gathers and writes every file, so
// DONE follows the whole checkpoint, and the log reaches it first; the others wait for it.
template <class Backend>
void save_checkpoint(Run<Backend>& run, int step, uint64_t sample_rng) {
    watchdog().set_activity("the checkpoint after step " + std::to_string(step));
    Zero<Backend>& zero = *run.zero;
    const bool root = run.rank == 0;
    if (run.log) fflush(run.log);
    std::vector<float> params(zero.plan().total());
    zero.save(params.data());
    OptimizerState state;
    state.step = step;
    state.sample_rng = sample_rng;
    state.loader = run.train_data->state();
    state.loss_z = run.loss_z.state();
    state.grad_z = run.grad_z.state();
    for (auto* x : {&state.m, &state.v}) x->resize(root ? params.size() : 0);
    if (zero.has_master_weights()) state.master.resize(root ? params.size() : 0);
    zero.save_state(state.m.data(), state.v.data(), state.master.data(), 0);
    const TrainConfig& cfg = run.cfg;
    if (root) {
        const std::string kept = checkpoint_kept(cfg.output_dir);  // said if a write fails
        write_checkpoint(checkpoint_path(cfg.output_dir, "model", step), run.mc, params, checkpoint_version(sizeof(typename Backend::floatX)), kept);
        write_state(checkpoint_path(cfg.output_dir, "state", step), state, kept);
        write_done(cfg.output_dir, step, kept);
        if (int old = checkpoint_to_delete(step, cfg.checkpoint_every, cfg.checkpoints_keep, cfg.major_every))
            remove_checkpoint(cfg.output_dir, old);
    }
    const double written = (double)params.size() * (sizeof(typename Backend::floatX) + (zero.has_master_weights() ? 12 : 8));
    run.comm.barrier(written / kSlowestDiskBytesPerSecond);
}

// The story of a run, as llm.c tells it: for step 0..N, first what is due after `step` updates
// (evaluations, text sample, checkpoint; at N all of them), then stop at N, else one update.
// Returns each update's record; hook(step, zero) runs after each update (for tests).
template <class Backend>
std::vector<StepRecord> train(const TrainConfig& cfg, Communicator& comm, const StepHook<Backend>& hook = {}) {
    Run<Backend> run(cfg, comm);
    std::vector<StepRecord> records;
    size_t peak_device_bytes = 0;  // on a GPU
    const auto run_start = std::chrono::steady_clock::now();
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

        Backend::synchronize();
        // a profiler started with --profile-from-start off (Nsight Compute in scripts/bench_gpu.sh)
        // sees the last step alone; without one these do nothing
        const bool profiled = step + 1 == run.max_steps;
        if (profiled) Backend::profiler_start();
        const auto start = std::chrono::steady_clock::now();
        run.zero->reset_traffic();  // count this step's training traffic only
        watchdog().set_activity("step " + std::to_string(step + 1));
        const uint64_t launches_before = Backend::launches();
        records.push_back(train_step(run, step));
        Backend::synchronize();
        if (profiled) Backend::profiler_stop();
        const uint64_t launches = Backend::launches() - launches_before;
        const auto now = std::chrono::steady_clock::now();
        report_step(run, step, records.back(), std::chrono::duration<double, std::milli>(now - start).count(),
                    std::chrono::duration<double>(now - run_start).count());
        if (step == run.resume_step && !run.cfg.quiet) {
            const ZeroTraffic t = run.zero->traffic();
            if (run.zero->replica_count() == 1) printf("rank %d bytes moved per step: %s\n", run.rank, bytes_said(t.inside).c_str());
            else
                printf("rank %d bytes moved per step: inside its group of %d: %s || across the %d groups: %s\n", run.rank,
                       run.zero->group_size(), bytes_said(t.inside).c_str(), run.zero->replica_count(), bytes_said(t.across).c_str());
            if (launches > 0) printf("rank %d kernel launches per step: %llu\n", run.rank, (unsigned long long)launches);
            if (const size_t taken = Backend::device_memory_taken())  // on a GPU: the buffers (as planned) against what the GPU lost
                printf("rank %d device memory after step 1: %.2f MiB in the run's buffers, %.2f MiB taken since the CUDA context was made, %.2f MiB in use on the GPU\n",
                       run.rank, memory_total(run.memory(), false) / 1048576.0, taken / 1048576.0, Backend::device_memory_in_use() / 1048576.0);
        }
        // the step after the first runs the micro-steps' graphs (the first ran without them)
        if (step == run.resume_step + 1 && launches > 0 && run.graphs_apply() && !run.cfg.quiet)
            printf("rank %d kernel launches per step with CUDA graphs: %llu (a micro-step's forward and backward: one graph of %llu)\n",
                   run.rank, (unsigned long long)launches, (unsigned long long)run.micro_step_graphs[0].launches);
        peak_device_bytes = std::max(peak_device_bytes, Backend::device_memory_in_use());
        if (hook) hook(step, *run.zero);
        if (run.nonfinite.limit_reached()) {
            if (run.rank == 0) run.nonfinite.print_stop(step + 1, checkpoint_kept(run.cfg.output_dir));
            break;
        }
    }
    if (peak_device_bytes > 0 && !cfg.quiet)
        printf("rank %d peak device memory in use after a step (every process on the GPU): %.2f MiB\n", run.rank, peak_device_bytes / 1048576.0);
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
    GPT2Config mc;
    const int resume_step = cfg.resume && !cfg.output_dir.empty() ? latest_checkpoint(cfg.output_dir) : 0;
    if (resume_step > 0) mc = checkpoint_config(checkpoint_path(cfg.output_dir, "model", resume_step));
    else if (!config_from_descriptor(cfg.init, &mc)) mc = checkpoint_config(cfg.init);
    if (cfg.T <= 0 || cfg.T > mc.max_seq_len) fatal(2, "-t %d: expected 1..%d (the model's maxT)", cfg.T, mc.max_seq_len);
    check_offload_flags(cfg, Backend::has_master_weights);
    if (!device_seen && cfg.device_memory.empty())
        fatal(2, "--plan --device %s: no GPU here to ask for its free memory; give --device-memory (e.g. 80GiB)", cfg.device.c_str());
    const Planner plan = plan_memory<Backend>;
    const int sharing = Backend::device_is_host && cfg.num_processes == 0 ? place.node_ranks : 1;
    const MemoryBudget budget = memory_budget<Backend>(cfg.device_memory, sharing);
    // --shard-group node: the ranks mpirun put on this node (-pn's are elsewhere: not known)
    if (cfg.shard_group == "node" && cfg.num_processes > 0 && cfg.zero_stage > 0)
        fatal(2, "--plan -pn %d --shard-group node: the plan cannot see how many ranks each node will hold; give the group size (--shard-group N)",
              cfg.num_processes);
    const std::string flags_error = zero_flags_error(cfg, world, place.node_ranks);
    if (!flags_error.empty()) fatal(2, "%s", flags_error.c_str());
    RunShape shape = run_shape(cfg, mc, cfg.B, cfg.T, world, shard_group_ranks(cfg, world, place.node_ranks));
    if (cfg.B == kAutoBatch) {
        shape.B = std::max(1, auto_micro_batch(plan, shape, budget, cfg.total_batch));
        printf("-b auto: B=%d\n", shape.B);
    }
    const long per_micro = (long)shape.B * shape.T * world, total_batch = cfg.total_batch > 0 ? cfg.total_batch : per_micro;
    if (total_batch % per_micro != 0) fatal(2, "-d %ld: expected a multiple of B*T*ranks = %ld", total_batch, per_micro);
    print_plan(plan, shape, (int)(total_batch / per_micro), budget, offload_allowed<Backend>(cfg), Backend::name, stdout);
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
        if (cfg.T == 0) cfg.T = use_cuda || cfg.device == "cuda" ? 1024 : 64;
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
        if (cfg.T == 0) cfg.T = 64;
        print_memory_plan<CpuBackend>(cfg, true);
        return 0;
    }
#endif
#ifdef NO_MPI
    if (cfg.T == 0) cfg.T = use_cuda ? 1024 : 64;
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
        if (cfg.T == 0) cfg.T = use_cuda ? 1024 : 64;
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
