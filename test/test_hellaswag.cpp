// HellaSwag: the -h flag, the eval file reader (every bad file: one line, exit 1) and the scorer's
// batching, split across ranks and acc_norm, checked with a stand-in model whose losses are known.
// test/test_hellaswag.py compares the whole path with an independent PyTorch scoring.
#include "test_util.h"

namespace {

using ::testing::ExitedWithCode;

struct Example {
    int label;
    std::vector<uint16_t> context;
    std::vector<std::vector<uint16_t>> endings;
    std::vector<uint16_t> extra = {};  // written after the endings, counted in the example's bytes
};

// llm.c's layout, written here from its description (not by data/hellaswag.py)
std::vector<char> eval_file(const std::vector<Example>& examples) {
    std::vector<uint16_t> stream;
    int longest = 0;
    for (size_t i = 0; i < examples.size(); i++) {
        const Example& e = examples[i];
        std::vector<uint16_t> s = {65535, 0, (uint16_t)i, (uint16_t)e.label, (uint16_t)e.endings.size(), (uint16_t)e.context.size()};
        s.insert(s.end(), e.context.begin(), e.context.end());
        for (const auto& end : e.endings) {
            s.push_back((uint16_t)end.size());
            s.insert(s.end(), end.begin(), end.end());
        }
        s.insert(s.end(), e.extra.begin(), e.extra.end());
        s[1] = (uint16_t)(2 * s.size());
        longest = std::max(longest, (int)s[1]);
        stream.insert(stream.end(), s.begin(), s.end());
    }
    int32_t h[256] = {20240522, 1, (int32_t)examples.size(), longest};
    std::vector<char> bytes(sizeof(h) + 2 * stream.size());
    memcpy(bytes.data(), h, sizeof(h));
    memcpy(bytes.data() + sizeof(h), stream.data(), 2 * stream.size());
    return bytes;
}

// Seven examples, label i % 4. The label's ending is 3 tokens of 5 (lowest mean, highest sum),
// the others one token 10 + c; but in example 4 every ending is {7, 7} (a tie: the first wins,
// which is the label) and in example 5 the label's ending is {50, 50, 50}. With mean losses
// equal to token ids, acc_norm gets all but example 5 right.
std::vector<Example> seven_examples() {
    std::vector<Example> ex;
    for (int i = 0; i < 7; i++) {
        Example e{i % 4, {(uint16_t)(1 + i), 2, 3}, {}};
        for (int c = 0; c < 4; c++) {
            if (i == 4) e.endings.push_back({7, 7});
            else if (c == e.label) e.endings.push_back(std::vector<uint16_t>(3, i == 5 ? 50 : 5));
            else e.endings.push_back({(uint16_t)(10 + c)});
        }
        ex.push_back(e);
    }
    return ex;
}

// Its loss at each position is the target token's id, so an ending's mean loss is the mean of
// its token ids.
struct TokenIdModel {
    int forwards = 0;
    std::vector<int> first_inputs;
    std::vector<float> per_position;
    float forward(const int* inputs, const int* targets, int B, int T, float) {
        if (forwards++ == 0) first_inputs.assign(inputs, inputs + (size_t)B * T);
        per_position.assign(targets, targets + (size_t)B * T);
        return 0.0f;
    }
    const float* losses() const { return per_position.data(); }
};

double mean(const std::vector<uint16_t>& v) {
    double s = 0;
    for (uint16_t x : v) s += x;
    return s / v.size();
}

class HellaSwagFile : public ::testing::Test {
protected:
    void SetUp() override { dir_ = temp_dir(); }
    void TearDown() override { [[maybe_unused]] int rc = system(("rm -rf " + dir_).c_str()); }
    std::string write(const std::vector<char>& bytes, const char* name = "h.bin") const {
        std::string p = dir_ + "/" + name;
        FILE* f = open_file(p, "wb");
        fwrite(bytes.data(), 1, bytes.size(), f);
        fclose(f);
        return p;
    }
    std::string dir_;
};

TEST(HellaSwagFlags, HTakesZeroOrOneAndIsHelpWithoutAValue) {
    auto parse = [](std::vector<std::string> args) {
        std::vector<char*> argv{(char*)"train_gpt"};
        for (auto& a : args) argv.push_back(a.data());
        return parse_args((int)argv.size(), argv.data());
    };
    // in a child, since help exits: 3 + the value of -h when parsing returns
    auto h_value = [&](std::vector<std::string> args) { exit(3 + parse(args).hellaswag); };
    EXPECT_EXIT(h_value({"-h", "1"}), ExitedWithCode(4), "");
    EXPECT_EXIT(h_value({"-h", "1", "-x", "2"}), ExitedWithCode(4), "");
    EXPECT_EXIT(h_value({"--hellaswag", "1", "-h", "0"}), ExitedWithCode(3), "");
    EXPECT_EXIT(h_value({}), ExitedWithCode(3), "") << "llm.c's default is off";
    EXPECT_EQ(parse({"--hellaswag-file", "f.bin"}).hellaswag_file, "f.bin");
    EXPECT_EXIT(parse({"-h"}), ExitedWithCode(0), "");
    EXPECT_EXIT(parse({"-h", "-x", "2"}), ExitedWithCode(0), "");
    EXPECT_EXIT(parse({"-x", "2", "--help"}), ExitedWithCode(0), "");
    EXPECT_EXIT(parse({"-h", "2"}), ExitedWithCode(2), "-h 2: expected an integer in \\[0, 1\\]");
    EXPECT_EXIT(parse({"-h", "-1"}), ExitedWithCode(2), "-h -1: expected an integer");
    char* text = nullptr;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    print_usage(out);
    fclose(out);
    EXPECT_NE(std::string(text).find("-h  --hellaswag"), std::string::npos);
    EXPECT_NE(std::string(text).find("--help"), std::string::npos);
    free(text);
}

TEST_F(HellaSwagFile, ReadsWhatWasWritten) {
    std::vector<Example> ex = seven_examples();
    std::vector<EvalExample> back = read_eval_file(write(eval_file(ex)), 100);
    ASSERT_EQ(back.size(), ex.size());
    for (size_t i = 0; i < ex.size(); i++) {
        EXPECT_EQ(back[i].label, ex[i].label);
        EXPECT_EQ(back[i].context, std::vector<int>(ex[i].context.begin(), ex[i].context.end()));
        for (int c = 0; c < 4; c++) EXPECT_EQ(back[i].endings[c], std::vector<int>(ex[i].endings[c].begin(), ex[i].endings[c].end()));
    }
}

TEST_F(HellaSwagFile, EveryBadFileIsOneLineAndExitCode1) {
    const std::vector<char> good = eval_file(seven_examples());
    auto with = [&](size_t offset, uint16_t value) {  // good, one uint16 changed (offset in bytes)
        std::vector<char> b = good;
        memcpy(b.data() + offset, &value, 2);
        return b;
    };
    const size_t first = 1024;  // the first example's marker; its uint16s: marker, bytes, index, label,
                                // 4, context length, 3 context tokens, 3 + {5, 5, 5}, 1 + {11}, 1 + {12}, 1 + {13}
    std::vector<Example> extra = seven_examples();
    extra[2].extra = {0};
    struct Case { std::vector<char> bytes; const char* message; };
    std::vector<Case> cases = {
        {with(0, 1234), "bad magic [0-9]+ in HellaSwag file \\(expected 20240522\\)"},
        {with(4, 2), "unsupported HellaSwag file version 2 \\(expected 1\\)"},
        {std::vector<char>(good.begin(), good.begin() + 600), "truncated while reading the HellaSwag header"},
        {std::vector<char>(good.begin(), good.end() - 2), "truncated while reading an example"},
        {with(8, 8), "truncated while reading an example header"},  // the header announces 8
        {with(8, 60000), "header announces 60000 examples, more than the file's [0-9]+ bytes after it can hold \\([0-9]+ bytes each at least\\)"},
        {with(8, 0), "inconsistent HellaSwag header \\(0 examples"},
        {with(first, 7), "example 0 starts with 7, expected the marker 65535"},
        {with(first + 4, 3), "example 0 has index 3, expected 0"},
        {with(first + 2, 3), "example 0 claims 3 bytes"},
        {with(first + 6, 4), "example 0 has label 4, expected 0..3"},
        {with(first + 8, 3), "example 0 has 3 endings, expected 4"},
        {with(first + 12, 100), "example 0: token 100 is outside the model's vocabulary of 100"},
        {with(first + 10, 0), "example 0: part 0 \\(0: context, 1-4: endings\\) is empty"},
        {with(first + 34, 0), "example 0: part 4 \\(0: context, 1-4: endings\\) is empty or runs past the example's 38 bytes"},
        {with(first + 34, 2), "example 0: part 4 \\(0: context, 1-4: endings\\) is empty or runs past"},
        {eval_file(extra), "example 2 has 2 bytes after its last ending"},
    };
    std::vector<char> trailing = good;
    trailing.insert(trailing.end(), 6, 0);
    cases.push_back({trailing, "6 bytes after the last of the header's 7 examples"});
    for (const Case& c : cases) {
        const std::string p = write(c.bytes);
        EXPECT_EXIT(read_eval_file(p, 100), ExitedWithCode(1), std::string("^error: ") + p + ": (" + c.message + ")[^\n]*\n$") << c.message;
    }
    EXPECT_EXIT(read_eval_file(dir_ + "/none.bin", 100), ExitedWithCode(1), "cannot open HellaSwag file .*none.bin \\(data/hellaswag.py writes it\\)");
}

TEST_F(HellaSwagFile, BatchAndSequenceMustHoldAnExample) {
    const std::string p = write(eval_file(seven_examples()));
    EXPECT_EXIT(HellaSwag(p, 100, 3, 64, 0, 1), ExitedWithCode(2), "-h 1 needs -b 4 or more");
    // example 0: context 3 + longest ending 3 tokens
    EXPECT_EXIT(HellaSwag(p, 100, 4, 5, 0, 1), ExitedWithCode(2), "example 0 needs 6 tokens \\(context and longest ending\\), more than -t 5");
    HellaSwag(p, 100, 4, 6, 0, 1);
}

// With losses equal to token ids, each ending's mean and the prediction are known exactly.
TEST_F(HellaSwagFile, ScoresTheMeanLossOfEachEnding) {
    const std::vector<Example> ex = seven_examples();
    const std::string p = write(eval_file(ex));
    for (int B : {4, 8, 11}) {  // 1, 2 and 2 examples (3 rows idle) per forward
        HellaSwag hs(p, 100, B, 64, 0, 1);
        TokenIdModel model;
        HellaSwagScore s = hs.evaluate(model, single_comm());
        EXPECT_EQ(model.forwards, (7 + B / 4 - 1) / (B / 4));
        EXPECT_EQ(s.total, 7);
        EXPECT_EQ(s.correct, 6) << "example 5's label ending is not the lowest";
        EXPECT_DOUBLE_EQ(s.accuracy(), 6.0 / 7);
        ASSERT_EQ(s.ending_losses.size(), 28u);
        for (int i = 0; i < 7; i++)
            for (int c = 0; c < 4; c++) EXPECT_FLOAT_EQ(s.ending_losses[4 * i + c], (float)mean(ex[i].endings[c])) << i << " " << c;
        // row 1 of the first batch: example 0's context, then its ending 1, then zeros
        const size_t T = model.first_inputs.size() / (4 * (B / 4));
        EXPECT_EQ(std::vector<int>(model.first_inputs.begin() + T, model.first_inputs.begin() + 2 * T),
                  std::vector<int>({1, 2, 3, 11, 0, 0}));
    }
}

// A rank scores ceil(n / world) examples from rank * that on, and every rank runs as many forward
// passes as rank 0, also when it has fewer examples or none (ZeRO-3 forwards are collectives).
TEST_F(HellaSwagFile, RanksSplitTheExamplesAsLlmcDoes) {
    const std::vector<Example> ex = seven_examples();
    const std::string p = write(eval_file(ex));
    struct Share { int world, rank, correct, forwards; };
    // world 2: ranks get 0-3 and 4-6; world 3: 0-2, 3-5 and 6
    for (Share s : std::vector<Share>{{2, 0, 4, 4}, {2, 1, 2, 4}, {3, 0, 3, 3}, {3, 1, 2, 3}, {3, 2, 1, 3}}) {
        HellaSwag hs(p, 100, 4, 64, s.rank, s.world);
        TokenIdModel model;
        HellaSwagScore score = hs.evaluate(model, single_comm());  // one rank: the sum is its own count
        EXPECT_EQ(score.correct, s.correct) << s.world << " " << s.rank;
        EXPECT_EQ(model.forwards, s.forwards) << s.world << " " << s.rank;
    }
}

// Scoring runs forward passes with targets between training steps; none of their losses may
// reach the training loss, nor through it the -sl outlier detector: with -h 1 and -h 0 every
// step's record is the same bits, also over 140 steps with -sl on (its window full from step 128).
TEST_F(HellaSwagFile, ScoringNeverReachesTheTrainingLoss) {
    write_shard(dir_ + "/t.bin", random_tokens(5000, 64, 4));
    write_shard(dir_ + "/v.bin", random_tokens(2000, 64, 5));
    TrainConfig cfg = tiny_config(dir_ + "/t.bin", 3);
    cfg.B = 4;
    cfg.max_steps = 140;
    cfg.val_data = dir_ + "/v.bin";
    cfg.val_every = 3;
    cfg.val_steps = 1;
    cfg.skip_loss_z = 3.0f;
    cfg.hellaswag_file = write(eval_file(seven_examples()));
    std::vector<StepRecord> runs[2];
    for (int h = 0; h < 2; h++) {
        cfg.hellaswag = h;
        runs[h] = train<CpuBackend>(cfg, single_comm());
    }
    ASSERT_EQ(runs[1].size(), runs[0].size());
    for (size_t i = 0; i < runs[0].size(); i++)
        ASSERT_EQ(0, memcmp(&runs[1][i], &runs[0][i], sizeof(StepRecord)))
            << "step " << i << ": loss " << runs[1][i].loss << " with -h 1, " << runs[0][i].loss << " without; skipped "
            << runs[1][i].skipped << " vs " << runs[0][i].skipped;
}

}  // namespace
