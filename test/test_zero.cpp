// ZeRO stages 0-3 against single-rank training. Run under mpirun with any number of ranks N:
// every rank trains a small model for 10 steps at each stage with N ranks and accumulation A,
// and also, alone (MPI_COMM_SELF), the reference: stage 0 on one rank with accumulation N*A,
// which sees the same sequences per step. Checked on every rank, failures summed over ranks:
//   - losses and gradient norms: 1e-5 relative
//   - after every step, this rank's shard equals its slice of the reference parameters
//     (1e-5 absolute + 1e-5 relative), padding zero
//   - final parameters: same tolerance
//   - bytes held per category and bytes moved per collective: exactly the formulas below
//   - stage 3: no prefetch miss (every group after the embedding was gathered ahead of use)
// and, through a RecordingComm, that the collectives start when the design says (Schedule).
// Hybrid sharding (--shard-group): the same against single-rank training with 2 groups of 2 ranks
// on 4 (groups of 1 on 2 and 3), plus the bytes across groups and replicas equal bit for bit.
// Quantized collectives: 200 steps within a band of the unquantized loss curve, every rank
// computing with the same parameters, and each quantized collective's bytes (Quantized).
// --fp8 e4m3 at every stage and offloaded: 100 steps within a band of the loss without it, every
// rank computing with the same parameters (Fp8Stage).
// Built with nvcc (test/test_zero_cuda, see kernels/cuda.mk) the same checks run on the CUDA
// backend, the ranks sharing one GPU through the MPI communicator; there the tolerance is 1e-4
// in the fp32 build and 2e-2 in the bf16 one. Bit-exact wherever it is exact on both: the
// optimizer's update from given gradients, and overlapped against unoverlapped reduction.
#include <mpi.h>

#include <map>
#include <tuple>

#include "late_comm.h"
#include "recording_comm.h"
#include "test_util.h"

namespace {

#ifdef __CUDACC__
using TestBackend = CudaBackend;
#ifdef ENABLE_FP32
constexpr double kTol = 1e-4;
#else
constexpr double kTol = 2e-2;
#endif
constexpr MpiComm::CopyFn kToHost = CudaBackend::to_host, kFromHost = CudaBackend::from_host;
#else
using TestBackend = CpuBackend;
constexpr double kTol = 1e-5;
constexpr MpiComm::CopyFn kToHost = nullptr, kFromHost = nullptr;
#endif

// Which communicator the tests train with (ZERO_TEST_COMM): "" MPI (on the CUDA backend staged
// through host memory, the ranks sharing a GPU); "late" the same inside a LateComm, whose
// collectives finish only when waited for (test/late_comm.h); "nccl" (CUDA) NCCL, a GPU per rank
std::string comm_kind() {
    const char* kind = getenv("ZERO_TEST_COMM");
    return kind == nullptr ? "" : kind;
}
std::unique_ptr<Communicator> make_comm(MPI_Comm c) {
#ifdef __CUDACC__
    if (comm_kind() == "nccl") return std::make_unique<NcclComm>(c, gpu::stream());
#endif
    auto mpi = std::make_unique<MpiComm>(c, kToHost, kFromHost);
    if (comm_kind() != "late") return mpi;
    return ForwardingComm::owning<LateComm>(std::move(mpi), kToHost, kFromHost);
}

constexpr int kSteps = 10, kAccum = 2, kB = 2, kT = 8;
// Sizes chosen so that N=3,4 need padding, and so that the embedding group (256x16 + 16x16)
// outgrows a layer and moves in two pieces.
const char* kModelDesc = "L=3,NH=2,C=16,V=200,maxT=16";

struct ReferenceRun {
    std::vector<StepRecord> records;
    std::vector<std::vector<float>> params;  // full parameters after each step
};

std::string g_data_dir;

// a fixed random cycle through the vocabulary: each token predicts the next, so loss can fall
std::vector<uint16_t> learnable_tokens(size_t n, int vocab) {
    std::vector<uint16_t> cycle = random_tokens(vocab, vocab, 7), out(n);
    for (size_t i = 0; i < n; i++) out[i] = cycle[i % vocab];
    return out;
}

TrainConfig config(int stage, int accum, int world) {
    TrainConfig cfg;
    cfg.train_data = g_data_dir + "/train.bin";
    cfg.init = kModelDesc;
    cfg.output_dir = "";
    cfg.B = kB;
    cfg.T = kT;
    cfg.total_batch = (long)kB * kT * accum * world;
    cfg.max_steps = kSteps;
    cfg.lr = 1e-2f;
    cfg.weight_decay = 0.1f;
    cfg.grad_clip = 1.0f;
    // The key bias's true gradient is zero (softmax ignores a shift common to all keys), so it
    // holds only rounding noise, which Adam would scale up to +-lr per step whatever its size.
    // A larger eps keeps that noise from deciding the comparison.
    cfg.eps = 1e-6f;
    cfg.val_every = 0;
    cfg.sample_every = 0;
    cfg.zero_stage = stage;
    cfg.quiet = 1;
    return cfg;
}

const ReferenceRun& reference(int world) {
    static ReferenceRun run;
    if (run.records.empty()) {
        const std::unique_ptr<Communicator> self_owned = make_comm(MPI_COMM_SELF);
        Communicator& self = *self_owned;
        run.records = train<TestBackend>(config(0, kAccum * world, 1), self, [&](int, Zero<TestBackend>& z) {
            run.params.emplace_back(z.plan().total());
            z.save(run.params.back().data());
        });
    }
    return run;
}

int failures_everywhere(int local) {
    int total = 0;
    MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

bool close(double a, double b, double rtol, double atol = 0.0) {
    worst_error().note(std::fabs(a - b), atol + rtol * std::fabs(b), nullptr);
    return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

// the worst of what every rank noted (the ranks hold different shards)
WorstError worst_everywhere(const WorstError& mine) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const double local[3] = {mine.error, mine.tolerance, mine.noted ? 1.0 : 0.0};
    std::vector<double> all(3 * (size_t)world);
    MPI_Allgather(local, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, MPI_COMM_WORLD);
    WorstError worst;
    for (int r = 0; r < world; r++)
        if (all[3 * r + 2] != 0.0) worst.note(all[3 * r], all[3 * r + 1], nullptr);
    return worst;
}

// Whether every rank holds the same shard as the ranks r +- N, r +- 2N... of the other shard
// groups, bit for bit (replicas that drift apart would train different models)
int replicas_differ(const std::vector<float>& shard, int N) {
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    std::vector<float> all(shard.size() * world);
    MPI_Allgather(shard.data(), (int)shard.size(), MPI_FLOAT, all.data(), (int)shard.size(), MPI_FLOAT, MPI_COMM_WORLD);
    int differ = 0;
    for (int other = rank % N; other < world; other += N)
        differ += memcmp(all.data() + other * shard.size(), shard.data(), shard.size() * sizeof(float)) != 0;
    return differ;
}

// `stage` on this job's W ranks, sharded over groups of N ranks (N = W: plain ZeRO; else W/N
// replicas, --shard-group N), against single-rank training
void expect_single_rank_training(int stage, int N) {
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    const int W = comm.world(), R = W / N, r = comm.rank() % N;
    const ReferenceRun& ref = reference(W);
    int bad_shards = 0, bad_counters = 0, bad_memory = 0, prefetch_misses = 0, replicas_drift = 0;
    std::vector<float> final_params;

    auto hook = [&](int step, Zero<TestBackend>& zero) {
        const PartitionPlan& plan = zero.plan();
        // independent of the plan: sizes from the model layout, chunk = ceil(n / N)
        GPT2Config mc;
        config_from_descriptor(kModelDesc, &mc);
        ParamLayout layout(mc);
        const auto groups = param_groups(mc);
        auto shard_of = [&](size_t n) { return (uint64_t)((n + N - 1) / N); };
        uint64_t S = 0, S_first = 0, S_last = 0, S_last_layers = 0;
        for (size_t g = 0; g < groups.size(); g++)
            for (const auto& t : groups[g]) {
                S += shard_of(t.n);
                if (g == 0) S_first += shard_of(t.n);
                if (g == groups.size() - 1) S_last += shard_of(t.n);
                if (g + 3 >= groups.size() && g > 0 && g + 1 < groups.size()) S_last_layers += shard_of(t.n);
            }
        const uint64_t P = layout.total, X = sizeof(TestBackend::floatX);

        // shard == matching slice of the reference after this step
        std::vector<float> shard = zero.shard_to_host();
        const std::vector<float>& want = ref.params[step];
        int owner = stage == 0 ? 0 : r, chunks = stage == 0 ? 1 : N;
        size_t at = 0;
        for (const auto& g : groups)
            for (const auto& t : g) {
                size_t chunk = (t.n + chunks - 1) / chunks;
                for (size_t i = 0; i < chunk; i++, at++) {
                    size_t j = owner * chunk + i;
                    float expect = j < t.n ? want[t.offset + j] : 0.0f;
                    bad_shards += !close(shard[at], expect, kTol, kTol);
                }
            }
        bad_shards += at != shard.size();
        replicas_drift += replicas_differ(shard, N);

        // bytes moved this step (ZeRO paper's accounting, see zero/comm.h), inside the shard
        // group as plain ZeRO on N ranks moves them; across groups one all-reduce of the shard
        const ZeroTraffic traffic = zero.traffic();
        const CommCounters& c = traffic.inside;
        uint64_t ar = 0, rs = 0, ag = 0;
        if (stage == 0 && W > 1) ar = 2 * P * X;
        if (stage == 1) rs = N * S * X, ag = N * S * X;
        if (stage == 2) rs = kAccum * N * S * X, ag = N * S * X;
        // stage 3: each micro-step gathers every group for forward, and again for backward all
        // but the ones still resident: first, last, and the last two layers (two layer slots)
        if (stage == 3) rs = kAccum * N * S * X, ag = kAccum * N * (2 * S - S_first - S_last - S_last_layers) * X;
        bad_counters += c.all_reduce != ar || c.reduce_scatter != rs || c.all_gather != ag || c.broadcast != 0;
        const CommCounters& a = traffic.across;
        bad_counters += a.all_reduce != (stage > 0 && R > 1 ? 2 * S * X : 0) || a.reduce_scatter != 0 || a.all_gather != 0 || a.broadcast != 0;

        // bytes held: 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N, 16 Psi/N with bf16 parameters
        // and gradients and fp32 master weights, m and v; fp32 without master weights on the CPU
        const ZeroMemory& m = zero.memory();
        const uint64_t want_params = stage <= 2 ? P * X : S * X, want_grads = stage <= 1 ? P * X : S * X;
        const uint64_t state_elements = stage == 0 ? P : S, master = TestBackend::params_narrower_than_fp32 ? 4 : 0;
        bad_memory += m.params != want_params || m.grads != want_grads || m.optimizer != 8 * state_elements ||
                      m.master != master * state_elements;
        bad_memory += plan.shard_size() != (stage == 0 ? P : S);

        if (step == kSteps - 1) {
            prefetch_misses = zero.prefetch_misses();
            final_params.resize(P);
            zero.save(final_params.data());
        }
    };
    TrainConfig cfg = config(stage, kAccum, W);
    if (N != W) cfg.shard_group = std::to_string(N);
    std::vector<StepRecord> records = train<TestBackend>(cfg, comm, hook);

    int bad_steps = 0;
    for (int s = 0; s < kSteps; s++)
        bad_steps += !close(records[s].loss, ref.records[s].loss, kTol) || !close(records[s].norm, ref.records[s].norm, kTol);
    int bad_final = 0;
    for (size_t i = 0; i < final_params.size(); i++) bad_final += !close(final_params[i], ref.params.back()[i], kTol, kTol);
    EXPECT_EQ(failures_everywhere(bad_steps), 0) << "losses or norms differ from single-rank training";
    EXPECT_EQ(failures_everywhere(bad_shards), 0) << "a shard differs from its slice of the single-rank model";
    EXPECT_EQ(failures_everywhere(bad_final), 0) << "final parameters differ";
    EXPECT_EQ(failures_everywhere(bad_counters), 0) << "communication counters differ from the formula";
    EXPECT_EQ(failures_everywhere(bad_memory), 0) << "memory per category differs from the formula";
    EXPECT_EQ(failures_everywhere(prefetch_misses), 0) << "stage 3: a layer's parameters were gathered on demand, not prefetched";
    EXPECT_EQ(failures_everywhere(replicas_drift), 0) << "shard groups hold different replicas of a shard";
    // training must have done something, or equality would prove little
    EXPECT_LT(records.back().loss, records.front().loss - 0.05f);
}

class ZeroStage : public ::testing::TestWithParam<int> {};
TEST_P(ZeroStage, MatchesSingleRankTraining) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    expect_single_rank_training(GetParam(), world);
}

// Hybrid sharding: --shard-group 2 on 4 ranks (two replicas of a 2-rank shard), and
// --shard-group 1 on 2 and 3 ranks (a replica per rank, sharding nothing)
int hybrid_group(int world) { return world == 4 ? 2 : world > 1 ? 1 : 0; }
class HybridStage : public ::testing::TestWithParam<int> {};
TEST_P(HybridStage, MatchesSingleRankTraining) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (hybrid_group(world) == 0) GTEST_SKIP() << "one rank: one group";
    expect_single_rank_training(GetParam(), hybrid_group(world));
}
INSTANTIATE_TEST_SUITE_P(Stages, HybridStage, ::testing::Values(1, 2, 3));

// Written by 4 ranks in 2 shard groups of 2, resumed by 2 ranks without --shard-group
// (accumulation doubled: the same sequences per step), at each stage 1-3: the checkpoint is
// unsharded. Steps 4-6 and the final model match the uninterrupted 4-rank run.
TEST(HybridResume, OnTwoRanksWithoutShardGroups) {
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    if (comm.world() != 4) GTEST_SKIP() << "needs 4 ranks";
    MPI_Comm two;
    MPI_Comm_split(MPI_COMM_WORLD, comm.rank() < 2 ? 0 : MPI_UNDEFINED, comm.rank(), &two);
    int bad = 0;
    for (int stage = 1; stage <= 3; stage++) {
        TrainConfig cfg = config(stage, kAccum, 4);
        cfg.shard_group = "2";
        cfg.max_steps = 6;
        cfg.checkpoint_every = 3;
        cfg.output_dir = g_data_dir + "/hybrid_resume";
        const std::vector<StepRecord> whole = train<TestBackend>(cfg, comm);
        comm.barrier();
        GPT2Config c;
        const std::vector<float> final_params = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
        comm.barrier();  // every rank has read it before it is removed
        if (comm.rank() == 0) remove_checkpoint(cfg.output_dir, 6);
        if (comm.rank() < 2) {
            const std::unique_ptr<Communicator> pair_owned = make_comm(two);
            Communicator& pair = *pair_owned;
            TrainConfig resumed = config(stage, 2 * kAccum, 2);
            resumed.max_steps = 6;
            resumed.checkpoint_every = 3;
            resumed.output_dir = cfg.output_dir;
            resumed.resume = 1;
            const std::vector<StepRecord> rest = train<TestBackend>(resumed, pair);
            pair.barrier();  // rank 0 has written the checkpoint
            bad += rest.size() != 3;
            for (size_t s = 0; s < rest.size() && s < 3; s++)
                bad += !close(rest[s].loss, whole[3 + s].loss, kTol) || !close(rest[s].norm, whole[3 + s].norm, kTol);
            const std::vector<float> params = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
            for (size_t i = 0; i < params.size(); i++) bad += !close(params[i], final_params[i], kTol, kTol);
        }
        comm.barrier();
        if (comm.rank() == 0) [[maybe_unused]] int rc = system(("rm -rf " + cfg.output_dir).c_str());
        comm.barrier();
    }
    if (two != MPI_COMM_NULL) MPI_Comm_free(&two);
    EXPECT_EQ(failures_everywhere(bad), 0) << "a run of 2 shard groups of 2 ranks resumed on 2 ranks without groups differs";
}

// A checkpoint written at one stage resumes at another: the state file is unsharded, and each
// stage cuts its own shards from it. Steps 4-6 of the resumed run match the uninterrupted one.
TEST_P(ZeroStage, ResumesAtAnotherStage) {
    const int stage = GetParam(), other = (stage + 1) % 4;
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    TrainConfig cfg = config(stage, kAccum, comm.world());
    cfg.max_steps = 6;
    cfg.checkpoint_every = 3;
    cfg.output_dir = g_data_dir + "/resume_" + std::to_string(stage);
    std::vector<StepRecord> whole = train<TestBackend>(cfg, comm);
    if (comm.rank() == 0) remove(checkpoint_path(cfg.output_dir, "state", 6).c_str());
    comm.barrier();
    GPT2Config c;
    const std::vector<float> final_params = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
    comm.barrier();  // every rank has read it before rank 0 writes it again
    cfg.zero_stage = other;
    cfg.resume = 1;
    std::vector<StepRecord> rest = train<TestBackend>(cfg, comm);
    int bad = rest.size() != 3;
    for (size_t s = 0; s < rest.size() && s < 3; s++)
        bad += !close(rest[s].loss, whole[3 + s].loss, kTol) || !close(rest[s].norm, whole[3 + s].norm, kTol);
    std::vector<float> resumed = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
    for (size_t i = 0; i < resumed.size(); i++) bad += !close(resumed[i], final_params[i], kTol, kTol);
    EXPECT_EQ(failures_everywhere(bad), 0) << "stage " << stage << " resumed at stage " << other << " differs";
    comm.barrier();
    if (comm.rank() == 0) [[maybe_unused]] int rc = system(("rm -rf " + cfg.output_dir).c_str());
}

// A checkpoint that another layout (world size, stage, shard group, offload) reads back and at
// once writes again is the very file it read: each rank reads only its own runs and writes only
// its own, and nothing is lost in between. Also the files one process writes whole (as the
// trainer's rank 0 did before every rank wrote its part, and a checkpoint of that time is) are
// these very files.
struct CheckpointLayoutCase {
    int world, stage;
    const char* shard_group;
    const char* offload;
};
std::string layout_said(const CheckpointLayoutCase& l) {
    return std::to_string(l.world) + " rank(s) -z " + std::to_string(l.stage) + " --shard-group " + l.shard_group + " --offload " + l.offload;
}
TrainConfig layout_config(const CheckpointLayoutCase& l, int source_world) {
    TrainConfig cfg = config(l.stage, kAccum * source_world / l.world, l.world);
    cfg.shard_group = l.shard_group;
    cfg.offload = l.offload;
    cfg.max_steps = 3;
    return cfg;
}
// ranks [0, l.world) load the checkpoint of step 3 in `from` as layout l and save it at once in `to`
void load_and_save_again(const CheckpointLayoutCase& l, int source_world, const std::string& from, const std::string& to) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < l.world ? 0 : MPI_UNDEFINED, rank, &sub);
    if (sub != MPI_COMM_NULL) {
        {
            const std::unique_ptr<Communicator> comm = make_comm(sub);
            TrainConfig cfg = layout_config(l, source_world);
            cfg.output_dir = from;
            cfg.resume = 1;
            Run<TestBackend> run(cfg, *comm);
            run.cfg.output_dir = to;
            if (rank == 0) mkdir(to.c_str(), 0755);
            comm->barrier();
            save_checkpoint(run, run.resume_step, run.sample_rng);
            run.checkpoints->finish();
        }
        MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}
// rank 0: whether both files of step 3 in a and b are the same bytes (and are there)
int checkpoints_differ(const std::string& a, const std::string& b) {
    int bad = 0;
    for (const char* kind : {"model", "state"}) {
        const std::vector<char> x = read_bytes(checkpoint_path(a, kind, 3)), y = read_bytes(checkpoint_path(b, kind, 3));
        bad += x.empty() || x != y;
    }
    return bad;
}
TEST(CheckpointLayouts, ReadBackByAnotherLayoutAndWrittenAgainTheSameBytes) {
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    const int N = comm.world();
    // the source: every rank, stage 3, in groups where there are several, offloaded on odd worlds
    const CheckpointLayoutCase source{N, 3, N >= 4 ? "2" : N == 2 ? "1" : "all", N % 2 == 1 ? "cpu" : "none"};
    // 4 -> 2 at stage 1, shard groups -> none; 3 -> 1; offload on -> off and off -> on; stage 3 -> 0
    std::vector<CheckpointLayoutCase> targets = {{std::max(1, N / 2), 1, "all", N % 2 == 1 ? "none" : "cpu"}, {1, 0, "all", "none"}};
    if (N == 3) targets.push_back({1, 2, "all", "cpu"});
    if (N >= 2) targets.push_back({N, 2, "all", "none"});
    const std::string dir = g_data_dir + "/layouts";
    TrainConfig cfg = layout_config(source, N);
    cfg.output_dir = dir + "/source";
    if (comm.rank() == 0) mkdir(dir.c_str(), 0755);
    train<TestBackend>(cfg, comm);
    comm.barrier();
    int bad = 0;
    for (size_t i = 0; i < targets.size(); i++) {
        const std::string again = dir + "/again_" + std::to_string(i);
        load_and_save_again(targets[i], N, cfg.output_dir, again);
        const int differ = comm.rank() == 0 ? checkpoints_differ(cfg.output_dir, again) : 0;
        EXPECT_EQ(failures_everywhere(differ), 0) << layout_said(source) << " read back and written again by " << layout_said(targets[i]);
        bad += differ;
    }
    // the files one process writes whole, from the arrays one process reads whole, are these files
    if (comm.rank() == 0) {
        GPT2Config c;
        const std::string whole = dir + "/whole";
        mkdir(whole.c_str(), 0755);
        write_checkpoint(checkpoint_path(whole, "model", 3), c, load_checkpoint(checkpoint_path(cfg.output_dir, "model", 3), &c),
                         checkpoint_version(sizeof(TestBackend::floatX)));
        write_state(checkpoint_path(whole, "state", 3), read_state(checkpoint_path(cfg.output_dir, "state", 3), 3, c, true));
        write_done(whole, 3);
        bad += checkpoints_differ(cfg.output_dir, whole);
    }
    EXPECT_EQ(failures_everywhere(bad), 0) << "the files written by one process differ from the ranks' parts";
    comm.barrier();
    if (comm.rank() == 0) [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// Reducing each group as soon as its backward is done (the last micro-step's, at stages 0-1)
// must give the very bits of reducing everything after the whole backward: a group whose
// reduction started before all its gradients were in would lose the later ones. Stages 2-3
// always reduce during backward, so only 0 and 1 have two ways to compare.
class OverlappedStage : public ::testing::TestWithParam<int> {};
TEST_P(OverlappedStage, OverlappedReductionEqualsReductionAfterBackward) {
    const int stage = GetParam();
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    GPT2Config mc;
    config_from_descriptor(kModelDesc, &mc);
    const std::vector<float> init = random_init(mc, 3);
    auto run = [&](bool overlap) {
        Zero<TestBackend> zero(stage, param_groups(mc), comm);
        zero.load(init.data());
        GPT2<TestBackend> model(mc, kB, kT, 0, zero);
        std::vector<float> result;
        for (int step = 0; step < 3; step++) {
            zero.zero_grads();
            for (int micro = 0; micro < kAccum; micro++) {
                std::vector<uint16_t> t = random_tokens(kB * kT + 1, mc.vocab_size, 100 * step + 10 * micro + comm.rank());
                std::vector<int> tokens(t.begin(), t.end());
                zero.begin_micro_step(overlap && micro == kAccum - 1);
                model.forward(tokens.data(), tokens.data() + 1, kB, kT, 1.0f / (kB * kT * kAccum * comm.world()));
                model.backward(kB, kT);
            }
            const float norm = zero.grad_norm();
            zero.update(AdamWStep{1e-2f, 0.9f, 0.95f, 1e-6f, 0.1f, clip_scale(norm, 1.0f), step + 1, 99u + step});
            result.push_back(norm);
        }
        std::vector<float> params(zero.plan().total());
        zero.save(params.data());
        result.insert(result.end(), params.begin(), params.end());
        return result;
    };
    const std::vector<float> after = run(false), overlapped = run(true);
    int differ = memcmp(after.data(), overlapped.data(), after.size() * sizeof(float)) != 0;
    EXPECT_EQ(failures_everywhere(differ), 0) << "norms or parameters differ when groups are reduced during backward";
}

// The schedule zero/zero.h's header promises, seen through a RecordingComm while train() runs
// 2 steps of 2 micro-steps, on a model deep enough (L=4) that stage 3's backward must gather.
// Per micro-step, against the model's events (params(g) wanted, group g's backward done):
//   - reductions: group g's starts, all of its shard, after its backward is done and before the
//     next group's (g-1) backward is done; every micro-step at stages 2-3, only the last of the
//     step at stages 0-1 (none on one rank at stage 0: nothing to sum)
//   - stage 3 gathers: in forward, group h's starts while group h-1 is computed (group 1's
//     before the embedding's, which alone is gathered on demand); in backward, group g's after
//     params(g+1) is wanted and before group g+1's backward is done, except for the groups
//     still resident from forward (embedding, final layernorm, last two layers); no gather of a
//     group at the other stages
//   - each of these collectives but the embedding's is waited for only after the model's next
//     event: something is computed while it moves
//   - no collective starts on buffers one in flight uses, each is waited for once
// The same with --offload cpu, whose update comes between the steps' collectives; and there each
// group's gradients leave for the host once per step, in the step's last backward, as soon as
// their reduction is finished: at stage 0 on one rank at once, else when the group two below
// starts its reduction in the same slot (so during the backward for every layer but the first
// two; those, the embedding and the final layernorm finish when the norm is taken).
class Schedule : public ::testing::TestWithParam<std::tuple<int, bool>> {};
TEST_P(Schedule, CollectivesOverlapTheModelAsDesigned) {
    const int stage = std::get<0>(GetParam()), kMicros = 2 * kAccum;
    const char* deep_model = "L=4,NH=2,C=16,V=200,maxT=16";
    const std::unique_ptr<Communicator> mpi_owned = make_comm(MPI_COMM_WORLD);
    Communicator& mpi = *mpi_owned;
    RecordingComm comm(mpi);
    TrainConfig cfg = config(stage, kAccum, comm.world());
    cfg.init = deep_model;
    cfg.max_steps = kMicros / kAccum;
    cfg.offload = std::get<1>(GetParam()) ? "cpu" : "none";
    train<TestBackend>(cfg, comm);

    GPT2Config mc;
    config_from_descriptor(deep_model, &mc);
    const int L = mc.num_layers, last = L + 1;
    const PartitionPlan plan(param_groups(mc), stage == 0 ? 1 : comm.world());
    using What = RecordingComm::What;
    const std::vector<RecordingComm::Entry>& log = comm.log();
    std::vector<std::string> problems = comm.misuse();

    // the model's events, in the order forward and backward ask for them, and where each one is logged
    std::vector<std::pair<What, int>> expected, got;
    std::vector<long> at;
    for (int m = 0; m < kMicros; m++) {
        for (int g = 0; g <= last; g++) expected.push_back({What::ParamsWanted, g});
        expected.insert(expected.end(), {{What::ParamsWanted, 0}, {What::ParamsWanted, last}, {What::GradsDone, last}});
        for (int g = L; g >= 1; g--) expected.insert(expected.end(), {{What::ParamsWanted, g}, {What::GradsDone, g}});
        expected.push_back({What::GradsDone, 0});
    }
    for (size_t i = 0; i < log.size(); i++)
        if (log[i].what == What::ParamsWanted || log[i].what == What::GradsDone) {
            got.push_back({log[i].what, log[i].group});
            at.push_back((long)i);
        }
    ASSERT_EQ(failures_everywhere(got != expected), 0) << "the model's events are not forward's then backward's, 4 micro-steps";
    // log positions of each micro-step's events: forward's params(g) wanted, backward's, done(g)
    const int per_micro = (int)expected.size() / kMicros;
    std::vector<std::vector<long>> fwd_want(kMicros, std::vector<long>(last + 1)), bwd_want = fwd_want, done = fwd_want;
    for (size_t k = 0; k < got.size(); k++) {
        const int m = (int)k / per_micro, g = got[k].second;
        if (got[k].first == What::GradsDone) done[m][g] = at[k];
        else (k % per_micro <= (size_t)last ? fwd_want : bwd_want)[m][g] = at[k];
    }
    // elements per rank moved for group g by the collectives of a kind started strictly between two positions
    auto moved = [&](bool (RecordingComm::Entry::*kind)() const, int g, long from, long to) {
        size_t n = 0;
        for (long i = from + 1; i < to; i++) n += (log[i].*kind)() && log[i].group == g ? log[i].n : 0;
        return n;
    };
    auto expect_moved = [&](bool (RecordingComm::Entry::*kind)() const, int g, long from, long to, size_t want, const std::string& what) {
        const size_t n = moved(kind, g, from, to);
        if (n != want)
            problems.push_back("group " + std::to_string(g) + ": " + std::to_string(n) + " elements " + what + ", expected " + std::to_string(want));
    };
    const auto reduces = &RecordingComm::Entry::reduces, gathers = &RecordingComm::Entry::gathers;
    const long end = (long)log.size();
    // the embedding outgrows a layer: its collectives go in pieces of at most the largest layer's shard
    size_t layer_shard = 0;
    for (int g = 1; g <= L; g++) layer_shard = std::max(layer_shard, plan.group(g).shard_size);
    const int embedding_pieces = (int)((plan.group(0).shard_size + layer_shard - 1) / layer_shard);
    if (embedding_pieces < 2) problems.push_back("the test's model moves its embedding in one piece: nothing to count");
    auto expect_pieces = [&](bool (RecordingComm::Entry::*kind)() const, long from, long to, const std::string& what) {
        int n = 0;
        for (long i = from + 1; i < to; i++) n += (log[i].*kind)() && log[i].group == 0;
        if (n != embedding_pieces)
            problems.push_back("group 0: " + std::to_string(n) + " collectives " + what + ", expected " + std::to_string(embedding_pieces) + " pieces");
    };
    std::vector<size_t> reduced(last + 1, 0), gathered(last + 1, 0);  // as due, over the run
    for (int m = 0; m < kMicros; m++) {
        const std::string micro = " in micro-step " + std::to_string(m);
        const long start = m > 0 ? done[m - 1][0] : -1;
        const bool reduce_now = (stage >= 2 || m % kAccum == kAccum - 1) && !(stage == 0 && comm.world() == 1);
        for (int g = 0; g <= last && reduce_now; g++) {
            const size_t size = plan.group(g).shard_size;
            reduced[g] += size;
            const long until = g > 0 ? done[m][g - 1] : m + 1 < kMicros ? fwd_want[m + 1][0] : end;
            expect_moved(reduces, g, done[m][g], until, size, "reduced between its backward's end and the next group's" + micro);
            if (g == 0) expect_pieces(reduces, done[m][g], until, "reduced" + micro);
        }
        for (int h = 0; h <= last && stage == 3; h++) {  // forward
            const size_t size = plan.group(h).shard_size;
            gathered[h] += size;
            // while group h-1 is computed; group 1's from the micro-step's start; the embedding's on demand
            const long from = h >= 2 ? fwd_want[m][h - 1] : h == 1 ? start : fwd_want[m][0];
            expect_moved(gathers, h, from, fwd_want[m][std::max(h, 1)], size, "gathered while the group before is computed" + micro);
            if (h == 0) expect_pieces(gathers, from, fwd_want[m][1], "gathered" + micro);
        }
        for (int g = 1; g <= L - 2 && stage == 3; g++) {  // backward
            const size_t size = plan.group(g).shard_size;
            gathered[g] += size;
            expect_moved(gathers, g, bwd_want[m][g + 1], done[m][g + 1], size, "gathered in backward while the group after is computed" + micro);
        }
    }
    // and nothing more: no reduction when none is due, no gather but the ones above
    for (int g = 0; g <= last; g++) {
        expect_moved(reduces, g, -1, end, reduced[g], "reduced in all");
        expect_moved(gathers, g, -1, end, gathered[g], "gathered in all");
    }
    // and each collective but the embedding's moves while the model computes: it is waited for
    // only after the model's next event
    std::vector<long> waited(log.size() + 1, end);  // by ticket
    for (long i = 0; i < end; i++)
        if (log[i].what == What::Wait) waited[log[i].ticket] = i;
    for (long i = 0; i < end; i++) {
        const auto next = std::upper_bound(at.begin(), at.end(), i);
        if (log[i].what == What::Start && log[i].group > 0 && next != at.end() && waited[log[i].ticket] < *next)
            problems.push_back("group " + std::to_string(log[i].group) + ": collective " + std::to_string(log[i].ticket) +
                               " waited for before the model computed anything");
    }
    // offloaded gradients: once per step, after the group's last backward of the step, and (but
    // for the groups whose slot no later group reuses) before the model's event after the group
    // two below is done
    const bool offload = cfg.offload == "cpu", at_once = stage == 0 && comm.world() == 1;
    for (int m = kAccum - 1; m < kMicros; m += kAccum)
        for (int g = 0; g <= last; g++) {
            const long next_step = m + 1 < kMicros ? fwd_want[m + 1][0] : end;
            auto event_after = [&](long i) {  // the model's next event after log position i (the log's end: none)
                const auto next = std::upper_bound(at.begin(), at.end(), i);
                return next == at.end() ? end : *next;
            };
            long until = next_step;
            if (at_once) until = event_after(done[m][g]);
            else if (g >= 3 && g <= L) until = event_after(done[m][g - 2]);
            int sent = 0, sent_in_time = 0;
            for (long i = fwd_want[m + 1 - kAccum][0]; i < next_step; i++)
                if (log[i].what == What::GradsToHost && log[i].group == g) sent++, sent_in_time += i > done[m][g] && i < until;
            if (sent != (offload ? 1 : 0) || sent_in_time != sent)
                problems.push_back("group " + std::to_string(g) + ": gradients sent to the host " + std::to_string(sent) + " time(s), " +
                                   std::to_string(sent - sent_in_time) + " late, in micro-step " + std::to_string(m));
        }
    std::string first;
    for (size_t i = 0; i < problems.size() && i < 3; i++) first += "\n  " + problems[i];
    EXPECT_EQ(failures_everywhere((int)problems.size()), 0) << "stage " << stage << (cfg.offload == "cpu" ? " offloaded" : "") << " on " << comm.world() << " rank(s):" << first;
}
INSTANTIATE_TEST_SUITE_P(Stages, Schedule, ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Bool()));

// One AdamW step from the same gradients (rank 0 holds them, the others add zeros, so every
// sum is exact) leaves bit-identical parameters at every stage and rank count as stage 0 on one
// rank. On the CUDA bf16 build that is the stochastic rounding, keyed by each parameter's place
// in the model, not in the rank's shard.
TEST_P(ZeroStage, UpdateIsBitIdenticalToOneRank) {
    const int stage = GetParam();
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    GPT2Config mc;
    config_from_descriptor(kModelDesc, &mc);
    ParamLayout layout(mc);
    const std::vector<float> init = random_init(mc, 4);
    std::vector<float> grads(layout.total);
    std::mt19937 rng(5);
    for (float& g : grads) g = bf16_bits_to_float((uint16_t)(0x3a00 + rng() % 0x800));  // 2^-11..2^-9, exact in bf16
    auto update = [&](Communicator& c, int at_stage, bool holds_grads) {
        Zero<TestBackend> zero(at_stage, param_groups(mc), c);
        zero.load(init.data());
        zero.zero_grads();
        for (int g = zero.plan().num_groups() - 1; g >= 0; g--) {  // in backward's order
            Zero<TestBackend>::Tensors t = zero.grads(g);
            const auto& tensors = zero.plan().group(g).tensors;
            for (size_t i = 0; i < tensors.size() && holds_grads; i++)
                TestBackend::upload_fp32(t[i], grads.data() + tensors[i].slice.offset, tensors[i].slice.n);
            zero.grads_done(g);
        }
        zero.grad_norm();
        zero.update(AdamWStep{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1, 1234u});  // no clipping
        std::vector<float> params(layout.total);
        zero.save(params.data());
        return params;
    };
    const std::unique_ptr<Communicator> self_owned = make_comm(MPI_COMM_SELF);
    Communicator& self = *self_owned;
    const std::vector<float> want = update(self, 0, true), got = update(comm, stage, comm.rank() == 0);
    int differ = memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0;
    EXPECT_EQ(failures_everywhere(differ), 0) << "stage " << stage << " on " << comm.world() << " rank(s) updates differently";
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroStage, ::testing::Values(0, 1, 2, 3));
INSTANTIATE_TEST_SUITE_P(Stages, OverlappedStage, ::testing::Values(0, 1));

// Written by N ranks, resumed by one (accumulation N*A, the same sequences per step): the
// unsharded state and the loader's position and shuffle order carry over. Steps 4-6 and the
// final model match the uninterrupted N-rank run.
TEST(Resume, AtAnotherRankCount) {
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    const int N = comm.world();
    TrainConfig cfg = config(1, kAccum, N);
    ASSERT_EQ(cfg.shuffle, 1);
    cfg.max_steps = 6;
    cfg.checkpoint_every = 3;
    cfg.output_dir = g_data_dir + "/resume_ranks";
    std::vector<StepRecord> whole = train<TestBackend>(cfg, comm);
    comm.barrier();
    int bad = 0;
    if (comm.rank() == 0) {
        GPT2Config c;
        const std::vector<float> final_params = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
        remove_checkpoint(cfg.output_dir, 6);
        const std::unique_ptr<Communicator> self_owned = make_comm(MPI_COMM_SELF);
        Communicator& self = *self_owned;
        TrainConfig one = config(0, kAccum * N, 1);
        one.max_steps = 6;
        one.checkpoint_every = 3;
        one.output_dir = cfg.output_dir;
        one.resume = 1;
        std::vector<StepRecord> rest = train<TestBackend>(one, self);
        bad += rest.size() != 3;
        for (size_t s = 0; s < rest.size() && s < 3; s++)
            bad += !close(rest[s].loss, whole[3 + s].loss, kTol) || !close(rest[s].norm, whole[3 + s].norm, kTol);
        std::vector<float> resumed = load_checkpoint(checkpoint_path(cfg.output_dir, "model", 6), &c);
        for (size_t i = 0; i < resumed.size(); i++) bad += !close(resumed[i], final_params[i], kTol, kTol);
        [[maybe_unused]] int rc = system(("rm -rf " + cfg.output_dir).c_str());
    }
    EXPECT_EQ(failures_everywhere(bad), 0) << N << " ranks resumed on one differ";
}

// ZeRO-Offload (--offload cpu) against the same run without it, at every stage: each step's
// record (loss, norm, z-scores, skip), this rank's shard after every step, and the final
// checkpoint's model and state files. On the CPU backend bit for bit, over enough steps that the
// lr warms up and decays, gradients are clipped and -sg skips updates (the host update is the
// CPU backend's own kernel, reached through the offload's own buffers and copies). On CUDA the
// device update is another kernel, so within kTol, over kSteps without skips. Also the memory:
// no optimizer state in backend memory, 12 bytes per shard element in host memory and one
// parameter's worth of staging.
#ifdef __CUDACC__
constexpr bool kOffloadBitExact = false;
constexpr int kOffloadSteps = kSteps;
#else
constexpr bool kOffloadBitExact = true;
constexpr int kOffloadSteps = OutlierDetector::kWindow + 12;
#endif

struct OffloadRun {
    std::vector<StepRecord> records;
    std::vector<std::vector<float>> shards;  // after each step
    std::vector<float> model, master;        // the final checkpoint, read back (rank 0)
    std::vector<char> model_bytes, state_bytes;
    int bad_memory = 0;
};

// elements in a rank's shard when each tensor is cut into `chunks`, from the model alone
uint64_t shard_elements(int chunks) {
    GPT2Config mc;
    config_from_descriptor(kModelDesc, &mc);
    uint64_t S = 0;
    for (const auto& g : param_groups(mc))
        for (const auto& t : g) S += (t.n + chunks - 1) / chunks;
    return S;
}

OffloadRun train_offload_case(Communicator& comm, int stage, bool offload, const std::string& dir) {
    TrainConfig cfg = config(stage, kAccum, comm.world());
    cfg.max_steps = kOffloadSteps;
    // a small lr keeps the gradient norm level, so that its z-score crosses 0.5 now and then
    cfg.lr = 1e-3f;
    cfg.skip_grad_z = kOffloadBitExact ? 0.5f : 0.0f;
    cfg.offload = offload ? "cpu" : "none";
    cfg.output_dir = dir;
    OffloadRun run;
    run.records = train<TestBackend>(cfg, comm, [&](int, Zero<TestBackend>& zero) {
        run.shards.push_back(zero.shard_to_host());
        const ZeroMemory& m = zero.memory();
        const uint64_t P = shard_elements(1), S = shard_elements(stage == 0 ? 1 : comm.world()), X = sizeof(TestBackend::floatX);
        const uint64_t want_params = stage <= 2 ? P * X : S * X, want_grads = stage <= 1 ? P * X : S * X;
        const uint64_t master = TestBackend::params_narrower_than_fp32 ? 4 : 0;
        if (offload)
            run.bad_memory += m.params != want_params || m.grads != want_grads || m.optimizer != 0 || m.master != 0 ||
                              m.host_optimizer != 12 * S || m.host_staging != X * S;
        else
            run.bad_memory += m.optimizer != 8 * S || m.master != master * S || m.host_optimizer != 0 || m.host_staging != 0;
    });
    comm.barrier();
    if (comm.rank() == 0) {
        GPT2Config c;
        run.model = load_checkpoint(checkpoint_path(dir, "model", kOffloadSteps), &c);
        run.master = read_state(checkpoint_path(dir, "state", kOffloadSteps), kOffloadSteps, c, true).master;
        run.model_bytes = read_bytes(checkpoint_path(dir, "model", kOffloadSteps));
        run.state_bytes = read_bytes(checkpoint_path(dir, "state", kOffloadSteps));
    }
    comm.barrier();
    if (comm.rank() == 0) [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
    return run;
}

// equal bit for bit where kOffloadBitExact, else within kTol
int differences(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return 1;
    if (kOffloadBitExact) return memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0;
    int bad = 0;
    for (size_t i = 0; i < a.size(); i++) bad += !close(a[i], b[i], kTol, kTol);
    return bad;
}

class OffloadStage : public ::testing::TestWithParam<int> {};

TEST_P(OffloadStage, EqualsTrainingWithoutOffload) {
    const int stage = GetParam();
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    const std::string dir = g_data_dir + "/offload_" + std::to_string(stage);
    const OffloadRun plain = train_offload_case(comm, stage, false, dir), offloaded = train_offload_case(comm, stage, true, dir);
    int bad_records = plain.records.size() != offloaded.records.size(), bad_shards = 0;
    for (size_t s = 0; s < plain.records.size() && !bad_records; s++) {
        const StepRecord &a = plain.records[s], &b = offloaded.records[s];
        bad_records += kOffloadBitExact ? memcmp(&a, &b, sizeof(a)) != 0
                                        : !close(a.loss, b.loss, kTol) || !close(a.norm, b.norm, kTol) || a.skipped != b.skipped;
        bad_shards += differences(plain.shards[s], offloaded.shards[s]);
    }
    int bad_checkpoint = differences(plain.model, offloaded.model) + differences(plain.master, offloaded.master);
    if (kOffloadBitExact) bad_checkpoint += plain.model_bytes != offloaded.model_bytes || plain.state_bytes != offloaded.state_bytes;
    EXPECT_EQ(failures_everywhere(bad_records), 0) << "step records differ with offload";
    EXPECT_EQ(failures_everywhere(bad_shards), 0) << "a shard differs with offload";
    EXPECT_EQ(failures_everywhere(bad_checkpoint), 0) << "the final checkpoint differs with offload";
    EXPECT_EQ(failures_everywhere(plain.bad_memory + offloaded.bad_memory), 0) << "memory per category differs from the formula";
    // what the comparison covered: clipped gradients, and on the CPU skipped updates
    int clipped = 0, skipped = 0;
    for (const StepRecord& r : plain.records) clipped += r.norm > 1.0f, skipped += r.skipped == kSkipOutlier;
    EXPECT_GT(clipped, 0);
    if (kOffloadBitExact) {
        EXPECT_GT(skipped, 0);
    }
}

// A checkpoint written with offload resumes without it and the other way round: steps 4-6 and
// the final model and state are those of the uninterrupted run (bit for bit on the CPU).
TEST_P(OffloadStage, ResumesAcrossOffload) {
    const int stage = GetParam();
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    for (const bool offload_first : {true, false}) {
        TrainConfig cfg = config(stage, kAccum, comm.world());
        cfg.max_steps = 6;
        cfg.checkpoint_every = 3;
        cfg.output_dir = g_data_dir + "/offload_resume_" + std::to_string(stage);
        cfg.offload = offload_first ? "cpu" : "none";
        const std::vector<StepRecord> whole = train<TestBackend>(cfg, comm);
        comm.barrier();
        std::vector<char> model, state;
        if (comm.rank() == 0) {
            model = read_bytes(checkpoint_path(cfg.output_dir, "model", 6));
            state = read_bytes(checkpoint_path(cfg.output_dir, "state", 6));
            remove_checkpoint(cfg.output_dir, 6);
        }
        comm.barrier();
        cfg.offload = offload_first ? "none" : "cpu";
        cfg.resume = 1;
        const std::vector<StepRecord> rest = train<TestBackend>(cfg, comm);
        int bad = rest.size() != 3;
        for (size_t s = 0; s < rest.size() && s < 3; s++)
            bad += !close(rest[s].loss, whole[3 + s].loss, kOffloadBitExact ? 0.0 : kTol) ||
                   !close(rest[s].norm, whole[3 + s].norm, kOffloadBitExact ? 0.0 : kTol);
        if (comm.rank() == 0 && kOffloadBitExact)
            bad += model != read_bytes(checkpoint_path(cfg.output_dir, "model", 6)) ||
                   state != read_bytes(checkpoint_path(cfg.output_dir, "state", 6));
        EXPECT_EQ(failures_everywhere(bad), 0) << "stage " << stage << (offload_first ? ": offloaded run resumed without offload" : ": run resumed with offload");
        comm.barrier();
        if (comm.rank() == 0) [[maybe_unused]] int rc = system(("rm -rf " + cfg.output_dir).c_str());
    }
}

INSTANTIATE_TEST_SUITE_P(Stages, OffloadStage, ::testing::Values(0, 1, 2, 3));

// ----------------------------------------------------------------------------
// Quantized collectives (--quantize-weights, --quantize-grads)

// A model whose every piece but the final layernorm's is large enough to be quantized
// (kQuantMinValues) on up to 4 ranks: a layer's shard is 3176 values there, the embedding's
// 2176; deep enough (L=3) that stage 3 gathers a layer again in backward
const char* kQuantModelDesc = "L=3,NH=2,C=32,V=200,maxT=16";
// The loss of a quantized run stays within kLossBand of the unquantized one at each of
// kBandSteps steps (lr 3e-3, from 5.3 down to about 0.1)
constexpr int kBandSteps = 200;
constexpr double kLossBand = 0.02;

struct QuantCase {
    int stage;
    bool weights, grads;
};
std::string quant_case_name(const testing::TestParamInfo<QuantCase>& info) {
    const QuantCase& c = info.param;
    return "stage" + std::to_string(c.stage) + (c.weights ? "_weights" : "") + (c.grads ? "_grads" : "");
}

TrainConfig quant_config(const QuantCase& c, int steps, int world) {
    TrainConfig cfg = config(c.stage, kAccum, world);
    cfg.init = kQuantModelDesc;
    cfg.max_steps = steps;
    cfg.lr = 3e-3f;
    cfg.quantize_weights = c.weights ? "int8" : "none";
    cfg.quantize_grads = c.grads ? "int8" : "none";
    if (world == 4) cfg.shard_group = "2";  // quantized inside the group, and across groups
    return cfg;
}

// whether every rank of the job holds the same values, bit for bit
int ranks_differ(const std::vector<float>& mine) {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    std::vector<float> all(mine.size() * world);
    MPI_Allgather(mine.data(), (int)mine.size(), MPI_FLOAT, all.data(), (int)mine.size(), MPI_FLOAT, MPI_COMM_WORLD);
    int differ = 0;
    for (int r = 0; r < world; r++) differ += memcmp(all.data() + r * mine.size(), mine.data(), mine.size() * sizeof(float)) != 0;
    return differ;
}

class Quantized : public ::testing::TestWithParam<QuantCase> {};

// 200 steps quantized against the same run unquantized: the loss stays within kLossBand of the
// unquantized one at every step, and after every step every rank computes with the same
// parameters, bit for bit (the dequantized gathers with --quantize-weights)
TEST_P(Quantized, StaysInBandOfUnquantizedLossCurve) {
    const QuantCase c = GetParam();
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    if (comm.world() == 1) GTEST_SKIP() << "one rank moves nothing to quantize";
    const std::vector<StepRecord> plain = train<TestBackend>(quant_config({c.stage, false, false}, kBandSteps, comm.world()), comm);
    int drift = 0;
    const std::vector<StepRecord> quantized = train<TestBackend>(quant_config(c, kBandSteps, comm.world()), comm,
                                                                [&](int, Zero<TestBackend>& zero) { drift += ranks_differ(zero.params_in_use()); });
    int outside = 0;
    for (int s = 0; s < kBandSteps; s++) outside += !close(quantized[s].loss, plain[s].loss, 0.0, kLossBand);
    EXPECT_EQ(failures_everywhere(outside), 0) << "the quantized loss leaves the band around the unquantized one";
    EXPECT_EQ(failures_everywhere(drift), 0) << "ranks compute with different parameters";
    EXPECT_LT(plain.back().loss, 0.5f) << "the unquantized run learned too little for the comparison to say much";
}

// Three replicas (--shard-group 1 on 3 ranks): the int8 exchange across groups cuts each piece in
// three parts, the last one shorter, and each rank reduces and sends back its own; after every
// step every rank must hold the same parameters, bit for bit, at every sharding stage
TEST(Quantized, ThreeReplicasHoldTheSameParameters) {
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    if (comm.world() != 3) GTEST_SKIP() << "three ranks, each its own shard group";
    for (int stage = 1; stage <= 3; stage++) {
        TrainConfig cfg = quant_config({stage, false, true}, 20, 3);
        cfg.shard_group = "1";
        int drift = 0;
        train<TestBackend>(cfg, comm, [&](int, Zero<TestBackend>& zero) {
            EXPECT_EQ(zero.replica_count(), 3);
            drift += ranks_differ(zero.params_in_use());
        });
        EXPECT_EQ(failures_everywhere(drift), 0) << "stage " << stage << ": the replicas' parameters differ";
    }
}

// bytes of one quantized row of tensor pieces of these lengths (kernels/quantize_blocks.h's
// layout, written out again): a 4-byte scale per block of at most 256 values of one tensor, the
// values as int8, padded to 4 bytes
uint64_t quantized_row_bytes(const std::vector<size_t>& tensor_pieces) {
    uint64_t blocks = 0, values = 0;
    for (size_t len : tensor_pieces) blocks += (len + 255) / 256, values += len;
    return 4 * blocks + (values + 3) / 4 * 4;
}

// A collective as the ratio test sees it: one that moves group g's piece, of a kind (a gather
// or reduction inside the shard group, an all-reduce across groups, whose quantized form is an
// all-to-all and an all-gather), with the bytes zero/comm.h counts for it per rank
struct Moved {
    enum Kind { Gather, Reduce, Across } kind;
    int group;
    size_t n;           // elements per rank (quantized across: the first of its two)
    uint64_t counted;   // bytes per rank, both halves of a quantized all-reduce across groups
    bool quantized;
    uint64_t row_bytes;  // quantized: bytes per rank of each of its collectives
};
// The collectives of a recorded run in the order they started, the two halves of a quantized
// all-reduce across groups joined; `across_link` names the communicator between groups (-1: none)
std::vector<Moved> collectives_moved(const std::vector<RecordingComm::Entry>& log, int across_link, int N, int R) {
    using Op = RecordingComm::Op;
    std::vector<Moved> out;
    std::map<int, int> across_half;  // by group: its quantized all-reduce across groups halfway (-1: none)
    for (const RecordingComm::Entry& e : log) {
        if (e.what != RecordingComm::What::Start) continue;
        const bool across = e.link == across_link;
        const uint64_t counted = e.op == Op::AllReduce ? 2 * e.bytes() : (uint64_t)(across ? R : N) * e.bytes();
        if (across && e.op == Op::AllGather && across_half.count(e.group) && across_half[e.group] >= 0) {  // the second half
            out[across_half[e.group]].counted += counted;
            across_half[e.group] = -1;
            continue;
        }
        const Moved::Kind kind = across ? Moved::Across : e.op == Op::AllGather ? Moved::Gather : Moved::Reduce;
        if (across && e.op == Op::AllToAll) across_half[e.group] = (int)out.size();
        out.push_back({kind, e.group, e.n, counted, e.dtype == DType::I8, e.bytes()});
    }
    return out;
}

// elements of each tensor piece in the values [lo, lo + n) of group g's shard on N ranks (chunks of
// ceil(t.n / N) per tensor, one after another)
std::vector<size_t> tensor_pieces(const std::vector<TensorSlice>& group, int N, size_t lo, size_t n) {
    std::vector<size_t> pieces;
    size_t at = 0;
    for (const TensorSlice& t : group) {
        const size_t chunk = (t.n + N - 1) / N, a = std::max(lo, at), b = std::min(lo + n, at + chunk);
        if (a < b) pieces.push_back(b - a);
        at += chunk;
    }
    return pieces;
}

// Two steps recorded with and without quantization: the same collectives, group by group, in
// the same order. Each quantized one moves at most 0.3 of the bytes of the one it replaces, in
// fp32 (in a bf16 build 0.6 of its bf16 bytes; across groups an all-to-all and an all-gather
// replace an all-reduce) and
// exactly what the layout says: a 4-byte scale per block of at most 256 values of one tensor and
// the values (across groups, R parts of ceil(n / R) values, each message the largest part's).
// Those left unquantized are pieces (parts) under kQuantMinValues or collectives the case does
// not quantize. The bytes per step train_gpt prints (Zero::traffic) are what was sent.
TEST_P(Quantized, EachCollectiveMovesAtMostThreeTenthsOfTheBytes) {
    const QuantCase c = GetParam();
    const std::unique_ptr<Communicator> mpi_owned = make_comm(MPI_COMM_WORLD);
    Communicator& mpi = *mpi_owned;
    if (mpi.world() == 1) GTEST_SKIP() << "one rank moves nothing to quantize";
    const int W = mpi.world(), N = W == 4 ? 2 : W, R = W / N;  // quant_config's shard groups
    const int group_link = N == W ? 0 : 1, across_link = N == W ? -1 : 2;
    GPT2Config mc;
    config_from_descriptor(kQuantModelDesc, &mc);
    const auto groups = param_groups(mc);
    auto run = [&](bool quantized, ZeroTraffic* counted) {
        RecordingComm comm(mpi);
        train<TestBackend>(quant_config(quantized ? c : QuantCase{c.stage, false, false}, 2, W), comm, [&](int, Zero<TestBackend>& zero) {
            const ZeroTraffic t = zero.traffic();
            for (auto [sum, add] : {std::pair{&counted->inside, &t.inside}, std::pair{&counted->across, &t.across}}) {
                sum->all_reduce += add->all_reduce, sum->reduce_scatter += add->reduce_scatter;
                sum->all_gather += add->all_gather, sum->all_to_all += add->all_to_all;
            }
        });
        ZeroTraffic sent;  // what the recorded collectives sent, counted as zero/comm.h counts
        for (const RecordingComm::Entry& e : comm.log()) {
            if (e.what != RecordingComm::What::Start) continue;
            CommCounters& to = e.link == group_link ? sent.inside : sent.across;
            const uint64_t ranks = e.link == group_link ? N : R;
            if (e.op == RecordingComm::Op::AllReduce) to.all_reduce += 2 * e.bytes();
            if (e.op == RecordingComm::Op::ReduceScatter) to.reduce_scatter += ranks * e.bytes();
            if (e.op == RecordingComm::Op::AllGather) to.all_gather += ranks * e.bytes();
            if (e.op == RecordingComm::Op::AllToAll) to.all_to_all += ranks * e.bytes();
        }
        int differ = 0;
        for (auto [a, b] : {std::pair{&counted->inside, &sent.inside}, std::pair{&counted->across, &sent.across}})
            differ += a->all_reduce != b->all_reduce || a->reduce_scatter != b->reduce_scatter || a->all_gather != b->all_gather ||
                      a->all_to_all != b->all_to_all;
        EXPECT_EQ(failures_everywhere(differ), 0) << "the bytes per step differ from what the collectives sent";
        return collectives_moved(comm.log(), across_link, N, R);
    };
    ZeroTraffic plain_traffic, quantized_traffic;
    std::vector<Moved> plain = run(false, &plain_traffic), quantized = run(true, &quantized_traffic);
    // group by group and kind, each in the order it started
    auto by_group = [](const Moved& a, const Moved& b) { return std::tie(a.group, a.kind) < std::tie(b.group, b.kind); };
    std::stable_sort(plain.begin(), plain.end(), by_group);
    std::stable_sort(quantized.begin(), quantized.end(), by_group);
    ASSERT_EQ(failures_everywhere(plain.size() != quantized.size()), 0) << "the schedules differ";

    int bad = 0, quantized_count = 0, unquantized_large = 0;
    double worst_ratio = 0.0;
    size_t lo = 0;  // where the piece starts in its group's shard: pieces go in order
    for (size_t i = 0; i < plain.size(); i++) {
        const Moved &p = plain[i], &q = quantized[i];
        bad += p.group != q.group || p.kind != q.kind;
        if (p.group < 0) {  // the gathers after the update at stages 1-2, which name no group: never quantized
            bad += q.counted != p.counted || q.quantized;
            continue;
        }
        size_t shard = 0;
        for (const TensorSlice& t : groups[p.group]) shard += (t.n + N - 1) / N;
        if (i > 0 && (plain[i - 1].group != p.group || plain[i - 1].kind != p.kind)) lo = 0;
        const bool quantizable = p.kind == Moved::Gather ? c.weights : c.grads;
        if (q.quantized) {
            quantized_count++;
            // of the fp32 bytes the replaced collective would move (twice the bf16 ones in a bf16 build)
            const double ratio = (double)q.counted / (p.counted * 4.0 / sizeof(TestBackend::floatX));
            worst_ratio = std::max(worst_ratio, ratio);
            uint64_t want = 0;
            if (p.kind != Moved::Across) {
                want = quantized_row_bytes(tensor_pieces(groups[p.group], N, lo, p.n));
            } else {
                const size_t part = (p.n + R - 1) / R;
                for (int j = 0; j < R; j++)
                    want = std::max(want, quantized_row_bytes(tensor_pieces(groups[p.group], N, lo + j * part, std::min(part, p.n - std::min(p.n, j * part)))));
            }
            bad += ratio > 0.3 || q.row_bytes != want || !quantizable;
        } else {
            bad += q.counted != p.counted;
            const size_t values = p.kind == Moved::Across ? (p.n + R - 1) / R : p.n;
            unquantized_large += quantizable && values >= kQuantMinValues;
        }
        lo = (lo + p.n) % shard;
    }
    if (mpi.rank() == 0) printf("%d collectives quantized, worst %.4f of the bytes\n", quantized_count, worst_ratio);
    EXPECT_GT(quantized_count, 0);
    EXPECT_EQ(failures_everywhere(bad), 0) << "a quantized collective moves more than 0.3 of the bytes, or not its layout's";
    EXPECT_EQ(failures_everywhere(unquantized_large), 0) << "a collective the case quantizes went unquantized";
}
INSTANTIATE_TEST_SUITE_P(Cases, Quantized,
                         ::testing::Values(QuantCase{3, true, false}, QuantCase{1, false, true}, QuantCase{2, false, true},
                                           QuantCase{3, false, true}, QuantCase{3, true, true}),
                         quant_case_name);
// ----------------------------------------------------------------------------
// --fp8 e4m3 (kernels/fp8_scaling.h): the blocks' matmuls on fp8 operands, at every stage and with
// offload, on this job's ranks

// kFp8Steps steps of the quantized-collectives model (lr 3e-3), whose loss falls from 5.3 to
// below 3: with --fp8 the loss stays within kFp8LossBand of the same run's without it at every
// step (about twice the widest gap measured on 1-4 ranks, docs/fp8.md)
constexpr int kFp8Steps = 100;
constexpr double kFp8LossBand = 0.05;

struct Fp8Case {
    int stage;
    bool offload;
};
std::string fp8_case_name(const testing::TestParamInfo<Fp8Case>& info) {
    return "stage" + std::to_string(info.param.stage) + (info.param.offload ? "_offload" : "");
}
class Fp8Stage : public ::testing::TestWithParam<Fp8Case> {};

// The fp8 run against the run without: the band at every step; after every step every rank
// computes with the same parameters, bit for bit; and fp8 changed the computation (a run that
// ignored the flag would match the other bit for bit)
TEST_P(Fp8Stage, StaysInBandOfTheLossWithoutFp8) {
    const Fp8Case c = GetParam();
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    TrainConfig cfg = config(c.stage, kAccum, comm.world());
    cfg.init = kQuantModelDesc;
    cfg.max_steps = kFp8Steps;
    cfg.lr = 3e-3f;
    cfg.offload = c.offload ? "cpu" : "none";
    const std::vector<StepRecord> plain = train<TestBackend>(cfg, comm);
    cfg.fp8 = "e4m3";
    int drift = 0;
    const std::vector<StepRecord> fp8 =
        train<TestBackend>(cfg, comm, [&](int, Zero<TestBackend>& zero) { drift += ranks_differ(zero.params_in_use()); });
    int outside = 0, differ = 0;
    double widest = 0;
    for (int s = 0; s < kFp8Steps; s++) {
        outside += !close(fp8[s].loss, plain[s].loss, 0.0, kFp8LossBand);
        differ += fp8[s].loss != plain[s].loss;
        widest = std::max(widest, std::fabs((double)fp8[s].loss - plain[s].loss));
    }
    if (comm.rank() == 0)
        printf("stage %d%s on %d rank(s): loss %.4f -> %.4f without fp8, %.4f with; the widest gap %.4f\n", c.stage,
               c.offload ? " offloaded" : "", comm.world(), plain.front().loss, plain.back().loss, fp8.back().loss, widest);
    EXPECT_EQ(failures_everywhere(outside), 0) << "the fp8 loss leaves the band around the loss without fp8";
    EXPECT_EQ(failures_everywhere(drift), 0) << "ranks compute with different parameters";
    EXPECT_GT(differ, 0) << "--fp8 changed nothing";
    EXPECT_LT(plain.back().loss, 3.0f) << "the run learned too little for the comparison to say much";
}
INSTANTIATE_TEST_SUITE_P(Cases, Fp8Stage,
                         ::testing::Values(Fp8Case{0, false}, Fp8Case{1, false}, Fp8Case{2, false}, Fp8Case{3, false}, Fp8Case{1, true},
                                           Fp8Case{3, true}),
                         fp8_case_name);

// The test backend, counting what it hands out: bytes held now and at most, in backend memory
// and in pinned host memory. Only what goes through alloc and alloc_pinned: on CUDA the
// backend's own buffers (kernels/backend_memory.h) are allocated within it.
template <class Backend>
struct TallyingBackend : Backend {
    struct Tally {
        std::map<void*, size_t> held;
        size_t now = 0, most = 0;
        void* add(void* p, size_t bytes) {
            held[p] = bytes;
            most = std::max(most, now += bytes);
            return p;
        }
        void remove(void* p) {
            now -= held.at(p);
            held.erase(p);
        }
    };
    static inline Tally device, pinned;
    static void* alloc(size_t bytes) { return device.add(Backend::alloc(bytes), bytes); }
    static void release(void* p) {
        device.remove(p);
        Backend::release(p);
    }
    static void* alloc_pinned(size_t bytes) { return pinned.add(Backend::alloc_pinned(bytes), bytes); }
    static void release_pinned(void* p) {
        pinned.remove(p);
        Backend::release_pinned(p);
    }
};

// The memory plan (train/memory_plan.h) against runs that allocate: at every stage, with and
// without offload, at each recompute level, at stages 1-3 in shard groups with quantized
// collectives, and with --fp8's copies, on this many ranks, each rank's plan equals, byte for
// byte and category by category, what its run's objects hold after a training step and a
// validation, names nothing "unnamed", gives the same memory line, and its totals are what the
// backend handed out at most over the run (device and pinned host memory, counted independently).
// On CUDA the backend's own buffers are the process's, which the tests before used too: there
// they are compared in a process of their own, by test/test_memory_plan_gpu.sh.
#ifdef __CUDACC__
constexpr bool kCompareBackendMemory = false;
#else
constexpr bool kCompareBackendMemory = true;
#endif
TEST(MemoryPlan, EqualsWhatTheRunAllocates) {
    using Tallying = TallyingBackend<TestBackend>;
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    const int N = comm.world(), r = comm.rank();
    std::vector<TrainConfig> cases;
    for (int stage = 0; stage <= 3; stage++)
        for (const bool offload : {false, true})
            for (int recompute = 0; recompute <= 2; recompute++) {
                cases.push_back(config(stage, kAccum, N));
                cases.back().offload = offload ? "cpu" : "none";
                cases.back().recompute = recompute;
            }
    // shard groups (2 of 2 on 4 ranks, groups of 1 on 2 and 3) and the quantized collectives' buffers
    for (const int stage : {1, 2, 3}) {
        cases.push_back(config(stage, kAccum, N));
        cases.back().init = kQuantModelDesc;  // pieces large enough to be quantized
        if (N > 1) cases.back().shard_group = N == 4 ? "2" : "1";
        cases.back().quantize_grads = "int8";
        if (stage == 3) cases.back().quantize_weights = "int8";
    }
    for (const int stage : {0, 3}) {  // --fp8's copies
        cases.push_back(config(stage, kAccum, N));
        cases.back().fp8 = "e4m3";
    }
    int bad = 0, compared = 0;
    for (TrainConfig cfg : cases) {
        cfg.val_every = 1;
        cfg.val_steps = 1;
        cfg.val_data = cfg.train_data;
        GPT2Config mc;
        config_from_descriptor(cfg.init, &mc);
        const RunShape shape = run_shape(cfg, mc, kB, kT, N, shard_group_ranks(cfg, N, 0));
        MemoryUse ran;
        int differs = 0;
        {
            ::Run<Tallying> run(cfg, comm);
            differs += run.zero->group_size() != (shape.shard_group > 0 ? shape.shard_group : N);
            train_step(run, 0);
            evaluate_when_due(run, 1, false);
            ran = run.memory();
        }
        MemoryUse planned = plan_memory<TestBackend>(shape, r);
        if (cfg.quantize_grads != "none" && N > 1) {  // the plan holds the quantized collectives' buffers
            RunShape unquantized = shape;
            unquantized.quantize_weights = unquantized.quantize_grads = false;
            differs += plan_memory<TestBackend>(unquantized, r).zero.comm >= planned.zero.comm;
        }
        differs += (planned.fp8 > 0) != (cfg.fp8 != "none");
        if (!kCompareBackendMemory) planned.backend = ran.backend = BackendMemory{};
        // what the backend allocates within itself, not through alloc and alloc_pinned
        const size_t backend_own = planned.backend.context + planned.backend.kernel_scratch;
        const std::vector<MemoryCategory> p = memory_categories(planned), q = memory_categories(ran);
        differs += planned.unnamed != 0 || memory_line(r, planned) != memory_line(r, ran) ||
                      Tallying::device.most + backend_own != memory_total(planned, false) ||
                      Tallying::pinned.most + planned.backend.pinned_uploads != memory_total(planned, true) ||
                      Tallying::device.now != 0 || Tallying::pinned.now != 0;
        for (size_t i = 0; i < p.size(); i++) differs += p[i].bytes != q[i].bytes;
        if (differs)
            ADD_FAILURE() << "rank " << r << " of " << N << ", " << shape_flags(shape) << ": planned\n  " << memory_line(r, planned)
                          << " (unnamed " << planned.unnamed << ", device total " << memory_total(planned, false) << ")\nran\n  "
                          << memory_line(r, ran) << " (allocated at most " << Tallying::device.most << " + backend " << backend_own
                          << ", pinned " << Tallying::pinned.most << ")";
        bad += differs != 0;
        compared++;
        Tallying::device = {}, Tallying::pinned = {};
    }
    EXPECT_EQ(failures_everywhere(bad), 0);
    EXPECT_EQ(compared, 29);
}

// The memory budget is shared by the ranks whose GPU ids match, whatever each rank sees: under a
// per-rank CUDA_VISIBLE_DEVICES every rank sees one device, and 8 ranks on 8 GPUs share nothing
TEST(MemoryBudget, SharedByTheRanksOnTheSameGpu) {
    auto gpu = [](unsigned char id) {
        GpuUuid u{};
        u[0] = 0x5a;
        u[15] = id;
        return u;
    };
    std::vector<GpuUuid> eight;
    for (unsigned char i = 0; i < 8; i++) eight.push_back(gpu(7 - i));
    for (int r = 0; r < 8; r++) EXPECT_EQ(ranks_sharing_gpu(eight, r), 1) << "8 ranks, 8 GPUs, rank " << r;
    EXPECT_EQ(ranks_sharing_gpu({gpu(3), gpu(3)}, 0), 2) << "2 ranks on one GPU";
    EXPECT_EQ(ranks_sharing_gpu({gpu(3), gpu(3)}, 1), 2);
    const std::vector<GpuUuid> mixed = {gpu(0), gpu(1), gpu(0), gpu(0), gpu(2)};
    EXPECT_EQ(ranks_sharing_gpu(mixed, 0), 3);
    EXPECT_EQ(ranks_sharing_gpu(mixed, 1), 1);
    EXPECT_EQ(ranks_sharing_gpu(mixed, 3), 3);
    EXPECT_EQ(ranks_sharing_gpu(mixed, 4), 1);
}

// The ranks of a node are counted by MPI (its shared-memory split), not from OpenMPI's variables,
// which other launchers (Slurm's srun) do not set: every rank of this job runs on this machine
TEST(NodeRanks, CountedWithoutTheLaunchersVariables) {
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const std::unique_ptr<Communicator> comm_owned = make_comm(MPI_COMM_WORLD);
    Communicator& comm = *comm_owned;
    const Communicator::NodeRanks node = comm.node_ranks();
    EXPECT_EQ(node.here, comm.world());
    EXPECT_EQ(node.per_node, comm.world());
    // the CPU backend's budget: this machine's available memory, shared by them all
    const MemoryBudget shared = memory_budget<CpuBackend>("", node.here), alone = memory_budget<CpuBackend>("", 1);
    if (alone.bytes != SIZE_MAX) {  // known (Linux's /proc/meminfo)
        EXPECT_NEAR((double)shared.bytes, (double)alone.bytes / comm.world(), 0.05 * alone.bytes / comm.world());
        if (comm.world() > 1) {
            EXPECT_NE(shared.source.find("shared by " + std::to_string(comm.world()) + " ranks"), std::string::npos) << shared.source;
        }
    }
}

// NCCL exactly when no two ranks of a node hold the same GPU, however many GPUs each one sees
TEST(CommChoice, NcclWhenEveryLocalRankHasItsOwnGpu) {
    auto gpu = [](unsigned char id) {
        GpuUuid u{};
        u[0] = 0x5a;
        u[15] = id;  // ids that differ in one byte only
        return u;
    };
    EXPECT_TRUE(choose_communicator({gpu(0)}).nccl);
    EXPECT_TRUE(choose_communicator({gpu(3), gpu(1), gpu(2), gpu(0), gpu(7), gpu(6), gpu(5), gpu(4)}).nccl)
        << "8 ranks on 8 GPUs (each seeing one, in any order)";
    EXPECT_FALSE(choose_communicator({gpu(0), gpu(0)}).nccl) << "2 ranks on one GPU";
    const CommChoice shared = choose_communicator({gpu(0), gpu(1), gpu(0)});
    EXPECT_FALSE(shared.nccl);
    EXPECT_EQ(shared.why, "local ranks 0 and 2 share a GPU");
}

// The optimizer's table for every world size, rank and stage (stage 0 plans for one rank): each
// entry's elements are the model parameters rounding_index names, at the offsets where the stage
// keeps them, and over all ranks every parameter is updated (and rounded) exactly once.
TEST(ShardTable, RoundingIndexIsTheModelIndexAtEveryStage) {
    GPT2Config mc;
    config_from_descriptor(kModelDesc, &mc);
    ParamLayout layout(mc);
    const auto groups = param_groups(mc);
    for (int N = 1; N <= 4; N++) {
        const PartitionPlan plan(groups, N);
        for (int stage = N == 1 ? 0 : 1; stage <= 3; stage++) {
            const bool full_params = stage <= 2, full_grads = stage <= 1;
            std::vector<int> updates(layout.total, 0);
            size_t bad = 0;
            for (int r = 0; r < N; r++) {
                // rank r's shard element -> its flat index, from the groups alone (none: padding)
                std::vector<uint64_t> flat_of;
                for (const auto& g : groups)
                    for (const auto& t : g) {
                        const size_t chunk = (t.n + N - 1) / N;
                        for (size_t i = r * chunk; i < (r + 1) * chunk; i++) flat_of.push_back(i < t.n ? t.offset + i : UINT64_MAX);
                    }
                size_t start = 0;
                for (const ShardTensor& t : plan.shard_table(r, full_params, full_grads)) {
                    bad += t.start != start;
                    start += t.n;
                    for (size_t i = 0; i < t.n; i++) {
                        const uint64_t flat = flat_of[t.state_offset + i];
                        bad += flat == UINT64_MAX || rounding_index(t, i) != flat;
                        bad += t.param_offset + i != (full_params ? flat : t.state_offset + i);
                        bad += t.grad_offset + i != (full_grads ? flat : t.state_offset + i);
                        if (flat < layout.total) updates[flat]++;
                    }
                }
            }
            EXPECT_EQ(bad, 0u) << "N=" << N << " stage " << stage;
            EXPECT_EQ(std::count(updates.begin(), updates.end(), 1), (long)layout.total)
                << "N=" << N << " stage " << stage << ": a parameter is updated never or twice";
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#ifdef __CUDACC__
    std::string why;
    if (!CudaBackend::available(&why)) {
        int world = 1;  // said, so that a run without a GPU still shows mpirun started every rank
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (rank == 0) printf("skipped: no GPU (%s), %d ranks started\n", why.c_str(), world);
        MPI_Finalize();
        return 0;
    }
    // every rank on GPU 0 (NCCL would refuse, the MPI communicator does not), or over NCCL the
    // ranks of a node on its GPUs in turn
    int local_rank = 0;
    if (comm_kind() == "nccl") {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_free(&node);
    }
    CudaBackend::init(local_rank);
#endif
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new WorstErrorPrinter(worst_everywhere, rank == 0));
    // one data file for all ranks, written by rank 0 (tokens below the model's vocabulary)
    char dir[256] = {0};
    if (rank == 0) snprintf(dir, sizeof(dir), "%s", temp_dir().c_str());
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    g_data_dir = dir;
    if (rank == 0) write_shard(g_data_dir + "/train.bin", learnable_tokens(20000, 200));
    MPI_Barrier(MPI_COMM_WORLD);
    int result = RUN_ALL_TESTS();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) [[maybe_unused]] int rc = system(("rm -rf " + g_data_dir).c_str());
    MPI_Finalize();
    return result;
}
