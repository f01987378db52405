// Flags, learning-rate schedules, determinism and a short real training run.
#include <sstream>

#include "test_util.h"

namespace {

using ::testing::ExitedWithCode;

TrainConfig parse(std::vector<std::string> args) {
    std::vector<char*> argv{(char*)"train_gpt"};
    for (auto& a : args) argv.push_back(a.data());
    return parse_args((int)argv.size(), argv.data());
}

TEST(Flags, ValuesLandInTheirFields) {
    TrainConfig c = parse({"-i", "a*.bin", "-j", "v.bin", "-e", "d6", "-o", "dir", "-b", "8", "-t", "128", "-d", "4096",
                           "-x", "5", "-l", "0.001", "-u", "3", "-q", "0.1", "-k", "wsd", "-c", "0.1", "-v", "7", "-m", "2",
                           "-s", "9", "-g", "16", "-a", "1", "-n", "4", "-z", "3", "-r", "2", "--seed", "42", "--beta1",
                           "0.8", "--beta2", "0.99", "--eps", "1e-6", "--grad-clip", "0", "--device", "cpu", "--tokenizer",
                           "t.bin", "--wsd-decay-frac", "0.3", "-y", "1", "--quiet", "1"});
    EXPECT_EQ(c.train_data, "a*.bin");
    EXPECT_EQ(c.tokenizer, "t.bin");
    EXPECT_EQ(c.val_data, "v.bin");
    EXPECT_EQ(c.init, "d6");
    EXPECT_EQ(c.output_dir, "dir");
    EXPECT_EQ(std::vector<long>({c.B, c.T, c.total_batch, c.max_steps, c.warmup, c.val_every, c.val_steps, c.sample_every,
                                 c.gen_len, c.overfit, c.checkpoint_every, c.resume, c.zero_stage, c.recompute, c.seed, c.quiet}),
              std::vector<long>({8, 128, 4096, 5, 3, 7, 2, 9, 16, 1, 4, 1, 3, 2, 42, 1}));
    EXPECT_EQ(std::vector<float>({c.lr, c.final_lr_frac, c.wsd_decay_frac, c.weight_decay, c.beta1, c.beta2, c.eps, c.grad_clip}),
              std::vector<float>({0.001f, 0.1f, 0.3f, 0.1f, 0.8f, 0.99f, 1e-6f, 0.0f}));
    EXPECT_EQ(c.schedule, "wsd");
    EXPECT_EQ(c.device, "cpu");
}

TEST(Flags, BadValuesExitWithCode2) {
    EXPECT_EXIT(parse({"--no-such-flag", "1"}), ExitedWithCode(2), "unknown flag --no-such-flag");
    EXPECT_EXIT(parse({"-b"}), ExitedWithCode(2), "flag -b needs a value");
    EXPECT_EXIT(parse({"-b", "0"}), ExitedWithCode(2), "-b 0: expected an integer in \\[1, 65536\\]");
    EXPECT_EXIT(parse({"-b", "4x"}), ExitedWithCode(2), "-b 4x: expected an integer");
    EXPECT_EXIT(parse({"-z", "4"}), ExitedWithCode(2), "-z 4: expected an integer in \\[0, 3\\]");
    EXPECT_EXIT(parse({"-r", "3"}), ExitedWithCode(2), "-r 3");
    EXPECT_EXIT(parse({"-l", "nan"}), ExitedWithCode(2), "-l nan: expected a number");
    EXPECT_EXIT(parse({"-q", "1.5"}), ExitedWithCode(2), "-q 1.5");
    EXPECT_EXIT(parse({"-a", "2"}), ExitedWithCode(2), "-a 2");
    EXPECT_EXIT(parse({"--beta1", "1"}), ExitedWithCode(2), "--beta1 1");
    EXPECT_EXIT(parse({"--eps", "0"}), ExitedWithCode(2), "--eps 0");
    EXPECT_EXIT(parse({"-k", "step"}), ExitedWithCode(2), "-k step: expected cosine, linear, constant or wsd");
    EXPECT_EXIT(parse({"--device", "tpu"}), ExitedWithCode(2), "--device tpu: expected cpu, cuda or auto");
    EXPECT_EXIT(parse({"--offload", "nvme"}), ExitedWithCode(2), "--offload nvme: expected none or cpu");
    // offload keeps fp32 master weights: with bf16 parameters (the CUDA build's) -w 0 cannot be had
    EXPECT_EXIT(check_offload_flags(parse({"--offload", "cpu", "-w", "0"}), true), ExitedWithCode(2), "cannot go with -w 0");
    EXPECT_EXIT((check_offload_flags(parse({"--offload", "cpu", "-w", "0"}), false), check_offload_flags(parse({"--offload", "cpu"}), true),
                 check_offload_flags(parse({"-w", "0"}), true), exit(0)),
                ExitedWithCode(0), "");
    EXPECT_EXIT(parse({"--shard-group", "0"}), ExitedWithCode(2), "--shard-group 0: expected all, node or a number of ranks in \\[1, 1048576\\]");
    EXPECT_EXIT(config_from_descriptor("L=2,X=3", new GPT2Config), ExitedWithCode(2), "unknown model descriptor key 'X'");
    EXPECT_EXIT(config_from_descriptor("L=2,NH=3,C=8", new GPT2Config), ExitedWithCode(2), "C=8 is not a multiple of NH=3");
}

// What --shard-group asks of the world it runs in (train/flags.h's zero_flags_error): a
// divisor of the ranks; `node` only where every node holds as many consecutive ranks
TEST(Flags, ShardGroupMustSplitTheWorld) {
    TrainConfig c = parse({"-z", "1", "--shard-group", "2"});
    EXPECT_EQ(zero_flags_error(c, 4, 0), "");
    EXPECT_EQ(shard_group_ranks(c, 4, 0), 2);
    EXPECT_EQ(zero_flags_error(c, 3, 0), "--shard-group 2: expected a divisor of the 3 rank(s), each group a replica");
    EXPECT_EQ(zero_flags_error(c, 1, 0), "--shard-group 2: expected a divisor of the 1 rank(s), each group a replica");
    c = parse({"-z", "3", "--shard-group", "node"});
    EXPECT_EQ(shard_group_ranks(c, 16, 8), 8);
    EXPECT_EQ(zero_flags_error(c, 16, 8), "");
    EXPECT_EQ(zero_flags_error(c, 16, 0).rfind("--shard-group node: the nodes hold different numbers of ranks", 0), 0u);
    EXPECT_EQ(shard_group_ranks(parse({"-z", "2"}), 4, 0), 0) << "one group of all ranks by default";
    EXPECT_EQ(shard_group_ranks(parse({"-z", "2", "--shard-group", "4"}), 4, 0), 0) << "a group of all ranks is one group";
    EXPECT_EQ(shard_group_ranks(parse({"--shard-group", "2"}), 4, 0), 0) << "stage 0 shards nothing";
}

// How the ranks sit on nodes, from made-up placements (node_of[r]: the node rank r runs on): each
// rank's view of its node as MPI's shared-memory split gives it, agreed over the ranks as
// zero/comm_mpi.h's node_ranks() agrees it
std::vector<Communicator::NodeRanks> nodes_seen(const std::vector<int>& node_of) {
    const int world = (int)node_of.size();
    std::vector<int> here(world, 0), lowest(world, world), highest(world, -1);
    for (int r = 0; r < world; r++)
        for (int q = 0; q < world; q++)
            if (node_of[q] == node_of[r]) here[r]++, lowest[r] = std::min(lowest[r], q), highest[r] = std::max(highest[r], q);
    bool blocks = true;
    for (int r = 0; r < world; r++) blocks &= node_is_a_block(r, here[r], lowest[r], highest[r]);
    std::vector<Communicator::NodeRanks> seen;
    for (int r = 0; r < world; r++) seen.push_back(node_ranks_agreed(here[r], *std::min_element(here.begin(), here.end()), *std::max_element(here.begin(), here.end()), blocks));
    return seen;
}
std::string said(const std::vector<Communicator::NodeRanks>& seen) {
    std::string s;
    for (const Communicator::NodeRanks& n : seen) s += std::to_string(n.here) + "/" + std::to_string(n.per_node) + " ";
    return s;
}
// Ranks per node only where every node holds as many consecutive ranks (mpirun's default
// placement), which --shard-group node then takes as the group
TEST(NodeRanks, PerNodeOnlyWhereEveryNodeHoldsAsManyConsecutiveRanks) {
    EXPECT_EQ(said(nodes_seen({0, 0, 1, 1})), "2/2 2/2 2/2 2/2 ") << "2 nodes of 2";
    EXPECT_EQ(said(nodes_seen({0, 0, 0})), "3/3 3/3 3/3 ") << "one node";
    EXPECT_EQ(said(nodes_seen({0, 0, 0, 0, 1, 1})), "4/0 4/0 4/0 4/0 2/0 2/0 ") << "a node of 4 and one of 2";
    EXPECT_EQ(said(nodes_seen({0, 0, 1, 1, 1, 1})), "2/0 2/0 4/0 4/0 4/0 4/0 ") << "a node of 2 and one of 4";
    EXPECT_EQ(said(nodes_seen({0, 1, 0, 1})), "2/0 2/0 2/0 2/0 ") << "round robin: nodes of 2, not consecutive";
    const TrainConfig by_node = parse({"-z", "3", "--shard-group", "node"});
    EXPECT_EQ(shard_group_ranks(by_node, 4, nodes_seen({0, 0, 1, 1})[0].per_node), 2);
    EXPECT_EQ(zero_flags_error(by_node, 6, nodes_seen({0, 0, 0, 0, 1, 1})[0].per_node).rfind("--shard-group node: the nodes hold different numbers of ranks", 0), 0u);
}
// --plan runs without MPI: where mpirun started it, OpenMPI's variables say how many ranks share
// this node (here 2 of 4), and --shard-group node is planned as groups of 2
TEST(NodeRanks, FromTheLaunchersVariablesBeforeMpiStarts) {
    const char* names[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK"};
    std::vector<std::string> saved;
    for (const char* n : names) saved.push_back(getenv(n) ? getenv(n) : "");
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    const LauncherPlace place = launcher_place();
    EXPECT_TRUE(place.by_mpirun);
    EXPECT_EQ(place.world, 4);
    EXPECT_EQ(place.rank, 3);
    EXPECT_EQ(place.node_ranks, 2);
    const TrainConfig cfg = parse({"-z", "3", "--shard-group", "node", "-e", "L=1,NH=2,C=32", "-t", "16"});
    EXPECT_EQ(resolve_run(cfg, false, place.world, place.node_ranks, 0).shard_group, 2);
    for (int i = 0; i < 3; i++) {
        if (saved[i].empty()) unsetenv(names[i]);
        else setenv(names[i], saved[i].c_str(), 1);
    }
    EXPECT_EQ(launcher_place().world, saved[0].empty() ? 1 : atoi(saved[0].c_str())) << "a process mpirun did not start is rank 0 of 1";
}

// On a GPU the host memory of every rank on a node comes from the node's: 8 ranks offloading
// 80 GiB each do not fit 512 GiB, though each alone would; an async checkpoint's copy counts too
TEST(HostMemory, TheRanksOfANodeShareIt) {
    MemoryUse m;
    m.zero.host_optimizer = (size_t)80 << 30;
    RunShape shape{};
    shape.offload = true;
    bool fits = false;
    const size_t node = (size_t)512 << 30;
    EXPECT_EQ(host_memory_words(m, 3, 8 * m.zero.host_optimizer, 8, shape, node, &fits),
              "host memory: 8 rank(s) on this node need 640.00 GiB (rank 3: optimizer 80.00 GiB), 512.00 GiB available on this machine: does not fit; "
              "use fewer ranks per node, more ranks at -z 1 or above (each holds its shard of the offloaded state) or --offload none");
    EXPECT_FALSE(fits);
    host_memory_words(m, 3, 6 * m.zero.host_optimizer, 6, shape, node, &fits);
    EXPECT_TRUE(fits) << "6 x 80 GiB in 512";
    m.checkpoint = (size_t)80 << 30;
    shape.async_checkpoint = true;
    EXPECT_EQ(host_memory_words(m, 0, (size_t)160 << 30, 1, shape, (size_t)128 << 30, &fits),
              "host memory: 1 rank(s) on this node need 160.00 GiB (rank 0: optimizer 80.00 GiB, checkpoint 80.00 GiB), 128.00 GiB available on this "
              "machine: does not fit; use more ranks at -z 1 or above (each holds its shard of the offloaded state), --offload none or --async-checkpoint 0");
    EXPECT_FALSE(fits);
    host_memory_words(m, 0, (size_t)160 << 30, 1, shape, 0, &fits);
    EXPECT_TRUE(fits) << "available memory not known: nothing is refused";
}

// --plan on a GPU sums the node's ranks as each holds its own: at stage 0 only rank 0 writes a
// checkpoint, so only it holds an async save's copy; 8 ranks of d48 need that copy once
TEST(HostMemory, PlanSumsWhatEachRankOfTheNodeHolds) {
    const TrainConfig cfg = parse({"--plan", "-e", "L=2,NH=2,C=32", "-t", "16", "-b", "1", "-z", "0", "--async-checkpoint", "1", "-o", "unused"});
    GPT2Config mc;
    config_from_descriptor(cfg.init, &mc);
    const RunShape shape = run_shape(cfg, mc, 1, 16, 8, 0);
    const size_t rank0 = plan_memory<CpuBackend>(shape, 0).checkpoint, rank1 = plan_memory<CpuBackend>(shape, 1).checkpoint;
    // staging: the largest tensor (the token embedding, Vp x C) in fp32, under the 32 MiB cap
    const size_t staging = (size_t)mc.padded_vocab_size * mc.channels * 4;
    EXPECT_EQ(rank0, staging + ParamLayout(mc).total * 12) << "rank 0: staging and its copy (fp32: parameters, m, v)";
    EXPECT_EQ(rank1, staging) << "rank 1 writes nothing at stage 0: staging only (for a load)";
}

// int8 weights are for stage 3's gathers only
TEST(Flags, QuantizedWeightsNeedStage3) {
    EXPECT_EQ(zero_flags_error(parse({"-z", "3", "--quantize-weights", "int8"}), 2, 0), "");
    for (const char* stage : {"0", "1", "2"})
        EXPECT_EQ(zero_flags_error(parse({"-z", stage, "--quantize-weights", "int8"}), 2, 0),
                  std::string("--quantize-weights int8: only stage 3 gathers parameters (-z 3); this run is -z ") + stage);
}

// int8 gradients replace a reduce-scatter, which stage 0 does not have
TEST(Flags, QuantizedGradientsNeedStage1To3) {
    for (const char* stage : {"1", "2", "3"}) EXPECT_EQ(zero_flags_error(parse({"-z", stage, "--quantize-grads", "int8"}), 2, 0), "");
    EXPECT_EQ(zero_flags_error(parse({"-z", "0", "--quantize-grads", "int8"}), 2, 0),
              "--quantize-grads int8: stage 0 all-reduces gradients, it has no reduce-scatter to quantize; use -z 1, 2 or 3");
}

// --device-memory's sizes: decimal and binary units, a bare number of bytes; nothing else
TEST(Flags, DeviceMemorySizes) {
    size_t bytes = 0;
    const std::vector<std::pair<const char*, size_t>> sizes = {{"80GiB", 80ull << 30}, {"24GB", 24000000000ull}, {"512MiB", 512ull << 20},
                                                               {"1.5TiB", 3ull << 39}, {"100KB", 100000}, {"4096", 4096}, {"7B", 7}};
    for (const auto& [text, want] : sizes) EXPECT_TRUE(parse_size(text, &bytes) && bytes == want) << text << " -> " << bytes;
    for (const char* bad : {"", "GiB", "80 GiB", "80gib", "-1GiB", "0", "nan", "inf"}) EXPECT_FALSE(parse_size(bad, &bytes)) << bad;
    EXPECT_EQ(parse({"-b", "auto"}).B, kAutoBatch);
}

// The documented flags (README's table; ranges the README leaves unsaid are written here), spelled
// out in the test rather than read from the parser's table, so that a wrong entry there fails.
// Adding a flag to the parser means adding its row here (the --help test fails until then) and
// its field to describe() below. Per row: short name ("" if none), long name, values accepted
// (the ends of a range, or every allowed word), values refused (just outside the range, and
// something that is not a number).
struct DocumentedFlag {
    const char* short_name;
    const char* long_name;
    std::vector<const char*> accepted, refused;
};
const std::vector<DocumentedFlag> kDocumentedFlags = {
    {"-i", "--train", {"a*.bin"}, {}},
    {"-j", "--val", {"v.bin"}, {}},
    {"-e", "--init", {"d6"}, {}},
    {"-o", "--output", {"dir"}, {}},
    {"", "--tokenizer", {"t.bin"}, {}},
    {"-b", "--batch", {"1", "65536", "auto"}, {"0", "65537", "4x", "Auto"}},
    {"-t", "--seq-len", {"0", "1048576"}, {"-1", "1048577", "x"}},
    {"-d", "--total-batch", {"0", "1000000000000"}, {"-1", "1000000000001", "1e3"}},
    {"-x", "--max-steps", {"-1", "0", "1000000000"}, {"-2", "1000000001", "1.5"}},
    {"-l", "--lr", {"0", "10"}, {"-1e-9", "10.001", "nan"}},
    {"-u", "--warmup", {"0", "1000000000"}, {"-1", "1000000001", "x"}},
    {"-q", "--final-lr-frac", {"0", "1"}, {"-0.001", "1.001", "x"}},
    {"-k", "--schedule", {"cosine", "linear", "constant", "wsd"}, {"step"}},
    {"", "--wsd-decay-frac", {"0", "1"}, {"-0.001", "1.001", "x"}},
    {"-c", "--weight-decay", {"0", "10"}, {"-0.001", "10.001", "x"}},
    {"-sl", "--skip-loss-z", {"0", "1000000000"}, {"-0.001", "1000000001", "x"}},
    {"-sg", "--skip-grad-z", {"0", "1000000000"}, {"-0.001", "1000000001", "x"}},
    {"", "--nonfinite-limit", {"1", "1000000000"}, {"0", "1000000001", "x"}},
    {"-v", "--val-every", {"0", "1000000000"}, {"-1", "1000000001", "x"}},
    {"-m", "--val-steps", {"-1", "0", "1", "1000000000"}, {"-2", "1000000001", "x"}},
    {"-h", "--hellaswag", {"0", "1"}, {"-1", "2", "x"}},
    {"", "--hellaswag-file", {"h.bin"}, {}},
    {"", "--hellaswag-dump", {"d.txt"}, {}},
    {"-s", "--sample-every", {"0", "1000000000"}, {"-1", "1000000001", "x"}},
    {"-g", "--gen-len", {"1", "1048576"}, {"0", "1048577", "x"}},
    {"-a", "--overfit", {"0", "1"}, {"-1", "2", "x"}},
    {"-n", "--checkpoint-every", {"0", "1000000000"}, {"-1", "1000000001", "x"}},
    {"-nk", "--checkpoints-keep", {"0", "1000000000"}, {"-1", "1000000001", "x"}},
    {"-nm", "--major-every", {"0", "1000000000"}, {"-1", "1000000001", "x"}},
    {"-y", "--resume", {"0", "1"}, {"-1", "2", "x"}},
    {"", "--shuffle", {"0", "1"}, {"-1", "2", "x"}},
    {"-z", "--zero", {"0", "3"}, {"-1", "4", "x"}},
    {"", "--offload", {"none", "cpu"}, {"nvme", "gpu"}},
    {"", "--shard-group", {"all", "node", "1", "1048576"}, {"0", "1048577", "-1", "x", "2.5"}},
    {"", "--quantize-weights", {"none", "int8"}, {"int4", "fp8"}},
    {"", "--quantize-grads", {"none", "int8"}, {"int4", "fp8"}},
    {"", "--fp8", {"none", "e4m3"}, {"e5m2", "E4M3", "1"}},
    {"-r", "--recompute", {"0", "2"}, {"-1", "3", "x"}},
    {"", "--cuda-graph", {"0", "1"}, {"-1", "2", "x"}},
    {"", "--gemm-algos", {"gemm.txt"}, {}},
    {"-w", "--master-weights", {"0", "1"}, {"-1", "2", "x"}},
    {"-f", "--tf32", {"0", "1"}, {"-1", "2", "x"}},
    {"-ge", "--gelu-fusion", {"0", "2"}, {"-1", "3", "x"}},
    {"-pn", "--num-processes", {"0", "1048576"}, {"-1", "1048577", "x"}},
    {"-pr", "--process-rank", {"-1", "1048576"}, {"-2", "1048577", "x"}},
    {"-pg", "--gpus-per-node", {"1", "1048576"}, {"0", "1048577", "x"}},
    {"-pi", "--init-method", {"mpi"}, {"tcp", "fs"}},
    {"-ps", "--server-ip", {"10.0.0.1"}, {}},
    {"-pf", "--fs-path", {"/shared/x"}, {}},
    {"", "--seed", {"0", "4294967295"}, {"-1", "4294967296", "x"}},
    {"", "--beta1", {"0", "0.999999"}, {"-0.001", "1", "x"}},
    {"", "--beta2", {"0", "0.999999"}, {"-0.001", "1", "x"}},
    {"", "--eps", {"1e-30", "1"}, {"0", "1.001", "x"}},
    {"", "--grad-clip", {"0", "1000000000"}, {"-0.001", "1000000001", "x"}},
    {"", "--device", {"cpu", "cuda", "auto"}, {"tpu"}},
    {"", "--device-memory", {"80GiB", "24GB", "512MiB", "1.5TiB", "1073741824"}, {"0", "-1GiB", "80XB", "GiB", "x"}},
    {"", "--quiet", {"0", "1"}, {"-1", "2", "x"}},
    {"", "--collective-timeout", {"0", "10000000"}, {"-1", "10000001", "x"}},
    {"", "--async-checkpoint", {"0", "1"}, {"-1", "2", "x"}},
};
// listed in --help besides the rows above, taking no value: --help (so is -h without one), --plan
const std::vector<std::string> kValuelessFlags = {"--help", "--plan"};

// every field of TrainConfig, so two configs can be compared whole
std::string describe(const TrainConfig& c) {
    std::ostringstream s;
    s << c.train_data << '|' << c.val_data << '|' << c.tokenizer << '|' << c.init << '|' << c.output_dir << '|' << c.B << '|'
      << c.T << '|' << c.total_batch << '|' << c.max_steps << '|' << c.lr << '|' << c.warmup << '|' << c.final_lr_frac << '|'
      << c.schedule << '|' << c.wsd_decay_frac << '|' << c.weight_decay << '|' << c.val_every << '|' << c.val_steps << '|'
      << c.hellaswag << '|' << c.hellaswag_file << '|' << c.hellaswag_dump << '|' << c.sample_every << '|' << c.gen_len << '|' << c.overfit << '|' << c.checkpoint_every << '|' << c.resume << '|'
      << c.zero_stage << '|' << c.offload << '|' << c.shard_group << '|' << c.quantize_weights << '|' << c.quantize_grads << '|' << c.fp8 << '|' << c.recompute << '|' << c.cuda_graph << '|' << c.gemm_algos << '|' << c.seed << '|' << c.beta1 << '|' << c.beta2 << '|' << c.eps << '|'
      << c.grad_clip << '|' << c.device << '|' << c.quiet << '|' << c.skip_loss_z << '|' << c.skip_grad_z << '|'
      << c.checkpoints_keep << '|' << c.major_every << '|' << c.shuffle << '|' << c.master_weights << '|' << c.tf32 << '|'
      << c.gelu_fusion << '|' << c.num_processes << '|' << c.process_rank << '|' << c.gpus_per_node << '|' << c.init_method
      << '|' << c.server_ip << '|' << c.fs_path << '|' << c.nonfinite_limit << '|' << c.device_memory << '|' << c.plan << '|' << c.collective_timeout << '|' << c.async_checkpoint;
    return s.str();
}

// both names accept the ends of the documented range and refuse what lies outside it
TEST(Flags, DocumentedRangesAreEnforced) {
    for (const DocumentedFlag& f : kDocumentedFlags)
        for (const char* name : {f.short_name, f.long_name}) {
            if (*name == '\0') continue;
            for (const char* v : f.accepted) {  // in a child, so that a refusal fails here and ends nothing else
                EXPECT_EXIT((parse({name, v}), exit(0)), ExitedWithCode(0), "") << name << " " << v << " refused";
            }
            for (const char* v : f.refused) {
                EXPECT_EXIT(parse({name, v}), ExitedWithCode(2), "expected") << name << " " << v;
            }
        }
}

// a short name sets what its long name sets, and that is not nothing
TEST(Flags, LongNamesMatchShortOnes) {
    const std::string defaults = describe(TrainConfig{});
    for (const DocumentedFlag& f : kDocumentedFlags) {
        bool changes_something = false;
        for (const char* v : f.accepted) {
            const std::string by_long = describe(parse({f.long_name, v}));
            if (*f.short_name) {
                EXPECT_EQ(describe(parse({f.short_name, v})), by_long) << f.short_name << " vs " << f.long_name;
            }
            changes_something |= by_long != defaults;
        }
        // -pi has one value, llm.c's default (mpi): accepting it is all there is to check
        EXPECT_TRUE(changes_something || std::string(f.long_name) == "--init-method") << f.long_name << " changes no field";
    }
}

// --help lists exactly the documented flags, each with its short and long name together
TEST(Flags, HelpListsTheDocumentedFlags) {
    char* text = nullptr;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    print_usage(out);
    fclose(out);
    std::istringstream help(text);
    free(text);
    std::vector<std::string> listed, documented = kValuelessFlags;
    for (std::string line; std::getline(help, line);) {
        std::istringstream words(line);
        std::string word, names;
        while (words >> word && word[0] == '-') names += (names.empty() ? "" : " ") + word;
        if (!names.empty()) listed.push_back(names);
    }
    for (const DocumentedFlag& f : kDocumentedFlags) documented.push_back(*f.short_name ? std::string(f.short_name) + " " + f.long_name : f.long_name);
    std::sort(listed.begin(), listed.end());
    std::sort(documented.begin(), documented.end());
    EXPECT_EQ(listed, documented);
}

// The flags of llm.c's scripts/run_gpt2_124M.sh .. run_gpt2_1558M.sh and run_gpt3_125M.sh, as
// they are written there, land with llm.c's meaning.
TEST(Flags, LlmcRunScriptsAreAccepted) {
    const std::vector<std::string> common = {"-i", "dev/data/fineweb10B/fineweb_train_*.bin", "-j", "dev/data/fineweb10B/fineweb_val_*.bin",
                                             "-o", "log_gpt2_124M", "-v", "250", "-s", "20000", "-g", "144", "-h", "1", "-b", "64", "-t", "1024",
                                             "-d", "524288", "-r", "0", "-z", "1", "-c", "0.1", "-l", "0.0006", "-q", "0.0", "-u", "700",
                                             "-n", "5000", "-y", "1", "-e", "d12"};
    TrainConfig c = parse(common);
    EXPECT_EQ(std::vector<long>({c.val_every, c.sample_every, c.gen_len, c.hellaswag, c.B, c.T, c.total_batch, c.recompute,
                                 c.zero_stage, c.warmup, c.checkpoint_every, c.resume}),
              std::vector<long>({250, 20000, 144, 1, 64, 1024, 524288, 0, 1, 700, 5000, 1}));
    EXPECT_EQ(std::vector<float>({c.weight_decay, c.lr, c.final_lr_frac}), std::vector<float>({0.1f, 0.0006f, 0.0f}));
    std::vector<std::string> more = common;  // 350M: rank flags; 1558M: -k, -ge; GPT-3: -nk -nm -sl -sg, gpt3:c768
    for (const char* f : {"-x", "60000", "-pn", "8", "-pr", "0", "-k", "cosine", "-ge", "1", "-nk", "5", "-nm", "2000", "-sl", "5.0",
                          "-sg", "5.0", "-e", "gpt3:c768"})
        more.push_back(f);
    c = parse(more);
    EXPECT_EQ(std::vector<long>({c.max_steps, c.num_processes, c.process_rank, c.gelu_fusion, c.checkpoints_keep, c.major_every}),
              std::vector<long>({60000, 8, 0, 1, 5, 2000}));
    EXPECT_EQ(std::vector<float>({c.skip_loss_z, c.skip_grad_z}), std::vector<float>({5.0f, 5.0f}));
    EXPECT_EQ(c.init, "gpt3:c768");
    EXPECT_TRUE(given(c, "-ge"));
    EXPECT_FALSE(given(c, "-w"));
    EXPECT_EXIT(parse({"-pi", "tcp"}), ExitedWithCode(2), "-pi tcp: expected mpi");
    // llm.c's defaults where its meaning applies here; -u's 0 where llm.c's runs start, from a
    // checkpoint (test Training.WarmupByDefaultOnlyFromRandomWeights: what the run makes of -1)
    TrainConfig d;
    EXPECT_EQ(std::vector<long>({d.B, d.checkpoint_every, d.checkpoints_keep, d.major_every, d.resume, d.val_every, d.val_steps,
                                 d.sample_every, d.gen_len, d.recompute, d.zero_stage, d.master_weights, d.warmup}),
              std::vector<long>({4, 0, 0, 0, 0, 20, 20, 20, 64, 1, 0, 1, -1}));
    EXPECT_EQ(std::vector<float>({d.lr, d.final_lr_frac, d.weight_decay, d.skip_loss_z, d.skip_grad_z}),
              std::vector<float>({3e-4f, 1.0f, 0.0f, 0.0f, 0.0f}));
}

// Shapes as llm.c's gpt2_set_hyperparameters / gpt3_set_hyperparameters derive them; parameter
// counts (padded vocabulary) as llm.c prints them for GPT-2 124M and 1558M.
TEST(Descriptors, AsLlmcDerivesThem) {
    struct Want { const char* desc; int L, NH, C, maxT; size_t params; };
    const Want wants[] = {{"d12", 12, 12, 768, 1024, 124475904}, {"gpt2:d12", 12, 12, 768, 1024, 124475904},
                          {"gpt2:d48", 48, 25, 1600, 1024, 1557686400}, {"d24", 24, 16, 1024, 1024, 0}, {"d84", 84, 36, 3456, 1024, 0},
                          {"gpt3:c768", 12, 12, 768, 2048, 124475904 + 1024 * 768}, {"gpt3:c2048", 24, 16, 2048, 2048, 0},
                          {"gpt3:c2560", 32, 32, 2560, 2048, 0}, {"gpt3:c12288", 96, 96, 12288, 2048, 0}};
    for (const Want& w : wants) {
        GPT2Config c;
        ASSERT_TRUE(config_from_descriptor(w.desc, &c)) << w.desc;
        EXPECT_EQ(std::vector<int>({c.num_layers, c.num_heads, c.channels, c.max_seq_len, c.vocab_size, c.padded_vocab_size}),
                  std::vector<int>({w.L, w.NH, w.C, w.maxT, 50257, 50304})) << w.desc;
        if (w.params) {
            EXPECT_EQ(ParamLayout(c).total, w.params) << w.desc;
        }
    }
    GPT2Config c;
    EXPECT_FALSE(config_from_descriptor("d12.bin", &c)) << "a file name";
    EXPECT_FALSE(config_from_descriptor("data/model.bin", &c));
    EXPECT_EXIT(config_from_descriptor("d13", &c), ExitedWithCode(2), "no GPT-2 of that depth");
    EXPECT_EXIT(config_from_descriptor("gpt3:c1000", &c), ExitedWithCode(2), "no GPT-3 with that channel count");
    EXPECT_EXIT(config_from_descriptor("gpt3:c5140", &c), ExitedWithCode(2), "5140 channels are not a whole number of heads of 128");
}

// z-score of the last value against the window of the last 128 (it included), two-pass in long
// double: the reference for the detector
double reference_z(const std::vector<double>& window) {
    long double mean = 0, var = 0;
    for (double v : window) mean += v;
    mean /= window.size();
    for (double v : window) var += (v - mean) * (v - mean);
    return (double)((window.back() - mean) / std::sqrt(var / window.size()));
}

// The watchdog's wait: what finishes within the timeout (and a wait's allowance beyond it) is
// waited for; what does not ends the process with one line naming the wait, the rank and the run's
// activity. Death tests: the job's end is an exit.
// the process's watchdog set for a test, and its timeout and activity as they were after it
struct WatchdogForTest {
    const double saved_timeout = watchdog().timeout();
    WatchdogForTest(double timeout, int rank, const char* activity) {
        watchdog().set_timeout(timeout);
        watchdog().set_rank(rank);
        watchdog().set_activity(activity);
    }
    ~WatchdogForTest() {
        watchdog().set_timeout(saved_timeout);
        watchdog().set_activity("");
    }
};

TEST(Watchdog, WaitsWithinTheTimeoutAndItsAllowanceThenEndsTheJob) {
    const WatchdogForTest set(0.2, 3, "step 7");
    Watchdog& w = watchdog();
    const auto after = [](double seconds) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        return [until] { return std::chrono::steady_clock::now() >= until; };
    };
    int polled = 0;
    w.wait([&] { return ++polled >= 3; }, [] { return std::string("a test"); });
    EXPECT_EQ(polled, 3) << "done() is polled until it says so";
    w.wait(after(0.4), [] { return std::string("a test"); }, 30.0);  // past the timeout, well within the allowance
    // the job's end aborts every source (a communicator that can be aborted, NCCL's), once the line is said
    const int quiet = w.add_source({[] { return std::string(); }, [] { return std::string(); }, [] { fprintf(stderr, "quiet source aborted\n"); }, {}});
    EXPECT_EXIT(w.wait(after(60), [] { return std::string("the never-ending test"); }), ::testing::ExitedWithCode(1),
                "error: rank 3 on [^ ]+: waited [0-9]+\\.[0-9] s for the never-ending test, during step 7, more than --collective-timeout 0\\.2 allows.*\nquiet source aborted");
    // a source's error ends the wait at once, aborting every source
    const int erring = w.add_source({[] { return std::string("NCCL reported an error"); }, [] { return std::string("an all-gather"); },
                                     [] { fprintf(stderr, "erring source aborted\n"); }, {}});
    EXPECT_EXIT(w.wait(after(60), [] { return std::string("the GPU"); }, 1e9), ::testing::ExitedWithCode(1),
                "error: rank 3 on [^ ]+: NCCL reported an error, after [0-9]+\\.[0-9] s waiting for the GPU \\(in flight: an all-gather\\), during step 7"
                ".*\nquiet source aborted\nerring source aborted");
    w.remove_source(erring);
    w.remove_source(quiet);
}

// a source for the watchdog's thread: no error, an all-gather in flight, its oldest collective's age
Watchdog::Source watched_source(std::function<double()> oldest) {
    return Watchdog::Source{[] { return std::string(); }, [] { return std::string("an all-gather of 1.00 MiB among all ranks (2 rank(s))"); },
                            [] {}, std::move(oldest)};
}

// At --collective-timeout 0 there is no deadline: the thread ends nothing, however old a
// collective (it still ticks, once a second)
TEST(Watchdog, ItsThreadDoesNothingWithoutATimeout) {
    const WatchdogForTest set(0, 2, "step 4");
    EXPECT_EXIT(
        {
            const int ancient = watchdog().add_source(watched_source([] { return 1e9; }));
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
            watchdog().remove_source(ancient);
            exit(0);
        },
        ::testing::ExitedWithCode(0), "");
}

// A source removed while the thread asks it is not removed until the thread has its answer: the
// communicator behind it may be destroyed as soon as remove_source returns
TEST(Watchdog, RemovingASourceWaitsForTheThreadAskingIt) {
    const WatchdogForTest set(100, 2, "step 4");
    Watchdog& w = watchdog();
    const int stays = w.add_source(watched_source([] { return 0.0; }));  // the thread runs on after the removal
    std::atomic<int> asked{0};  // 1: being asked, 2: answered
    const int slow = w.add_source(watched_source([&asked] {
        asked = 1;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        asked = 2;
        return 0.0;
    }));
    while (asked.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // within a second, the thread's tick
    w.remove_source(slow);
    EXPECT_EQ(asked.load(), 2) << "remove_source returned while the thread was still asking the source";
    w.remove_source(stays);
}

// The watchdog's own thread: while the main thread is stopped where no wait polls (a kernel
// launch blocked behind a collective that never ends, here a sleep), a source whose oldest
// unfinished collective is older than the timeout ends the job with one line; a young one, or
// none, does not.
TEST(Watchdog, ItsThreadEndsTheJobWhenACollectiveOutlivesTheTimeout) {
    const WatchdogForTest set(0.3, 2, "step 4");
    Watchdog& w = watchdog();
    const auto source = watched_source;
    const int young = w.add_source(source([] { return 0.1; }));  // always just queued
    std::this_thread::sleep_for(std::chrono::milliseconds(900));  // three timeouts: it stays
    w.remove_source(young);
    const int none = w.add_source(source([] { return 0.0; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    w.remove_source(none);
    EXPECT_EXIT(
        {
            const auto queued = std::chrono::steady_clock::now();
            w.add_source(source([queued] { return seconds_since(queued); }));
            std::this_thread::sleep_for(std::chrono::seconds(60));  // the main thread, blocked
        },
        ::testing::ExitedWithCode(1),
        "error: rank 2 on [^ ]+: a collective queued [0-9]+\\.[0-9] s ago has not finished \\(in flight: an all-gather of 1\\.00 MiB among all ranks "
        "\\(2 rank\\(s\\)\\)\\), during step 4, more than --collective-timeout 0\\.3 allows");
}

TEST(OutlierDetector, ZScoreOverTheLast128Values) {
    OutlierDetector d;
    std::mt19937 rng(3);
    std::vector<double> seen;
    for (int i = 0; i < 400; i++) {
        const double v = 3.0 + (rng() % 1000) / 1000.0 + i * 1e-3;  // noise on a slow drift
        seen.push_back(v);
        const double z = d.update(v, 0.0);
        if (i < OutlierDetector::kWindow) {
            EXPECT_TRUE(std::isnan(z)) << "still filling at " << i;
        } else {
            std::vector<double> window(seen.end() - OutlierDetector::kWindow, seen.end());
            EXPECT_NEAR(z, reference_z(window), 1e-9) << i;
        }
    }
}

// an outlier over the threshold stays out of the window, so the next value is judged as if it
// had never come; the third in a row goes in; threshold 0 lets everything in
TEST(OutlierDetector, OutliersStayOutOfTheWindowUntilTheThirdInARow) {
    auto fill = [](OutlierDetector& d) {
        for (int i = 0; i < 200; i++) d.update(1.0 + 0.01 * (i % 10), 3.0);
    };
    OutlierDetector with, without, open;
    fill(with), fill(without), fill(open);
    EXPECT_GT(with.update(50.0, 3.0), 3.0);
    EXPECT_EQ(with.update(1.02, 3.0), without.update(1.02, 3.0)) << "the outlier must not have entered the window";
    EXPECT_GT(open.update(50.0, 0.0), 3.0);
    EXPECT_NE(open.update(1.02, 0.0), without.update(1.02, 3.0) + 0.0) << "threshold 0 keeps the outlier in";

    OutlierDetector three, only_third;
    fill(three), fill(only_third);
    three.update(50.0, 3.0), three.update(50.0, 3.0), three.update(50.0, 3.0);
    only_third.update(50.0, 0.0);
    EXPECT_EQ(three.update(1.0, 3.0), only_third.update(1.0, 3.0)) << "two kept out, the third in";

    OutlierDetector restored;  // the state is all of it
    ASSERT_TRUE(restored.restore(three.state()));
    for (double v : {1.0, 7.0, 1.03, 60.0}) EXPECT_EQ(restored.update(v, 3.0), three.update(v, 3.0));
    OutlierDetector::State bad = three.state();
    bad.next = OutlierDetector::kWindow;
    EXPECT_FALSE(restored.restore(bad));
}

// NaN and infinities never join the window (one would make every later z-score NaN), and a
// state holding one is not a state the detector could have been in
TEST(OutlierDetector, NonFiniteValuesNeverJoinTheWindow) {
    OutlierDetector d, clean;
    for (int i = 0; i < 200; i++) d.update(1.0 + 0.01 * (i % 10), 0.0), clean.update(1.0 + 0.01 * (i % 10), 0.0);
    for (double v : {(double)NAN, (double)INFINITY, -(double)INFINITY}) EXPECT_TRUE(std::isnan(d.update(v, 0.0))) << v;
    const OutlierDetector::State a = d.state(), b = clean.state();
    EXPECT_EQ(0, memcmp(&a, &b, sizeof(a))) << "a non-finite value changed the window";
    EXPECT_TRUE(std::isfinite(d.update(1.02, 0.0)));
    OutlierDetector::State bad = clean.state();
    bad.values[5] = NAN;
    EXPECT_FALSE(d.restore(bad));
}

TEST(RunDir, CheckpointFilesAndLlmcRetirementRule) {
    const std::string dir = temp_dir();
    for (int n : {2, 4, 6}) fclose(open_file(checkpoint_path(dir, "model", n), "w"));
    for (int n : {2, 4}) fclose(open_file(checkpoint_path(dir, "state", n), "w"));
    write_done(dir, 2), write_done(dir, 4);
    remove(checkpoint_path(dir, "state", 4).c_str());
    EXPECT_EQ(latest_checkpoint(dir), 2) << "4 lacks its state, 6 its DONE file";
    fclose(open_file(checkpoint_path(dir, "state", 6), "w"));
    fclose(open_file(checkpoint_path(dir, "DONE", 6) + ".tmp", "w"));
    EXPECT_EQ(latest_checkpoint(dir), 2) << "DONE_00000006.tmp is a DONE file not yet written";
    EXPECT_EQ(checkpoint_path(dir, "DONE", 18865), dir + "/DONE_00018865");
    fclose(open_file(dir + "/model_00000008.bin.tmp", "w"));
    remove_partial_writes(dir);
    EXPECT_FALSE(file_exists(dir + "/model_00000008.bin.tmp"));
    EXPECT_TRUE(file_exists(checkpoint_path(dir, "model", 6)));
    remove_checkpoint(dir, 2);
    EXPECT_EQ(latest_checkpoint(dir), 0);
    // llm.c: after the checkpoint at step s, delete s - keep*every unless it is <= 0 or major
    EXPECT_EQ(checkpoint_to_delete(5000, 1000, 2, 0), 3000);
    EXPECT_EQ(checkpoint_to_delete(5000, 1000, 2, 2000), 3000);
    EXPECT_EQ(checkpoint_to_delete(5000, 1000, 2, 3000), 0);
    EXPECT_EQ(checkpoint_to_delete(2000, 1000, 2, 0), 0);
    EXPECT_EQ(checkpoint_to_delete(5000, 1000, 0, 0), 0);
    EXPECT_EQ(checkpoint_to_delete(5000, 0, 2, 0), 0) << "-n 0: the final checkpoint is the only one";
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

std::string read_text(const std::string& path) {
    std::vector<char> bytes = read_bytes(path);
    return std::string(bytes.begin(), bytes.end());
}

// A run killed after its checkpoint at step 4 may leave main.log cut anywhere past the point the
// checkpoint flushed it to, mid-line too. Resumed at 4, it keeps the lines before step 4 and
// appends those from step 4 on again: at every cut position the result is the uncut log.
TEST(RunDir, ResumedLogIsWholeWhereverTheKillCutIt) {
    const std::string dir = temp_dir(), path = dir + "/main.log";
    std::string before, after;  // the lines for steps before 4, and from 4 on
    for (int step = 0; step <= 6; step++) {
        char line[128];
        std::string& part = step < 4 ? before : after;
        if (step % 2 == 0) snprintf(line, sizeof(line), "s:%d tel:%f\n", step, 10.5 - step * 0.25), part += line;
        if (step < 6) snprintf(line, sizeof(line), "s:%d trl:%f norm:%f lr:%e ms:%f tok/s:%f\n", step, 10.6 - step * 0.3, 1.5, 3e-4, 12.5, 81920.0), part += line;
    }
    const std::string whole = before + after;
    for (size_t cut = before.size(); cut <= whole.size(); cut++) {
        write_bytes(path, whole.data(), cut);
        truncate_log(path, 4);
        FILE* f = open_file(path, "a");
        fputs(after.c_str(), f);
        fclose(f);
        ASSERT_EQ(read_text(path), whole) << "cut after " << cut << " bytes: " << whole.substr(0, cut);
    }
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

TEST(Progress, DurationsEtaAndMfu) {
    EXPECT_EQ(format_duration(42.4), "42s");
    EXPECT_EQ(format_duration(75), "1m15s");
    EXPECT_EQ(format_duration(3725), "1h02m05s");
    EXPECT_DOUBLE_EQ(eta_seconds(30.0, 10, 5), 15.0);
    EXPECT_DOUBLE_EQ(flops_per_token(124475904, 12, 768, 1024), 6.0 * 124475904 + 6.0 * 12 * 768 * 1024);
}

// Peaks by whole name, as CUDA names the GPUs (dense figures of the vendors' data sheets): a name
// that contains another (L40 / L4, H100 NVL / H100) gets its own; one not in the table, or a
// part or a longer form of a name in it, none (MFU n/a).
TEST(Progress, PeakFlopsByWholeGpuName) {
    const std::vector<std::pair<const char*, double>> bf16 = {
        {"NVIDIA L4", 121}, {"NVIDIA L40", 181}, {"NVIDIA L40S", 362},
        {"NVIDIA H100 80GB HBM3", 989}, {"NVIDIA H100 PCIe", 756}, {"NVIDIA H100 NVL", 835},
        {"NVIDIA H200", 989}, {"NVIDIA H200 NVL", 835}, {"NVIDIA GH200 480GB", 989},
        {"NVIDIA A100-SXM4-40GB", 312}, {"NVIDIA A100-SXM4-80GB", 312}, {"NVIDIA A100-PCIE-40GB", 312},
        {"NVIDIA A100 80GB PCIe", 312}, {"NVIDIA GeForce RTX 4090", 165.2},
        {"Tesla T4", 0}, {"NVIDIA H100", 0}, {"H100 PCIe", 0}, {"NVIDIA L4 ", 0}, {"NVIDIA GeForce RTX 4090 D", 0}, {"", 0}};
    for (const auto& [name, tflops] : bf16) EXPECT_DOUBLE_EQ(peak_flops(name, true), tflops * 1e12) << name;
    const std::vector<std::pair<const char*, double>> fp32 = {
        {"NVIDIA L4", 30.3}, {"NVIDIA L40", 90.5}, {"NVIDIA L40S", 91.6}, {"NVIDIA H100 80GB HBM3", 67},
        {"NVIDIA H100 PCIe", 51}, {"NVIDIA H100 NVL", 60}, {"NVIDIA A100-SXM4-80GB", 19.5}, {"Tesla T4", 0}};
    for (const auto& [name, tflops] : fp32) EXPECT_DOUBLE_EQ(peak_flops(name, false), tflops * 1e12) << name;
}

TEST(Schedule, ShapesAgreeWithTheirFormulas) {
    TrainConfig c;
    c.lr = 1.0f;
    c.warmup = 10;
    c.final_lr_frac = 0.1f;
    const int steps = 110;
    EXPECT_FLOAT_EQ(learning_rate(c, 0, steps), 0.1f);  // warmup: (step+1)/warmup
    EXPECT_FLOAT_EQ(learning_rate(c, 9, steps), 1.0f);
    c.schedule = "cosine";
    EXPECT_FLOAT_EQ(learning_rate(c, 10, steps), 1.0f);
    EXPECT_NEAR(learning_rate(c, 60, steps), 0.55f, 1e-6);  // halfway: mean of peak and floor
    EXPECT_NEAR(learning_rate(c, 110, steps), 0.1f, 1e-6);
    c.schedule = "linear";
    EXPECT_NEAR(learning_rate(c, 35, steps), 1.0f - 0.25f * 0.9f, 1e-6);
    c.schedule = "constant";
    EXPECT_FLOAT_EQ(learning_rate(c, 100, steps), 1.0f);
    c.schedule = "wsd";  // stable until 80% of the post-warmup steps, then linear to the floor
    EXPECT_FLOAT_EQ(learning_rate(c, 80, steps), 1.0f);
    EXPECT_NEAR(learning_rate(c, 100, steps), 1.0f - 0.5f * 0.9f, 1e-6);
}

class Training : public ::testing::Test {};

// no resume, no reuse: two runs from the same seed give the same bits, with --fp8 too (which
// must change the model: its matmuls are another computation)
TEST_F(Training, SameSeedSameBits) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 2));
    std::vector<float> without_fp8;
    for (const char* fp8 : {"none", "e4m3"}) {
        TrainConfig cfg = tiny_config(dir + "/t.bin", 5);
        cfg.fp8 = fp8;
        auto a = train_tiny<CpuBackend>(cfg, single_comm());
        auto b = train_tiny<CpuBackend>(cfg, single_comm());
        cfg.seed = 6;
        auto c = train_tiny<CpuBackend>(cfg, single_comm());
        ASSERT_EQ(a.first.size(), 5u);
        EXPECT_EQ(0, memcmp(a.first.data(), b.first.data(), a.first.size() * sizeof(StepRecord))) << "--fp8 " << fp8;
        EXPECT_EQ(a.second, b.second) << "--fp8 " << fp8;
        EXPECT_NE(a.second, c.second) << "a different seed must give a different model";
        if (without_fp8.empty()) without_fp8 = a.second;
        else EXPECT_NE(a.second, without_fp8) << "--fp8 e4m3 trained the same model as without it";
    }
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// -y 1 continues from the latest checkpoint exactly as if the run had not stopped, shuffled data
// included, with 3 micro-batches per step: 12 windows of B*T = 32 tokens, 3 per step, so the
// resumed steps cross into epoch 2 (the data must resume 3 windows per completed step on)
// With --fp8 too: its scales come from each tensor as it is cast, so the state holds nothing more.
TEST_F(Training, ResumeContinuesBitForBit) {
    for (const char* fp8 : {"none", "e4m3"}) {
        SCOPED_TRACE(std::string("--fp8 ") + fp8);
        std::string dir = temp_dir();
        write_shard(dir + "/t.bin", random_tokens(12 * 32 + 1, 64, 4));
        TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
        cfg.fp8 = fp8;
        ASSERT_EQ(cfg.shuffle, 1) << "shuffling is on by default";
        cfg.total_batch = 3L * cfg.B * cfg.T;
        cfg.max_steps = 6;
        cfg.checkpoint_every = 3;
        cfg.schedule = "linear";  // the learning rate must pick up where it was
        cfg.final_lr_frac = 0.1f;
        cfg.output_dir = dir + "/out";
        std::vector<StepRecord> whole = train<CpuBackend>(cfg, single_comm());
        GPT2Config c;
        const std::vector<float> final_params = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
        remove(checkpoint_path(cfg.output_dir, "state", 6).c_str());  // so the latest is step 3
        cfg.resume = 1;
        std::vector<StepRecord> rest = train<CpuBackend>(cfg, single_comm());
        ASSERT_EQ(rest.size(), 3u);
        EXPECT_EQ(0, memcmp(rest.data(), whole.data() + 3, 3 * sizeof(StepRecord)));
        EXPECT_EQ(load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c), final_params);
        [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
    }
}

// -y 1 with nothing to resume starts a fresh run (llm.c's loop runs it from the start)
TEST_F(Training, ResumeWithNothingToResumeStartsFresh) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    cfg.output_dir = dir + "/fresh";
    const std::vector<StepRecord> fresh = train<CpuBackend>(cfg, single_comm());
    cfg.resume = 1;
    cfg.output_dir = dir + "/empty";
    const std::vector<StepRecord> resumed = train<CpuBackend>(cfg, single_comm());
    ASSERT_EQ(resumed.size(), fresh.size());
    EXPECT_EQ(0, memcmp(resumed.data(), fresh.data(), fresh.size() * sizeof(StepRecord)));
    EXPECT_TRUE(file_exists(checkpoint_path(cfg.output_dir, "DONE", 5)));
    cfg.output_dir = "";
    EXPECT_EXIT(train<CpuBackend>(cfg, single_comm()), ExitedWithCode(2), "-y 1 needs the output directory");
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

std::vector<std::string> read_lines(const std::string& path) {
    std::vector<std::string> lines;
    FILE* f = open_file(path, "r");
    for (char buf[512]; fgets(buf, sizeof(buf), f);) lines.push_back(buf);
    fclose(f);
    return lines;
}

// each line of main.log: the step it is for, and its kind (trl, tel)
std::vector<std::string> log_lines(const std::string& path) {
    std::vector<std::string> lines;
    for (const std::string& line : read_lines(path)) {
        char kind[8] = "";
        int step = -1;
        sscanf(line.c_str(), "s:%d %3s", &step, kind);
        lines.push_back(std::to_string(step) + " " + kind);
    }
    return lines;
}

// tiny_config over 6 steps on new training and validation shards in dir, validating on 2
// batches every `val_every` steps, writing to dir/out
TrainConfig validating_config(const std::string& dir, int val_every) {
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    write_shard(dir + "/v.bin", random_tokens(2000, 64, 5));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    cfg.val_data = dir + "/v.bin";
    cfg.val_every = val_every;
    cfg.val_steps = 2;
    cfg.max_steps = 6;
    cfg.output_dir = dir + "/out";
    return cfg;
}

// A run killed just before its last checkpoint: its log runs past the checkpoint at step 3, and
// it left a half-written file. The resumed run removes the file and appends to the log without
// repeating a step: each line once, in order.
TEST_F(Training, ResumedRunAppendsToTheLogAndClearsPartialWrites) {
    std::string dir = temp_dir();
    TrainConfig cfg = validating_config(dir, 2);
    cfg.checkpoint_every = 3;
    train<CpuBackend>(cfg, single_comm());
    const std::vector<std::string> whole = log_lines(cfg.output_dir + "/main.log");
    ASSERT_EQ(whole.size(), 6u + 4u) << "6 steps, validation at 0, 2, 4 and the last";
    remove_checkpoint(cfg.output_dir, 6);
    const std::string partial = checkpoint_path(cfg.output_dir, "model", 6) + ".tmp";
    fclose(open_file(partial, "w"));
    cfg.resume = 1;
    train<CpuBackend>(cfg, single_comm());
    EXPECT_EQ(log_lines(cfg.output_dir + "/main.log"), whole);
    EXPECT_FALSE(file_exists(partial));
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// Only training data is shuffled: the validation loss before the first step is the same with
// --shuffle 1 and 0 (validation reads in file order), the first training batch is not.
TEST_F(Training, ValidationReadsInOrder) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    write_shard(dir + "/v.bin", random_tokens(3000, 64, 5));
    std::vector<std::string> first_lines[2];
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
        cfg.val_data = dir + "/v.bin";
        cfg.val_every = 1;
        cfg.val_steps = 2;
        cfg.max_steps = 1;
        cfg.shuffle = shuffle;
        cfg.output_dir = dir + "/out" + std::to_string(shuffle);
        train<CpuBackend>(cfg, single_comm());
        for (const std::string& line : read_lines(cfg.output_dir + "/main.log")) first_lines[shuffle].push_back(line.substr(0, 20));
    }
    ASSERT_EQ(first_lines[0].size(), 3u) << "validation, the step, validation of the final model";
    EXPECT_EQ(first_lines[0][0], first_lines[1][0]) << "validation loss";
    EXPECT_NE(first_lines[0][1], first_lines[1][1]) << "training loss: another batch when shuffled";
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// -n 2 -nk 2 -nm 4 over 10 steps: each checkpoint retires the one two back unless it is major
// (llm.c's rule): 2 goes at 6, 4 stays (major), 6 goes at 10; every kept one has its DONE file
TEST_F(Training, KeepsTheLastCheckpointsAndTheMajorOnes) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    cfg.max_steps = 10;
    cfg.checkpoint_every = 2;
    cfg.checkpoints_keep = 2;
    cfg.major_every = 4;
    cfg.output_dir = dir + "/out";
    train<CpuBackend>(cfg, single_comm());
    for (int step = 2; step <= 10; step += 2) {
        const bool kept = step == 4 || step == 8 || step == 10;
        for (const char* kind : {"DONE", "model", "state"})
            EXPECT_EQ(file_exists(checkpoint_path(cfg.output_dir, kind, step)), kept) << kind << " " << step;
    }
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// -a 1 trains on the first batch only: a small model learns it almost by heart
TEST_F(Training, OverfitsOneBatch) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 3));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 1);
    cfg.overfit = 1;
    cfg.max_steps = 60;
    cfg.lr = 1e-2f;
    cfg.weight_decay = 0.0f;
    std::vector<StepRecord> r = train<CpuBackend>(cfg, single_comm());
    EXPECT_GT(r.front().loss, 4.0f);  // about ln(64) at the start
    EXPECT_LT(r.back().loss, 0.5f) << "random tokens can only be learned by memorising one batch";
    cfg.overfit = 0;
    std::vector<StepRecord> fresh = train<CpuBackend>(cfg, single_comm());
    EXPECT_GT(fresh.back().loss, 3.0f) << "without -a the batches change and random tokens stay unpredictable";
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// checkpoints written during training load back as the model's parameters, and the log has a
// line per step
TEST_F(Training, WritesCheckpointsAndLog) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 2));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 5);
    cfg.output_dir = dir + "/out";
    cfg.checkpoint_every = 2;
    std::vector<float> final_params;
    train<CpuBackend>(cfg, single_comm(), [&](int step, Zero<CpuBackend>& z) {
        if (step == cfg.max_steps - 1) {
            final_params.resize(z.plan().total());
            z.save(final_params.data());
        }
    });
    GPT2Config c;
    EXPECT_EQ(load_checkpoint(cfg.output_dir + "/model_00000005.bin", &c), final_params);
    EXPECT_EQ(access((cfg.output_dir + "/model_00000002.bin").c_str(), F_OK), 0);
    EXPECT_EQ(access((cfg.output_dir + "/model_00000004.bin").c_str(), F_OK), 0);
    FILE* log = open_file(cfg.output_dir + "/main.log", "r");
    int lines = 0;
    for (char buf[256]; fgets(buf, sizeof(buf), log);) lines += strncmp(buf, "s:", 2) == 0 && strstr(buf, "trl:") != nullptr;
    fclose(log);
    EXPECT_EQ(lines, 5);
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// As llm.c's loop: after the last update the evaluations run once more and are logged at s:N,
// so the last validation loss is the final model's: the one the checkpoint written at step N
// gives when it is loaded with -e and validated before any update.
TEST_F(Training, LastValidationIsOfTheFinalModel) {
    std::string dir = temp_dir();
    TrainConfig cfg = validating_config(dir, 4);
    train<CpuBackend>(cfg, single_comm());
    const std::vector<std::string> log = read_lines(cfg.output_dir + "/main.log");
    ASSERT_EQ(log_lines(cfg.output_dir + "/main.log"),
              std::vector<std::string>({"0 tel", "0 trl", "1 trl", "2 trl", "3 trl", "4 tel", "4 trl", "5 trl", "6 tel"}));
    TrainConfig again = cfg;
    again.init = checkpoint_path(cfg.output_dir, "model", 6);
    again.max_steps = 1;
    again.output_dir = dir + "/again";
    train<CpuBackend>(again, single_comm());
    const std::vector<std::string> first = read_lines(again.output_dir + "/main.log");
    ASSERT_FALSE(first.empty());
    EXPECT_EQ(log.back().substr(4), first.front().substr(4)) << "s:6 " << log.back() << " vs the checkpoint's s:0 " << first.front();
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// -u not given: 2/(1-beta2) warmup steps from random weights (40 at beta2 0.95), none from a
// checkpoint (llm.c's default, its runs starting from pretrained weights); -u given: its value.
TEST_F(Training, WarmupByDefaultOnlyFromRandomWeights) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    ASSERT_EQ(cfg.warmup, -1);
    cfg.max_steps = 2;
    cfg.output_dir = dir + "/out";
    std::vector<StepRecord> r = train<CpuBackend>(cfg, single_comm());
    EXPECT_FLOAT_EQ(r[0].lr, cfg.lr / 40);
    EXPECT_FLOAT_EQ(r[1].lr, cfg.lr * 2 / 40);
    TrainConfig c = cfg;
    c.beta2 = 0.99f;
    c.output_dir = "";
    EXPECT_FLOAT_EQ(train<CpuBackend>(c, single_comm())[0].lr, cfg.lr / 200);
    c.warmup = 0;
    EXPECT_FLOAT_EQ(train<CpuBackend>(c, single_comm())[0].lr, cfg.lr) << "-u 0 given";
    c = cfg;
    c.init = checkpoint_path(cfg.output_dir, "model", 2);
    c.output_dir = "";
    EXPECT_FLOAT_EQ(train<CpuBackend>(c, single_comm())[0].lr, cfg.lr) << "from a checkpoint";
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// -sg: once the 128-step window is full, a step whose grad-norm z-score is over the threshold
// leaves the parameters as they were; every other step changes them. Same for -sl with the loss.
TEST_F(Training, SkipsUpdatesOverTheZScore) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(20000, 64, 4));
    for (int which = 0; which < 2; which++) {
        TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
        // random tokens: a plateau after a few steps; from step 256 on the window holds only that
        cfg.max_steps = 320;
        cfg.lr = 1e-2f;
        (which == 0 ? cfg.skip_grad_z : cfg.skip_loss_z) = 0.5f;
        GPT2Config mc;
        config_from_descriptor(cfg.init, &mc);
        std::vector<std::vector<float>> params(1, random_init(mc, (uint64_t)cfg.seed));  // before step 0
        std::vector<StepRecord> r = train<CpuBackend>(cfg, single_comm(), [&](int, Zero<CpuBackend>& z) {
            params.emplace_back(z.plan().total());
            z.save(params.back().data());
        });
        int skipped = 0, updated = 0;
        for (int i = 0; i < cfg.max_steps; i++) {
            const double z = which == 0 ? r[i].grad_z : r[i].loss_z;
            const bool over = z > 0.5;
            EXPECT_EQ(r[i].skipped, over ? 1 : 0) << i;
            EXPECT_EQ(params[i + 1] == params[i], over) << "step " << i << ", z " << z;
            skipped += over, updated += !over && i >= OutlierDetector::kWindow;
        }
        EXPECT_GT(skipped, 0) << "which " << which;
        EXPECT_GT(updated, 0) << "which " << which;
    }
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// tiny_config's model from random_init, with one MLP weight matrix (every layer's c_fc) scaled by
// 1e30: finite weights whose activations overflow, so the loss or gradient norm is NaN
std::vector<float> overflowing(const std::vector<float>& params, const GPT2Config& c) {
    const ParamLayout layout(c);
    std::vector<float> p = params;
    for (size_t i = 0; i < layout.size[FCW]; i++) p[layout.offset[FCW] + i] *= 1e30f;
    return p;
}

// Trains cfg on the CPU with poisoned weights for a while: after update `from` the weights become
// poison(weights), after update `until` they go back to what they were after `from`. *unchanged:
// whether the weights after `until` were still the poisoned ones (the steps between changed nothing).
std::vector<StepRecord> train_poisoned(const TrainConfig& cfg, int from, int until,
                                       const std::function<std::vector<float>(std::vector<float>)>& poison, bool* unchanged) {
    std::vector<float> before, poisoned;
    return train<CpuBackend>(cfg, single_comm(), [&](int step, Zero<CpuBackend>& z) {
        std::vector<float> now(z.plan().total());
        z.save(now.data());
        if (step == from) {
            before = now;
            poisoned = poison(now);
            z.load(poisoned.data());
        }
        if (step == until) {
            *unchanged = memcmp(now.data(), poisoned.data(), now.size() * sizeof(float)) == 0;
            z.load(before.data());
        }
    });
}

std::vector<std::string> files_like(const std::string& pattern) {
    std::vector<std::string> found;
    glob_t g;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) found.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    globfree(&g);
    return found;
}

// A diverged model (overflowing activations, -sl/-sg off): every step is skipped, so the weights
// stay those loaded, the checkpoints due (every step) are not written, and after --nonfinite-limit
// such steps in a row the run stops, its exit status 3.
TEST_F(Training, NonFiniteStepsNeverReachTheWeightsAndStopTheRun) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    GPT2Config mc;
    config_from_descriptor(cfg.init, &mc);
    const std::vector<float> diverged = overflowing(random_init(mc, 3), mc);
    write_checkpoint(dir + "/diverged.bin", mc, diverged, kCheckpointFp32);
    cfg.init = dir + "/diverged.bin";
    cfg.output_dir = dir + "/out";
    cfg.max_steps = 20;
    cfg.checkpoint_every = 1;
    cfg.nonfinite_limit = 4;
    std::vector<std::vector<float>> params;
    const std::vector<StepRecord> r = train<CpuBackend>(cfg, single_comm(), [&](int, Zero<CpuBackend>& z) {
        params.emplace_back(z.plan().total());
        z.save(params.back().data());
    });
    ASSERT_EQ(r.size(), 4u) << "the run must stop after 4 non-finite steps";
    for (size_t i = 0; i < r.size(); i++) {
        EXPECT_FALSE(std::isfinite(r[i].loss) && std::isfinite(r[i].norm)) << i;
        EXPECT_EQ(r[i].skipped, kSkipNonFinite) << i;
        EXPECT_TRUE(std::isnan(r[i].loss_z) && std::isnan(r[i].grad_z)) << i;
        EXPECT_EQ(0, memcmp(params[i].data(), diverged.data(), diverged.size() * sizeof(float))) << "step " << i << " changed the weights";
    }
    EXPECT_EQ(exit_status(r), kExitNonFinite);
    EXPECT_EQ(files_like(cfg.output_dir + "/model_*"), std::vector<std::string>());
    EXPECT_EQ(files_like(cfg.output_dir + "/DONE_*"), std::vector<std::string>());
    // a run whose last steps are non-finite, fewer than the limit: no final checkpoint, exit status 3
    cfg.max_steps = 2;
    const std::vector<StepRecord> short_run = train<CpuBackend>(cfg, single_comm());
    ASSERT_EQ(short_run.size(), 2u);
    EXPECT_EQ(exit_status(short_run), kExitNonFinite);
    EXPECT_EQ(files_like(cfg.output_dir + "/model_*"), std::vector<std::string>());
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// Two non-finite steps in a longer run (the hook makes the activations overflow after update 3
// and undoes it after update 5): both are skipped, leaving the weights as they were; the
// checkpoint due after the first is not written, the others are; the run goes on to its end
// (exit status 0); and the outlier windows, which never took the NaNs, give finite z-scores
// once full.
TEST_F(Training, NonFiniteStepsAreSkippedAndTheRunGoesOn) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(20000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    cfg.output_dir = dir + "/out";
    cfg.max_steps = 140;
    cfg.checkpoint_every = 4;
    cfg.nonfinite_limit = 3;
    GPT2Config mc;
    config_from_descriptor(cfg.init, &mc);
    bool unchanged = false;
    const std::vector<StepRecord> r = train_poisoned(cfg, 2, 4, [&](const std::vector<float>& p) { return overflowing(p, mc); }, &unchanged);
    ASSERT_EQ(r.size(), 140u);
    for (int i = 0; i < 140; i++) {
        const bool poisoned_step = i == 3 || i == 4;
        EXPECT_EQ(r[i].skipped, poisoned_step ? kSkipNonFinite : kNotSkipped) << i;
        EXPECT_EQ(std::isfinite(r[i].loss) && std::isfinite(r[i].norm), !poisoned_step) << i;
    }
    EXPECT_TRUE(unchanged) << "a non-finite step changed the weights";
    EXPECT_TRUE(std::isfinite(r.back().loss_z) && std::isfinite(r.back().grad_z)) << "the windows took a NaN";
    EXPECT_EQ(exit_status(r), 0);
    EXPECT_FALSE(file_exists(checkpoint_path(cfg.output_dir, "model", 4))) << "a checkpoint of the diverged state";
    EXPECT_FALSE(file_exists(checkpoint_path(cfg.output_dir, "DONE", 4)));
    for (int step : {8, 140}) EXPECT_TRUE(file_exists(checkpoint_path(cfg.output_dir, "DONE", step))) << step;
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// --fp8: a weight that became infinite, which the weight's fp8 cast would saturate to 448 (the
// forward and the gradients then stay finite): its amax is not finite, so the step is non-finite
// (its loss NaN, though its gradient norm is finite) and skipped, the weights as they were
TEST_F(Training, Fp8CastOfAnInfiniteWeightMakesTheStepNonFinite) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    cfg.fp8 = "e4m3";
    cfg.max_steps = 8;
    GPT2Config mc;
    config_from_descriptor(cfg.init, &mc);
    bool unchanged = false;
    const std::vector<StepRecord> r = train_poisoned(cfg, 2, 3, [&](std::vector<float> p) {
        p[ParamLayout(mc).offset[FCW] + 5] = INFINITY;
        return p;
    }, &unchanged);
    ASSERT_EQ(r.size(), 8u);
    for (int i = 0; i < 8; i++) EXPECT_EQ(r[i].skipped, i == 3 ? kSkipNonFinite : kNotSkipped) << i;
    EXPECT_TRUE(std::isnan(r[3].loss));
    EXPECT_TRUE(std::isfinite(r[3].norm)) << "the gradients saw the infinity: this test no longer shows that the amax does";
    EXPECT_TRUE(unchanged) << "the step with the infinite weight updated the weights";
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// What --fp8 cannot run on says so in one line, exit 2 (kernels/cuda/fp8.cuh: a GPU before sm_89,
// the fp32 CUDA build, the default CUDA build); the CPU backend runs it always
struct Fp8RefusingBackend : CpuBackend {
    static std::string fp8_refusal() { return "this backend has no fp8 path"; }
};
TEST(Flags, Fp8WhereItCannotRunExitsWithCode2) {
    EXPECT_EXIT(check_fp8_flag<Fp8RefusingBackend>(parse({"--fp8", "e4m3"})), ExitedWithCode(2), "error: --fp8 e4m3: this backend has no fp8 path");
    EXPECT_EXIT((check_fp8_flag<Fp8RefusingBackend>(parse({"--fp8", "none"})), check_fp8_flag<CpuBackend>(parse({"--fp8", "e4m3"})), exit(0)),
                ExitedWithCode(0), "");
    EXPECT_EXIT(parse({"--fp8", "e5m2"}), ExitedWithCode(2), "--fp8 e5m2: expected none or e4m3");
}

// A real run: a small GPT-2 on Tiny Shakespeare. The loss starts near ln(50257) = 10.8 and must
// end well below it, and below what the unigram statistics alone would give (about 7.5).
TEST_F(Training, LearnsTinyShakespeare) {
    TrainConfig cfg;
    cfg.init = "L=2,NH=4,C=64";
    cfg.output_dir = "";
    cfg.B = 8;
    cfg.T = 64;
    cfg.max_steps = 150;
    cfg.lr = 3e-3f;
    cfg.warmup = 10;
    cfg.val_every = 0;
    cfg.sample_every = 0;
    cfg.quiet = 1;
    std::vector<StepRecord> r = train<CpuBackend>(cfg, single_comm());
    float tail = 0.0f;
    for (int i = 140; i < 150; i++) tail += r[i].loss / 10;
    EXPECT_GT(r[0].loss, 10.5f);
    EXPECT_LT(tail, 6.5f) << "first loss " << r[0].loss;
}

}  // namespace
