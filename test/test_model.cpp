// The CPU backend against PyTorch: logits, loss, every parameter gradient, and ten AdamW steps
// with clipping and weight decay, from the debug state written by scripts/gpt2_reference.py
// for the checkpoint test/fixtures/tiny_model.bin (L=2, NH=4, C=64, V=101, B=2, T=16).
//
// The reference is fp64 (rounded to fp32 when written), so the tolerances bound this backend's
// fp32 rounding alone, on any machine and BLAS kernel:
//   loss, per-step losses      1e-5 relative
//   logits                     1e-5 absolute + 1e-5 relative
//   gradients                  1e-6 absolute + 1e-4 relative
//   gradient norms             1e-5 relative
//   parameters after 10 steps  2e-5 absolute + 1e-5 relative: the fixture's eps (1e-4) bounds how
//                              far Adam can carry gradient rounding (scripts/make_fixtures.sh)
#include "test_util.h"

namespace {

const char* kModel = "test/fixtures/tiny_model.bin";
const char* kState = "test/fixtures/tiny_debug_state.bin";
const char* kAccumState = "test/fixtures/tiny_debug_state_accum3.bin";

struct Fixture {
    DebugState state{kState};
    GPT2Config config;
    std::vector<float> params = load_checkpoint(kModel, &config);
};

// scripts/make_fixtures.sh writes L=2,NH=4,C=64,V=101,maxT=32 (so Vp=128): all different
TEST(Model, CheckpointMatchesFixtureHeader) {
    Fixture f;
    EXPECT_EQ(std::vector<int>({f.config.max_seq_len, f.config.vocab_size, f.config.num_layers, f.config.num_heads,
                                f.config.channels, f.config.padded_vocab_size}),
              std::vector<int>({32, 101, 2, 4, 64, 128}));
    EXPECT_EQ(f.config.vocab_size, f.state.V);
    EXPECT_EQ(f.config.padded_vocab_size, f.state.Vp);
    EXPECT_EQ(ParamLayout(f.config).total, f.state.num_params);
}

TEST(Model, MatchesPyTorch) {
    Fixture f;
    const DebugState& s = f.state;
    ModelRun run = run_debug_state<CpuBackend>(s, f.config, f.params);
    EXPECT_NEAR(run.loss, s.loss, 1e-5 * s.loss);
    EXPECT_LE(tolerance_ratio(run.logits.data(), s.logits.data(), run.logits.size(), 1e-5, 1e-5), 1.0);
    ParamLayout layout(f.config);
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        double r = tolerance_ratio(run.grads.data() + layout.offset[p], s.grads.data() + layout.offset[p], layout.size[p], 1e-4, 1e-6);
        EXPECT_LE(r, 1.0) << "gradient of parameter tensor " << p;
    }
    int clipped = 0;
    for (int step = 0; step < s.steps; step++) {
        EXPECT_NEAR(run.losses[step], s.losses[step], 1e-5 * s.losses[step]) << "step " << step;
        EXPECT_NEAR(run.norms[step], s.norms[step], 1e-5 * s.norms[step]) << "step " << step;
        clipped += run.norms[step] > s.grad_clip;
    }
    EXPECT_GT(clipped, 0) << "the fixture must exercise gradient clipping";
    EXPECT_LE(tolerance_ratio(run.params.data(), s.params_after.data(), run.params.size(), 1e-5, 2e-5), 1.0);
}

// A checkpoint from elsewhere may hold anything in wte's padded rows V..Vp-1. Their logits must
// take no part in the loss and the rows must get exactly zero gradient: the model with large
// random padded rows gives the loss and gradients of the same model with the padding removed
// (Vp = V), to fp32 rounding (the matmuls differ only in width: 1e-6 relative, 1e-7 absolute).
TEST(Model, PaddedVocabularyRowsTakeNoPart) {
    Fixture f;
    const DebugState& s = f.state;
    const int V = f.config.vocab_size, Vp = f.config.padded_vocab_size, C = f.config.channels;
    ASSERT_GT(Vp, V);
    std::vector<float> padded = f.params;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);  // 50x the real rows' scale: they would dominate the softmax
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) padded[i] = normal(rng);
    GPT2Config unpadded = f.config;
    unpadded.padded_vocab_size = V;
    std::vector<float> trimmed(padded.begin(), padded.begin() + (size_t)V * C);  // wte is the first tensor
    trimmed.insert(trimmed.end(), padded.begin() + (size_t)Vp * C, padded.end());
    ASSERT_EQ(trimmed.size(), ParamLayout(unpadded).total);

    auto loss_and_grads = [&](const GPT2Config& c, const std::vector<float>& params) {
        Zero<CpuBackend> zero(0, param_groups(c), single_comm());
        zero.load(params.data());
        GPT2<CpuBackend> model(c, s.B, s.T, 0, zero);
        LossSum<CpuBackend> sum;
        zero.zero_grads();
        model.forward(s.x.data(), s.y.data(), s.B, s.T, 1.0f / (s.B * s.T));
        sum.add_batch_mean(model.device_losses(), s.B * s.T);
        model.backward(s.B, s.T);
        const float loss = (float)sum.take();
        return std::make_pair(loss, gradients_to_host(zero));
    };
    auto [loss, grads] = loss_and_grads(f.config, padded);
    auto [want_loss, want_grads] = loss_and_grads(unpadded, trimmed);
    EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss);
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) ASSERT_EQ(grads[i], 0.0f) << "padded wte element " << i;
    grads.erase(grads.begin() + (size_t)V * C, grads.begin() + (size_t)Vp * C);
    EXPECT_LE(tolerance_ratio(grads.data(), want_grads.data(), grads.size(), 1e-6, 1e-7), 1.0);
}

// Gradient accumulation through the trainer itself: train() on one rank with A = 3 micro-batches
// per step against PyTorch summing the same micro-batches' gradients (the fixture's batch is one
// stream of A*B*T+1 tokens, which the data loader cuts into the same A windows every step).
// Then the same run stopped after 5 steps and resumed (-y 1) continues bit for bit. Tolerances
// as in MatchesPyTorch.
TEST(Model, AccumulationMatchesPyTorchAndResumes) {
    DebugState s(kAccumState);
    ASSERT_EQ(s.accum, 3);
    const int B = s.B / s.accum, BT = s.B * s.T;
    std::vector<uint16_t> stream(s.x.begin(), s.x.end());
    stream.push_back((uint16_t)s.y.back());
    for (int i = 0; i < BT; i++) ASSERT_EQ(s.y[i], stream[i + 1]) << "the fixture's targets are its inputs shifted by one";
    const std::string dir = temp_dir();
    write_shard(dir + "/stream.bin", stream);

    TrainConfig cfg = tiny_config(dir + "/stream.bin", 1);
    cfg.init = kModel;
    cfg.B = B;
    cfg.T = s.T;
    cfg.total_batch = (long)BT;  // B*T per micro-batch, so A = 3
    cfg.max_steps = s.steps;
    cfg.schedule = "constant";
    cfg.lr = s.lr, cfg.beta1 = s.beta1, cfg.beta2 = s.beta2, cfg.eps = s.eps;
    cfg.weight_decay = s.weight_decay, cfg.grad_clip = s.grad_clip;
    cfg.output_dir = dir + "/out";
    cfg.checkpoint_every = 5;
    std::vector<float> grads, params;
    std::vector<StepRecord> whole = train<CpuBackend>(cfg, single_comm(), [&](int step, Zero<CpuBackend>& zero) {
        if (step == 0) grads = gradients_to_host(zero);  // the first step's, summed over the micro-batches
        if (step == s.steps - 1) {
            params.resize(zero.plan().total());
            zero.save(params.data());
        }
    });
    ASSERT_EQ((int)whole.size(), s.steps);
    EXPECT_NEAR(whole[0].loss, s.loss, 1e-5 * s.loss);
    GPT2Config c;
    load_checkpoint(kModel, &c);
    ParamLayout layout(c);
    for (int p = 0; p < NUM_PARAM_TENSORS; p++) {
        double r = tolerance_ratio(grads.data() + layout.offset[p], s.grads.data() + layout.offset[p], layout.size[p], 1e-4, 1e-6);
        EXPECT_LE(r, 1.0) << "gradient of parameter tensor " << p;
    }
    int clipped = 0;
    for (int step = 0; step < s.steps; step++) {
        EXPECT_NEAR(whole[step].loss, s.losses[step], 1e-5 * s.losses[step]) << "step " << step;
        EXPECT_NEAR(whole[step].norm, s.norms[step], 1e-5 * s.norms[step]) << "step " << step;
        clipped += whole[step].norm > s.grad_clip;
    }
    EXPECT_GT(clipped, 0) << "the fixture must exercise gradient clipping";
    EXPECT_LE(tolerance_ratio(params.data(), s.params_after.data(), params.size(), 1e-5, 2e-5), 1.0);

    remove(checkpoint_path(cfg.output_dir, "state", s.steps).c_str());  // so the latest is step 5
    cfg.resume = 1;
    std::vector<StepRecord> rest = train<CpuBackend>(cfg, single_comm());
    ASSERT_EQ(rest.size(), whole.size() - 5);
    EXPECT_EQ(0, memcmp(rest.data(), whole.data() + 5, rest.size() * sizeof(StepRecord)));
    EXPECT_EQ(load_checkpoint(checkpoint_path(cfg.output_dir, "model", s.steps), &c), params);
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// Recomputing GELU and layernorm in backward must not change a single bit.
TEST(Model, RecomputeGivesIdenticalGradients) {
    Fixture f;
    const DebugState& s = f.state;
    std::vector<float> reference;
    for (int recompute = 0; recompute <= 2; recompute++) {
        Zero<CpuBackend> zero(0, param_groups(f.config), single_comm());
        zero.load(f.params.data());
        GPT2<CpuBackend> model(f.config, s.B, s.T, recompute, zero);
        zero.zero_grads();
        model.forward(s.x.data(), s.y.data(), s.B, s.T, 1.0f / (s.B * s.T));
        model.backward(s.B, s.T);
        std::vector<float> grads = gradients_to_host(zero);
        if (recompute == 0) reference = grads;
        else EXPECT_EQ(0, memcmp(grads.data(), reference.data(), grads.size() * 4)) << "recompute " << recompute;
    }
}

// tolerance_ratio, which the comparisons above go through: a NaN is out of tolerance, and the
// element nearest its limit is what worst_error() keeps for the GPU check's summary line
TEST(ToleranceRatio, NanFailsAndTheWorstIsNoted) {
    const float want[3] = {1.0f, 2.0f, 4.0f}, near[3] = {1.0f, 2.1f, 4.1f}, nan[3] = {1.0f, NAN, 4.0f};
    worst_error() = WorstError();
    // limits 0.1 + 0.1 |want|: errors 0, 0.1 of 0.3, 0.1 of 0.5
    EXPECT_NEAR(tolerance_ratio(near, want, 3, 0.1, 0.1, "near"), 1.0 / 3, 1e-6);
    EXPECT_NEAR(worst_error().error, 0.1, 1e-6);
    EXPECT_NEAR(worst_error().tolerance, 0.3, 1e-6);
    EXPECT_EQ(worst_error().what, "near");
    EXPECT_FALSE(tolerance_ratio(nan, want, 3, 0.1, 0.1, "nan") <= 1.0);
    tolerance_ratio(near, want, 3, 0.1, 0.1, "near again");
    EXPECT_EQ(worst_error().what, "nan") << "a NaN is the worst error of all";
}

}  // namespace
