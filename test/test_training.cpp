// Flags, learning-rate schedules, determinism and a short real training run.
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
                           "0.8", "--beta2", "0.99", "--eps", "1e-6", "--grad-clip", "0", "--device", "cpu"});
    EXPECT_EQ(c.train_data, "a*.bin");
    EXPECT_EQ(c.val_data, "v.bin");
    EXPECT_EQ(c.init, "d6");
    EXPECT_EQ(c.output_dir, "dir");
    EXPECT_EQ(std::vector<long>({c.B, c.T, c.total_batch, c.max_steps, c.warmup, c.val_every, c.val_steps, c.sample_every,
                                 c.gen_len, c.overfit, c.checkpoint_every, c.zero_stage, c.recompute, c.seed}),
              std::vector<long>({8, 128, 4096, 5, 3, 7, 2, 9, 16, 1, 4, 3, 2, 42}));
    EXPECT_EQ(std::vector<float>({c.lr, c.final_lr_frac, c.weight_decay, c.beta1, c.beta2, c.eps, c.grad_clip}),
              std::vector<float>({0.001f, 0.1f, 0.1f, 0.8f, 0.99f, 1e-6f, 0.0f}));
    EXPECT_EQ(c.schedule, "wsd");
    EXPECT_EQ(c.device, "cpu");
}

TEST(Flags, LongNamesMatchShortOnes) {
    TrainConfig a = parse({"-b", "3", "-z", "2", "-k", "linear"});
    TrainConfig b = parse({"--batch", "3", "--zero", "2", "--schedule", "linear"});
    EXPECT_EQ(a.B, b.B);
    EXPECT_EQ(a.zero_stage, b.zero_stage);
    EXPECT_EQ(a.schedule, b.schedule);
}

TEST(Flags, BadValuesExitWithCode2) {
    EXPECT_EXIT(parse({"-W", "1"}), ExitedWithCode(2), "unknown flag -W");
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
    EXPECT_EXIT(config_from_descriptor("L=2,X=3", new GPT2Config), ExitedWithCode(2), "unknown model descriptor key 'X'");
    EXPECT_EXIT(config_from_descriptor("L=2,NH=3,C=8", new GPT2Config), ExitedWithCode(2), "C=8 is not a multiple of NH=3");
}

// every numeric flag refuses a value just outside its range, and a non-number
TEST(Flags, EveryNumericFlagIsRangeChecked) {
    for (const Flag& f : kFlags) {
        if (f.kind == 's') continue;
        char below[32], above[32];
        snprintf(below, sizeof(below), f.kind == 'f' ? "%.9g" : "%.0f", f.min - (f.kind == 'f' ? std::max(1e-6, std::fabs(f.min) * 1e-3) : 1));
        snprintf(above, sizeof(above), f.kind == 'f' ? "%.9g" : "%.0f", f.max + (f.kind == 'f' ? std::max(1e-6, std::fabs(f.max) * 1e-3) : 1));
        EXPECT_EXIT(parse({f.long_name, below}), ExitedWithCode(2), "expected") << f.long_name << " " << below;
        EXPECT_EXIT(parse({f.long_name, above}), ExitedWithCode(2), "expected") << f.long_name << " " << above;
        EXPECT_EXIT(parse({f.long_name, "abc"}), ExitedWithCode(2), "expected") << f.long_name;
    }
}

// every flag the usage table lists is accepted by the parser, and nothing else is
TEST(Flags, HelpListsWhatTheParserAccepts) {
    char* text = nullptr;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    print_usage(out);
    fclose(out);
    std::string help(text);
    free(text);
    for (const Flag& f : kFlags) {
        EXPECT_NE(help.find(f.long_name), std::string::npos) << f.long_name;
        if (*f.short_name) {
            EXPECT_NE(help.find(std::string(f.short_name) + " "), std::string::npos) << f.short_name;
        }
        char value[32];
        snprintf(value, sizeof(value), f.kind == 'f' ? "%.9g" : "%.0f", f.max);  // the largest value each flag accepts
        if (f.kind == 's') snprintf(value, sizeof(value), "%s", std::string(f.long_name) == "--schedule" ? "cosine" : std::string(f.long_name) == "--device" ? "auto" : "x");
        parse({f.long_name, value});
    }
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

// no resume, no reuse: two runs from the same seed give the same bits
TEST_F(Training, SameSeedSameBits) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 2));
    auto a = train_tiny<CpuBackend>(dir + "/t.bin", 5, single_comm());
    auto b = train_tiny<CpuBackend>(dir + "/t.bin", 5, single_comm());
    auto c = train_tiny<CpuBackend>(dir + "/t.bin", 6, single_comm());
    ASSERT_EQ(a.first.size(), 5u);
    EXPECT_EQ(0, memcmp(a.first.data(), b.first.data(), a.first.size() * sizeof(StepRecord)));
    EXPECT_EQ(a.second, b.second);
    EXPECT_NE(a.second, c.second) << "a different seed must give a different model";
    [[maybe_unused]] int rc = system(("rm -rf " + dir).c_str());
}

// -y 1 continues from the latest checkpoint exactly as if the run had not stopped
TEST_F(Training, ResumeContinuesBitForBit) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
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

TEST_F(Training, ResumeNeedsACheckpoint) {
    std::string dir = temp_dir();
    write_shard(dir + "/t.bin", random_tokens(5000, 64, 4));
    TrainConfig cfg = tiny_config(dir + "/t.bin", 3);
    cfg.resume = 1;
    cfg.output_dir = dir;
    EXPECT_EXIT(train<CpuBackend>(cfg, single_comm()), ExitedWithCode(1), "no model_N.bin with its state_N.bin in");
    cfg.output_dir = "";
    EXPECT_EXIT(train<CpuBackend>(cfg, single_comm()), ExitedWithCode(2), "-y 1 needs the output directory");
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
