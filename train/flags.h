// The command line: every flag in one table (kFlags; its names, kind, range and help), what it
// fills (TrainConfig), and what the flags ask that a run cannot do. The flags follow llm.c's
// train_gpt2cu where the meaning is the same.
#pragma once
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "../common/io.h"
#include "memory_plan.h"  // parse_size


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
    int async_checkpoint = 0;
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
    std::string fp8 = "none";               // e4m3: the blocks' matmuls with fp8 operands (kernels/fp8_scaling.h)
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
    {"", "--async-checkpoint", 'i', FIELD(async_checkpoint), 0, 1, "1: each rank writes its part of a checkpoint in the background while training goes on (it holds a host copy of the part)"},
    {"-nk", "--checkpoints-keep", 'i', FIELD(checkpoints_keep), 0, 1e9, "keep the last N checkpoints, deleting older ones (0: keep all)"},
    {"-nm", "--major-every", 'i', FIELD(major_every), 0, 1e9, "checkpoints at multiples of N steps are never deleted (0: none)"},
    {"-y", "--resume", 'i', FIELD(resume), 0, 1, "1: continue from the latest checkpoint in the output directory, if any"},
    {"", "--shuffle", 'i', FIELD(shuffle), 0, 1, "1: each epoch permutes shards and windows (from --seed); 0: file order"},
    {"-z", "--zero", 'i', FIELD(zero_stage), 0, 3, "ZeRO stage 0-3"},
    {"", "--offload", 's', FIELD(offload), 0, 0, "none | cpu: fp32 master weights, Adam m and v in host memory, AdamW on the host"},
    {"", "--shard-group", 's', FIELD(shard_group), 0, 0, "stages 1-3 shard within groups of N consecutive ranks, one replica per group: N | node | all"},
    {"", "--quantize-weights", 's', FIELD(quantize_weights), 0, 0, "none | int8: stage 3 gathers parameters as int8 blocks with a scale each"},
    {"", "--quantize-grads", 's', FIELD(quantize_grads), 0, 0, "none | int8: stages 1-3 reduce gradients as int8 blocks (an all-to-all), summed in fp32"},
    {"", "--fp8", 's', FIELD(fp8), 0, 0, "none | e4m3: the blocks' matmuls on fp8 operands (e4m3; gradients e5m2), scaled per tensor; CUDA: sm_89+, bf16 build (docs/fp8.md)"},
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
    long ranks = 0;
    if (!one_of(cfg.shard_group, {"all", "node"}) && !parse_whole_number(cfg.shard_group, 1, 1 << 20, &ranks))
        fatal(2, "--shard-group %s: expected all, node or a number of ranks in [1, 1048576]", cfg.shard_group.c_str());
    if (!one_of(cfg.quantize_weights, {"none", "int8"})) fatal(2, "--quantize-weights %s: expected none or int8", cfg.quantize_weights.c_str());
    if (!one_of(cfg.quantize_grads, {"none", "int8"})) fatal(2, "--quantize-grads %s: expected none or int8", cfg.quantize_grads.c_str());
    if (!one_of(cfg.fp8, {"none", "e4m3"})) fatal(2, "--fp8 %s: expected none or e4m3", cfg.fp8.c_str());
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

// --shard-group as ranks per shard group, for `world` ranks whose nodes each hold `node_ranks`
// (0: the nodes differ): 0 is one group of every rank (`all`, or stage 0, which shards nothing),
// `node` the ranks of a node, else the number given; -1 where the nodes differ and `node` asks
// for them
inline int shard_group_ranks(const TrainConfig& cfg, int world, int node_ranks) {
    long ranks = 0;
    if (cfg.zero_stage == 0 || cfg.shard_group == "all") return 0;
    if (cfg.shard_group == "node") return node_ranks == 0 ? -1 : node_ranks == world ? 0 : node_ranks;
    parse_whole_number(cfg.shard_group, 1, 1 << 20, &ranks);  // checked by parse_args
    return ranks == world ? 0 : (int)ranks;
}

// What the flags of zero/'s collectives (--shard-group, --quantize-*) ask that this run cannot
// do, in one line ("" when nothing)
inline std::string zero_flags_error(const TrainConfig& cfg, int world, int node_ranks) {
    if (cfg.quantize_weights != "none" && cfg.zero_stage != 3)
        return "--quantize-weights " + cfg.quantize_weights + ": only stage 3 gathers parameters (-z 3); this run is -z " + std::to_string(cfg.zero_stage);
    if (cfg.quantize_grads != "none" && cfg.zero_stage == 0)
        return "--quantize-grads " + cfg.quantize_grads + ": stage 0 all-reduces gradients, it has no reduce-scatter to quantize; use -z 1, 2 or 3";
    const int N = shard_group_ranks(cfg, world, node_ranks);
    if (N < 0) return "--shard-group node: the nodes hold different numbers of ranks, or ranks that are not consecutive; give the group size instead";
    if (N > 0 && world % N != 0)
        return "--shard-group " + cfg.shard_group + ": expected a divisor of the " + std::to_string(world) + " rank(s), each group a replica";
    return "";
}

// --offload cpu keeps fp32 master weights on the host (DeepSpeed's layout): where the backend's
// parameters are narrower than fp32 (`narrow_params`), not with -w 0, which asks for none
inline bool offload_allowed(const TrainConfig& cfg, bool narrow_params) { return !narrow_params || cfg.master_weights == 1; }
inline void check_offload_flags(const TrainConfig& cfg, bool narrow_params) {
    if (cfg.offload == "cpu" && !offload_allowed(cfg, narrow_params))
        fatal(2, "--offload cpu keeps fp32 master weights on the host; it cannot go with -w 0");
}

// -t 0: the sequence length when none is given, 1024 on a GPU (llm.c's) and 64 on the CPU
inline int default_seq_len(bool cuda) { return cuda ? 1024 : 64; }
