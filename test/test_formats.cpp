// File formats: llm.c checkpoints, token shards and the tokenizer, read and written; every bad
// file gets one clear line and exit code 1.
#include <set>

#include "test_util.h"

namespace {

using ::testing::ExitedWithCode;

class Files : public ::testing::Test {
protected:
    void SetUp() override { dir_ = temp_dir(); }
    void TearDown() override { [[maybe_unused]] int rc = system(("rm -rf " + dir_).c_str()); }
    std::string path(const char* name) const { return dir_ + "/" + name; }
    std::string dir_;
};

// every header field different from every other (maxT 12, V 50, L 3, NH 2, C 8, Vp 128), so
// two fields swapped in the writer or the reader cannot pass
TEST_F(Files, CheckpointRoundTripIsExact) {
    GPT2Config c;
    config_from_descriptor("L=3,NH=2,C=8,V=50,maxT=12", &c);
    std::vector<float> params = random_init(c, 3);
    write_checkpoint(path("m.bin"), c, params, kCheckpointFp32);
    GPT2Config back;
    std::vector<float> loaded = load_checkpoint(path("m.bin"), &back);
    EXPECT_EQ(std::vector<int>({back.max_seq_len, back.vocab_size, back.num_layers, back.num_heads, back.channels,
                                back.padded_vocab_size}),
              std::vector<int>({12, 50, 3, 2, 8, 128}));
    EXPECT_EQ(params, loaded);
    // the header is llm.c's: magic, version 3, maxT, V, L, NH, C, Vp
    std::vector<char> raw = read_bytes(path("m.bin"));
    const int32_t* h = (const int32_t*)raw.data();
    EXPECT_EQ(std::vector<int32_t>(h, h + 8), (std::vector<int32_t>{20240326, 3, 12, 50, 3, 2, 8, 128}));
    EXPECT_EQ(raw.size(), 1024 + params.size() * 4);
    EXPECT_EQ(access((path("m.bin") + ".tmp").c_str(), F_OK), -1) << "temporary file left behind";
}

// The fixture was written by scripts/gpt2_reference.py, which writes llm.c's layout; a bf16
// (version 5) copy of it must load as the rounded values.
TEST_F(Files, LoadsBf16Checkpoint) {
    GPT2Config c;
    std::vector<float> params = load_checkpoint("test/fixtures/tiny_model.bin", &c);
    std::vector<char> raw = read_bytes("test/fixtures/tiny_model.bin");
    ((int32_t*)raw.data())[1] = 5;
    std::vector<char> bf16(raw.begin(), raw.begin() + 1024);
    for (size_t i = 0; i < params.size(); i++) {
        uint32_t u;
        memcpy(&u, &params[i], 4);
        uint16_t top = (uint16_t)(u >> 16);  // truncation: the test only needs a known value
        bf16.insert(bf16.end(), (char*)&top, (char*)&top + 2);
    }
    write_bytes(path("b.bin"), bf16.data(), bf16.size());
    GPT2Config cb;
    std::vector<float> loaded = load_checkpoint(path("b.bin"), &cb);
    ASSERT_EQ(loaded.size(), params.size());
    for (size_t i = 0; i < params.size(); i++) ASSERT_NEAR(loaded[i], params[i], std::fabs(params[i]) / 128 + 1e-30);
}

// the bf16 nearest to x, ties to an even mantissa, found by comparing the two neighbours in
// double: the reference for the writer's bit arithmetic
uint16_t nearest_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint16_t below = (uint16_t)(u >> 16), above = (uint16_t)(below + 1);  // toward zero, away from it
    const double d_below = std::fabs((double)x - bf16_bits_to_float(below)), d_above = std::fabs((double)x - bf16_bits_to_float(above));
    if (d_below != d_above) return d_below < d_above ? below : above;
    return (below & 1) == 0 ? below : above;
}

// The bf16 build writes version 5, as llm.c's bf16 build does (its parameters are bf16 already,
// so the file holds them exactly; the fp32 master weights go to the state file), the fp32 build
// version 3; any other value is rounded to the nearest bf16.
TEST_F(Files, Bf16BuildWritesVersion5) {
    EXPECT_EQ(checkpoint_version(sizeof(float)), 3);
    EXPECT_EQ(checkpoint_version(sizeof(uint16_t)), 5);
    GPT2Config c;
    config_from_descriptor("L=3,NH=2,C=8,V=50,maxT=12", &c);
    std::vector<float> params = random_init(c, 3);
    for (float& x : params) x = bf16_bits_to_float(nearest_bf16(x));  // what a bf16 build holds
    write_checkpoint(path("b.bin"), c, params, checkpoint_version(2));
    std::vector<char> raw = read_bytes(path("b.bin"));
    const int32_t* h = (const int32_t*)raw.data();
    EXPECT_EQ(std::vector<int32_t>(h, h + 8), (std::vector<int32_t>{20240326, 5, 12, 50, 3, 2, 8, 128}));
    EXPECT_EQ(raw.size(), 1024 + params.size() * 2);
    GPT2Config back;
    EXPECT_EQ(load_checkpoint(path("b.bin"), &back), params) << "bf16 values must come back exactly";

    std::vector<float> values = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-8f + 0x1p-20f, 0.0f, -0.0f};
    std::mt19937 rng(9);
    for (int i = 0; i < 10000; i++) {
        const uint32_t bits = rng() & 0xbfffffffu;  // any sign and mantissa, exponents below 2^1
        float x;
        memcpy(&x, &bits, 4);
        values.push_back(x);
    }
    for (float x : values) ASSERT_EQ(float_to_bf16_bits(x), nearest_bf16(x)) << x;
}

TEST_F(Files, BadCheckpointsFailWithOneLine) {
    GPT2Config c;
    config_from_descriptor("L=1,NH=1,C=4,V=10,maxT=4", &c);
    write_checkpoint(path("good.bin"), c, random_init(c, 1), kCheckpointFp32);
    std::vector<char> good = read_bytes(path("good.bin"));
    EXPECT_EXIT(load_checkpoint(path("missing.bin"), &c), ExitedWithCode(1), "cannot open .*missing.bin");
    write_bytes(path("short.bin"), good.data(), 100);
    EXPECT_EXIT(load_checkpoint(path("short.bin"), &c), ExitedWithCode(1), "truncated while reading the checkpoint header");
    write_bytes(path("cut.bin"), good.data(), good.size() - 4);
    EXPECT_EXIT(load_checkpoint(path("cut.bin"), &c), ExitedWithCode(1), "expected [0-9]+ for this header");
    std::vector<char> bad = good;
    ((int32_t*)bad.data())[0] = 1234;
    write_bytes(path("magic.bin"), bad.data(), bad.size());
    EXPECT_EXIT(load_checkpoint(path("magic.bin"), &c), ExitedWithCode(1), "bad magic 1234 in checkpoint \\(expected 20240326\\)");
    bad = good;
    ((int32_t*)bad.data())[1] = 4;
    write_bytes(path("version.bin"), bad.data(), bad.size());
    EXPECT_EXIT(load_checkpoint(path("version.bin"), &c), ExitedWithCode(1), "unsupported checkpoint version 4");
    bad = good;
    ((int32_t*)bad.data())[5] = 3;  // NH=3 does not divide C=4
    write_bytes(path("header.bin"), bad.data(), bad.size());
    EXPECT_EXIT(load_checkpoint(path("header.bin"), &c), ExitedWithCode(1), "inconsistent checkpoint header");
}

// the smallest model: 156 parameters
GPT2Config one_channel_model() {
    GPT2Config c;
    config_from_descriptor("L=1,NH=1,C=1,V=1,maxT=1", &c);
    return c;
}

// a state of step 7 for one_channel_model(): m, v and master weights counting up, a shuffled
// loader of 5 windows and two outlier windows
OptimizerState example_state() {
    const size_t n = ParamLayout(one_channel_model()).total;
    OptimizerState s;
    s.step = 7;
    s.sample_rng = 0x123456789abcdefull;
    for (size_t i = 0; i < n; i++) s.m.push_back(1.0f + i), s.v.push_back(2.0f + i), s.master.push_back(3.0f + i);
    s.loader = {12, 8, 5, 0xfeedull, 1, {4, 0, 3, 1, 2}};
    OutlierDetector d;
    for (int i = 0; i < 200; i++) d.update(i % 7, 0.0);
    s.loss_z = d.state();
    d.update(100.0, 0.0);
    s.grad_z = d.state();
    return s;
}

TEST_F(Files, OptimizerStateRoundTripAndBadFiles) {
    const GPT2Config c = one_channel_model();
    ASSERT_EQ(ParamLayout(c).total, 156u);
    const OptimizerState s = example_state();
    write_state(path("s.bin"), s);
    OptimizerState back = read_state(path("s.bin"), 7, c, true);
    EXPECT_EQ(back.step, 7);
    EXPECT_EQ(back.sample_rng, s.sample_rng);
    EXPECT_EQ(back.m, s.m);
    EXPECT_EQ(back.v, s.v);
    EXPECT_EQ(back.master, s.master);
    EXPECT_EQ(std::vector<uint64_t>({back.loader.position, back.loader.window, back.loader.windows, back.loader.seed}),
              std::vector<uint64_t>({12, 8, 5, 0xfeed}));
    EXPECT_EQ(back.loader.shuffled, 1);
    EXPECT_EQ(back.loader.order, s.loader.order);
    EXPECT_EQ(0, memcmp(&back.loss_z, &s.loss_z, sizeof(s.loss_z)));
    EXPECT_EQ(0, memcmp(&back.grad_z, &s.grad_z, sizeof(s.grad_z)));
    OptimizerState no_master = read_state(path("s.bin"), 7, c, false);
    EXPECT_TRUE(no_master.master.empty());
    EXPECT_EQ(no_master.loader.order, s.loader.order) << "skipping the master weights must land on the order";
    GPT2Config wider = c;
    wider.channels = 2;
    EXPECT_EXIT(read_state(path("s.bin"), 7, wider, true), ExitedWithCode(1), "state for 156 parameters, the model has " + std::to_string(ParamLayout(wider).total));
    EXPECT_EXIT(read_state(path("s.bin"), 8, c, true), ExitedWithCode(1), "state of step 7, expected 8 \\(the step its checkpoint is named by\\)");
    std::vector<char> raw = read_bytes(path("s.bin"));
    write_bytes(path("cut.bin"), raw.data(), raw.size() - 4);
    EXPECT_EXIT(read_state(path("cut.bin"), 7, c, true), ExitedWithCode(1), "optimizer state is [0-9]+ bytes, expected [0-9]+");
    ((int32_t*)raw.data())[0] = 5;
    write_bytes(path("magic.bin"), raw.data(), raw.size());
    EXPECT_EXIT(read_state(path("magic.bin"), 7, c, true), ExitedWithCode(1), "bad magic 5 in optimizer state \\(expected 20240527\\)");
    ((int32_t*)raw.data())[0] = 20240527;
    ((int32_t*)raw.data())[1] = 1;
    write_bytes(path("version.bin"), raw.data(), raw.size());
    EXPECT_EXIT(read_state(path("version.bin"), 7, c, true), ExitedWithCode(1), "unsupported optimizer state version 1 \\(expected 3\\)");
    ((int32_t*)raw.data())[1] = 3;
    ((int32_t*)raw.data())[3] = 2;
    write_bytes(path("flag.bin"), raw.data(), raw.size());
    EXPECT_EXIT(read_state(path("flag.bin"), 7, c, true), ExitedWithCode(1), "master weights 2, shuffled 1 \\(expected 0 or 1 each\\)");
}

// A NaN or infinity in a model file, or in the state's m, v or master weights (or a negative v),
// would reach the weights at the first update: each is refused with one line naming the tensor
// (by llm.c's names, the layer for a per-layer one) and the index, in the tensor and in the file.
TEST_F(Files, NonFiniteValuesAreRefusedNamingTheirTensor) {
    GPT2Config c;
    config_from_descriptor("L=2,NH=2,C=8,V=50,maxT=12", &c);
    const ParamLayout layout(c);
    const size_t fc1 = layout.offset[FCW] + layout.size[FCW] / 2 + 5;  // layer 1's c_fc weight, its value 5
    std::vector<float> params = random_init(c, 3);
    params[fc1] = NAN;
    write_checkpoint(path("nan.bin"), c, params, kCheckpointFp32);
    const std::string fc1_at = "h\\.1\\.mlp\\.c_fc\\.weight\\[5\\] \\(value " + std::to_string(fc1) + " of " + std::to_string(layout.total) + "\\)";
    EXPECT_EXIT(load_checkpoint(path("nan.bin"), &c), ExitedWithCode(1), "nan.bin: parameter " + fc1_at + " is nan; a model file must hold finite values");
    params = random_init(c, 3);
    params[layout.offset[WPE] + 7] = -INFINITY;
    write_checkpoint(path("inf.bin"), c, params, kCheckpointBf16);
    EXPECT_EXIT(load_checkpoint(path("inf.bin"), &c), ExitedWithCode(1), "inf.bin: parameter wpe\\[7\\] \\(value " + std::to_string(layout.offset[WPE] + 7) + " of [0-9]+\\) is -inf");

    const GPT2Config one = one_channel_model();
    const size_t ln_f_bias = ParamLayout(one).offset[LNFB];
    OptimizerState s = example_state();
    s.m[3] = NAN;
    write_state(path("m.bin"), s);
    EXPECT_EXIT(read_state(path("m.bin"), 7, one, true), ExitedWithCode(1), "m.bin: Adam m of wte\\[3\\] \\(value 3 of 156\\) is nan");
    s = example_state();
    s.v[ln_f_bias] = -1.0f;
    write_state(path("v.bin"), s);
    EXPECT_EXIT(read_state(path("v.bin"), 7, one, true), ExitedWithCode(1), "v.bin: Adam v of ln_f\\.bias\\[0\\] \\(value 155 of 156\\) is -1");
    s = example_state();
    s.master[ln_f_bias] = INFINITY;
    write_state(path("master.bin"), s);
    EXPECT_EXIT(read_state(path("master.bin"), 7, one, true), ExitedWithCode(1), "master weight of ln_f\\.bias\\[0\\] \\(value 155 of 156\\) is inf");
    EXPECT_EQ(read_state(path("master.bin"), 7, one, false).m, s.m) << "master weights not read are not checked";
}

// The counts in a header (the issue's cases, which ended in std::bad_alloc) are checked against
// the file's size before anything is allocated: one line, exit 1.
TEST_F(Files, HeaderCountsAreCheckedAgainstTheFileSize) {
    std::vector<char> tok = read_bytes("data/tinyshakespeare/gpt2_tokenizer.bin");
    for (int32_t vocab : {-1, 0, 1 << 30, INT32_MAX, INT32_MIN}) {
        ((int32_t*)tok.data())[2] = vocab;
        write_bytes(path("tok.bin"), tok.data(), tok.size());
        EXPECT_EXIT(Tokenizer(path("tok.bin")), ExitedWithCode(1), "tok.bin: the header's vocabulary of [0-9]+ tokens, expected 1 to [0-9]+ \\(a byte each at least") << vocab;
    }
    ((int32_t*)tok.data())[2] = 50000;  // fewer tokens than the file holds
    ((int32_t*)tok.data())[3] = 0;
    write_bytes(path("tok.bin"), tok.data(), tok.size());
    EXPECT_EXIT(Tokenizer(path("tok.bin")), ExitedWithCode(1), "tok.bin: [0-9]+ bytes after the last of the header's 50000 tokens");

    write_state(path("s.bin"), example_state());
    std::vector<char> state = read_bytes(path("s.bin"));
    for (int32_t high : {1 << 30, INT32_MIN, -1, 1}) {  // the window count's high half
        ((int32_t*)state.data())[13] = high;
        write_bytes(path("s.bin"), state.data(), state.size());
        EXPECT_EXIT(read_state(path("s.bin"), 7, one_channel_model(), true), ExitedWithCode(1), "optimizer state is [0-9]+ bytes, expected [0-9]+ for 156 parameters with master weights and [0-9]+ windows") << high;
    }

    GPT2Config c;
    config_from_descriptor("L=1,NH=1,C=4,V=10,maxT=4", &c);
    write_checkpoint(path("m.bin"), c, random_init(c, 1), kCheckpointFp32);
    std::vector<char> model = read_bytes(path("m.bin"));
    for (int field = 2; field <= 7; field++) {
        for (int32_t value : {INT32_MAX, 1 << 30, (1 << 21) + 1}) {
            std::vector<char> bad = model;
            ((int32_t*)bad.data())[field] = value;
            write_bytes(path("bad.bin"), bad.data(), bad.size());
            EXPECT_EXIT(load_checkpoint(path("bad.bin"), &c), ExitedWithCode(1), "inconsistent checkpoint header") << field << " " << value;
        }
    }
    std::vector<char> large = model;
    ((int32_t*)large.data())[4] = 1 << 20;  // L: in range, the count computed exactly, the file far too small
    write_bytes(path("large.bin"), large.data(), large.size());
    EXPECT_EXIT(load_checkpoint(path("large.bin"), &c), ExitedWithCode(1), "large.bin: checkpoint is [0-9]+ bytes, expected [0-9]+ for this header \\([0-9]+ parameters of 4 bytes\\)");
    // every field in range, yet the parameters' bytes (count times 4) wrap around 64 bits: a size
    // check made in wrapped arithmetic could match a small file and allocate the count
    std::vector<char> wraps = model;
    const int32_t fields[] = {kCheckpointFp32, 1, 11605, 349641, 1, 1048402, 11605};  // version, maxT, V, L, NH, C, Vp
    memcpy(wraps.data() + 4, fields, sizeof(fields));
    GPT2Config huge;
    config_from_descriptor("L=349641,NH=1,C=1048402,V=11605,maxT=1", &huge);
    huge.padded_vocab_size = 11605;  // as the header says (a descriptor pads V to 128)
    ASSERT_GT(ParamLayout(huge).total, SIZE_MAX / 4) << "the header's parameters must overflow 64 bits as bytes";
    write_bytes(path("wraps.bin"), wraps.data(), wraps.size());
    EXPECT_EXIT(load_checkpoint(path("wraps.bin"), &c), ExitedWithCode(1),
                "wraps.bin: checkpoint is [0-9]+ bytes, expected [0-9]+ for this header \\([0-9]+ parameters of 4 bytes\\)");
}

TEST_F(Files, BadShardsFailWithOneLine) {
    write_shard(path("good.bin"), random_tokens(100, 50, 1));
    std::vector<char> good = read_bytes(path("good.bin"));
    EXPECT_EQ(validate_shard(path("good.bin")), 100u);
    write_bytes(path("cut.bin"), good.data(), good.size() - 2);
    EXPECT_EXIT(validate_shard(path("cut.bin")), ExitedWithCode(1), "header announces 100 tokens");
    write_bytes(path("short.bin"), good.data(), 10);
    EXPECT_EXIT(validate_shard(path("short.bin")), ExitedWithCode(1), "truncated while reading the shard header");
    std::vector<char> bad = good;
    ((int32_t*)bad.data())[0] = 7;
    write_bytes(path("magic.bin"), bad.data(), bad.size());
    EXPECT_EXIT(validate_shard(path("magic.bin")), ExitedWithCode(1), "bad magic 7 in token shard \\(expected 20240520\\)");
    bad = good;
    ((int32_t*)bad.data())[1] = 2;
    write_bytes(path("version.bin"), bad.data(), bad.size());
    EXPECT_EXIT(validate_shard(path("version.bin")), ExitedWithCode(1), "unsupported token shard version 2 \\(expected 1\\)");
    EXPECT_EXIT(DataLoader(path("nothing*.bin"), 2, 4, 0, 1, 50), ExitedWithCode(1), "no token shard matches");
    EXPECT_EXIT(DataLoader(path("good.bin"), 10, 10, 0, 1, 50), ExitedWithCode(1), "100 tokens, too few for one window of B\\*T\\+1 = 101");
    // a token the model has no embedding for stops the run before it is used
    std::vector<uint16_t> tokens(100, 3);
    tokens[40] = 50;
    write_shard(path("big.bin"), tokens);
    DataLoader loader(path("big.bin"), 2, 10, 0, 1, 50);
    std::vector<int> x(20), y(20);
    loader.next_batch(x.data(), y.data());
    EXPECT_EXIT(loader.next_batch(x.data(), y.data()), ExitedWithCode(1), "token 50 at position 40 is outside the model's vocabulary of 50");
}

// rank r of R reads window k*R + r at its k-th call: R ranks together read what one rank reads
TEST_F(Files, RanksReadInterleavedWindows) {
    std::vector<uint16_t> tokens(1000);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint16_t)i;
    write_shard(path("a.bin"), tokens);
    const int B = 2, T = 5, R = 3, W = B * T;
    std::vector<int> x(W), y(W);
    for (int r = 0; r < R; r++) {
        DataLoader loader(path("a.bin"), B, T, r, R, 1000);
        for (int k = 0; k < 4; k++) {
            loader.next_batch(x.data(), y.data());
            for (int i = 0; i < W; i++) {
                ASSERT_EQ(x[i], (k * R + r) * W + i);
                ASSERT_EQ(y[i], (k * R + r) * W + i + 1);
            }
        }
    }
    // after the last full window of the last shard it starts over
    DataLoader one(path("a.bin"), B, T, 0, 1, 1000);
    for (int k = 0; k < 999 / W; k++) one.next_batch(x.data(), y.data());
    one.next_batch(x.data(), y.data());
    EXPECT_EQ(x[0], 0);
}

// across shard boundaries and epochs too: shards of 5 and 3 windows, 3 ranks, 10 rounds
TEST_F(Files, RanksTogetherReadWhatOneRankReads) {
    std::vector<uint16_t> a(5 * 8 + 3), b(3 * 8 + 1);
    for (size_t i = 0; i < a.size(); i++) a[i] = (uint16_t)i;
    for (size_t i = 0; i < b.size(); i++) b[i] = (uint16_t)(1000 + i);
    write_shard(path("d_0.bin"), a);
    write_shard(path("d_1.bin"), b);
    const int R = 3, W = 8;
    DataLoader one(path("d_*.bin"), 2, 4, 0, 1, 2000);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < R; r++) ranks.push_back(std::make_unique<DataLoader>(path("d_*.bin"), 2, 4, r, R, 2000));
    std::vector<int> x(W), y(W), xr(W), yr(W);
    for (int k = 0; k < 10; k++)
        for (int r = 0; r < R; r++) {
            one.next_batch(x.data(), y.data());
            ranks[r]->next_batch(xr.data(), yr.data());
            ASSERT_EQ(x, xr) << "round " << k << " rank " << r;
            ASSERT_EQ(y, yr);
        }
}

TEST_F(Files, ShardsAreReadInSortedOrder) {
    write_shard(path("s_001.bin"), std::vector<uint16_t>(50, 2));
    write_shard(path("s_000.bin"), std::vector<uint16_t>(50, 1));
    DataLoader loader(path("s_*.bin"), 2, 10, 0, 1, 50);
    std::vector<int> x(20), y(20);
    loader.next_batch(x.data(), y.data());
    EXPECT_EQ(x[0], 1);
    loader.next_batch(x.data(), y.data());
    EXPECT_EQ(x[0], 1);
    loader.next_batch(x.data(), y.data());  // 10 tokens left in s_000, a window needs 21
    EXPECT_EQ(x[0], 2);
    EXPECT_EQ(loader.total_tokens(), 100u);
}

// Shards of 5, 3 and 4 windows of 8 tokens; token values say where they come from (shard*1000 +
// position), so a window is known by its first token.
class Shuffled : public Files {
protected:
    void SetUp() override {
        Files::SetUp();
        const int windows[] = {5, 3, 4};
        for (int s = 0; s < 3; s++) {
            std::vector<uint16_t> t(windows[s] * W + 1 + s);  // a few tokens spare, never read
            for (size_t i = 0; i < t.size(); i++) t[i] = (uint16_t)(s * 1000 + i);
            write_shard(path(("d_" + std::to_string(s) + ".bin").c_str()), t);
            for (int k = 0; k < windows[s]; k++) all_windows.push_back(s * 1000 + k * W);
        }
    }
    std::unique_ptr<DataLoader> loader(int rank, int world, uint64_t seed = 5) {
        auto l = std::make_unique<DataLoader>(path("d_*.bin"), 2, 4, rank, world, 4000);
        l->shuffle(seed);
        return l;
    }
    // first tokens of the next n windows; every window checked to be whole and in one piece
    std::vector<int> read(DataLoader& l, int n) {
        std::vector<int> starts, x(W), y(W);
        for (int k = 0; k < n; k++) {
            l.next_batch(x.data(), y.data());
            for (int i = 0; i < W; i++) {
                EXPECT_EQ(x[i], x[0] + i);
                EXPECT_EQ(y[i], x[0] + i + 1);
            }
            starts.push_back(x[0]);
        }
        return starts;
    }
    static constexpr int W = 8, kWindows = 12;
    std::vector<int> all_windows;  // in file order
};

// an epoch reads every window once, shard by shard, neither shards nor windows in file order;
// the next epoch reads them in another order
TEST_F(Shuffled, EachEpochIsAPermutationOfShardsAndWindows) {
    auto l = loader(0, 1);
    std::vector<int> e1 = read(*l, kWindows), e2 = read(*l, kWindows);
    for (const auto* e : {&e1, &e2}) {
        std::vector<int> sorted = *e;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sorted, all_windows) << "an epoch must read each window exactly once";
        int shard_changes = 0;
        for (int k = 1; k < kWindows; k++) shard_changes += (*e)[k] / 1000 != (*e)[k - 1] / 1000;
        EXPECT_EQ(shard_changes, 2) << "a shard's windows are read together";
    }
    EXPECT_NE(e1, all_windows) << "not in file order";
    EXPECT_NE(e1, e2) << "each epoch has its own order";
    EXPECT_NE(read(*loader(0, 1, 6), kWindows), e1) << "another seed, another order";
    DataLoader in_order(path("d_*.bin"), 2, 4, 0, 1, 4000);
    EXPECT_EQ(read(in_order, kWindows), all_windows) << "without shuffle(), file order";
}

// Each epoch's shard order is a permutation drawn from (seed, epoch): every one of the 3! orders
// comes up in 60 epochs, and each epoch reads exactly what the rule in data/dataloader.h's
// header gives, derived here again.
TEST_F(Shuffled, ShardOrderIsDrawnFromSeedAndEpoch) {
    const uint64_t seed = 5;
    auto l = loader(0, 1, seed);
    std::set<std::vector<int>> shard_orders;
    int not_as_the_rule = 0, first_not = -1;
    for (int e = 0; e < 60; e++) {
        std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (e + 1)));
        auto fisher_yates = [&](std::vector<int>& v) {
            for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[rng() % i]);
        };
        std::vector<int> shards = {0, 1, 2}, want;
        fisher_yates(shards);
        for (int s : shards) {
            std::vector<int> starts;
            for (int start : all_windows)
                if (start / 1000 == s) starts.push_back(start);
            fisher_yates(starts);
            want.insert(want.end(), starts.begin(), starts.end());
        }
        const std::vector<int> got = read(*l, kWindows);
        if (got != want && not_as_the_rule++ == 0) first_not = e;
        std::vector<int> order = {got[0] / 1000};
        for (int start : got)
            if (start / 1000 != order.back()) order.push_back(start / 1000);
        shard_orders.insert(order);
    }
    EXPECT_EQ(not_as_the_rule, 0) << "epochs not in the rule's order, the first: " << first_not;
    EXPECT_EQ(shard_orders.size(), 6u) << "every order of the 3 shards, in 60 epochs";
}

// R ranks read, round by round, what one rank reads: the same order at every rank count, across
// shard boundaries and epochs (5 ranks do not divide the 12 windows: epochs end mid-round)
TEST_F(Shuffled, RanksTogetherReadWhatOneRankReads) {
    for (int R = 2; R <= 5; R++) {
        auto one = loader(0, 1);
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < R; r++) ranks.push_back(loader(r, R));
        for (int k = 0; k < 3 * kWindows / R; k++)
            for (int r = 0; r < R; r++) ASSERT_EQ(read(*one, 1), read(*ranks[r], 1)) << R << " ranks, round " << k << " rank " << r;
    }
}

// The state carries position, seed and the current epoch's order: a loader restored from it,
// even with another seed and another number of ranks, continues the same stream.
TEST_F(Shuffled, StateContinuesTheStreamAtAnotherRankCount) {
    auto first = loader(0, 1), reference = loader(0, 1);
    read(*first, 18);  // into the second epoch
    const LoaderState state = first->state();
    EXPECT_EQ(state.position, 18u);
    EXPECT_EQ(state.order.size(), (size_t)kWindows);
    read(*reference, 18);
    const std::vector<int> expect = read(*reference, 12);  // on into the third epoch
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < 2; r++) {
        ranks.push_back(loader(r, 2, 99));
        ranks[r]->restore(state);
    }
    std::vector<int> got;
    for (int k = 0; k < 6; k++)
        for (int r = 0; r < 2; r++) got.push_back(read(*ranks[r], 1)[0]);
    EXPECT_EQ(got, expect);
    // the stored order is what counts for the current epoch, not one derived again
    LoaderState edited = state;
    std::swap(edited.order[6], edited.order[7]);  // positions 18 and 19 of the stream
    auto one = loader(0, 1);
    one->restore(edited);
    EXPECT_EQ(read(*one, 2), std::vector<int>({expect[1], expect[0]}));

    DataLoader other_window(path("d_*.bin"), 2, 3, 0, 1, 4000);
    other_window.shuffle(5);
    EXPECT_EXIT(other_window.restore(state), ExitedWithCode(1), "keep B\\*T and the data");
    DataLoader unshuffled(path("d_*.bin"), 2, 4, 0, 1, 4000);
    EXPECT_EXIT(unshuffled.restore(state), ExitedWithCode(1), "written with shuffling on, this run has it off");
    EXPECT_EXIT(loader(0, 4)->restore(state), ExitedWithCode(1), "position of 18 windows does not divide among 4 ranks");
}

TEST_F(Files, Tokenizer) {
    const char* real = "data/tinyshakespeare/gpt2_tokenizer.bin";
    Tokenizer tok(real);
    EXPECT_EQ(tok.vocab_size(), 50257);
    EXPECT_EQ(tok.eot(), 50256);
    // GPT-2's ids: "Hello" 15496, " world" 995, "\n" 198
    EXPECT_EQ(tok.decode(15496), "Hello");
    EXPECT_EQ(tok.decode(995), " world");
    EXPECT_EQ(tok.decode(198), "\n");
    std::vector<char> raw = read_bytes(real);
    write_bytes(path("cut.bin"), raw.data(), raw.size() / 2);
    EXPECT_EXIT(Tokenizer(path("cut.bin")), ExitedWithCode(1), "truncated while reading");
    ((uint32_t*)raw.data())[0] = 1;
    write_bytes(path("magic.bin"), raw.data(), raw.size());
    EXPECT_EXIT(Tokenizer(path("magic.bin")), ExitedWithCode(1), "bad magic 1 in tokenizer \\(expected 20240328\\)");
    ((uint32_t*)raw.data())[0] = 20240328;
    ((uint32_t*)raw.data())[3] = 60000;
    write_bytes(path("eot.bin"), raw.data(), raw.size());
    EXPECT_EXIT(Tokenizer(path("eot.bin")), ExitedWithCode(1), "end-of-text token 60000 is outside the vocabulary of 50257");
    ((uint32_t*)raw.data())[3] = 50256;
    ((uint32_t*)raw.data())[1] = 1;
    write_bytes(path("version.bin"), raw.data(), raw.size());
    EXPECT_EXIT(Tokenizer(path("version.bin")), ExitedWithCode(1), "unsupported tokenizer version 1 \\(expected 2\\)");
}


// --gemm-algos tables (kernels/gemm_choices.h): what bench_gemm writes reads back the same, every
// field of a shape keys it (two shapes that differ in one field are two entries), algorithms are
// read back in one spelling, and each bad line is refused with its number and what was expected.
TEST_F(Files, GemmAlgorithmTableRoundTripAndBadLines) {
    GemmChoices t{"NVIDIA H200", 132, 130100, 33554432, "bf16", {}};
    t.algorithm[gemm_shape_text(2304, 65536, 768, 768, 768, 2304, true, false, "BIAS", 16)] = "66:18:1093:1:0:0:0:0:0";
    t.algorithm[gemm_shape_text(2304, 65536, 768, 768, 768, 2304, true, false, "none", 16)] = "66:18:1093:1:0:0:0:0:2";
    t.algorithm[gemm_shape_text(768, 3072, 65536, 768, 3072, 768, false, true, "BGRADB", 16)] = "31:20:1024:4:2:1:0:3:0";
    t.algorithm[gemm_shape_text(3072, 65536, 768, 3072, 768, 3072, false, false, "DGELU_BGRAD", 2)] = "4294967295:0:0:0:0:0:0:0:0";
    const std::string text = format_gemm_choices(t);
    std::string error;
    const GemmChoices back = parse_gemm_choices(text, &error);
    EXPECT_EQ(error, "");
    EXPECT_EQ(std::make_tuple(back.gpu, back.sms, back.cublaslt_version, back.workspace, back.precision),
              std::make_tuple(std::string("NVIDIA H200"), 132L, 130100L, 33554432L, std::string("bf16")));
    EXPECT_EQ(back.algorithm, t.algorithm);
    EXPECT_EQ(back.algorithm.size(), 4u);
    EXPECT_NE(text.find("gemm 2304 65536 768 768 768 2304 1 0 BIAS 16 66:18:1093:1:0:0:0:0:0\n"), std::string::npos) << text;
    // one spelling of an algorithm, whatever the file's
    const std::string head = "gpu NVIDIA H200\nsms 132\ncublaslt 130100\nworkspace 33554432\nprecision bf16\n";
    EXPECT_EQ(parse_gemm_choices(head + "gemm 1 2 3 4 5 6 0 1 BIAS 16 066:+18:1:1:0:0:0:0:0\n", &error).algorithm.begin()->second,
              "66:18:1:1:0:0:0:0:0");

    const std::vector<std::pair<std::string, std::string>> bad = {
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 16\n", "line 6: expected 11 fields after gemm"},
        {head + "gemm 1 2 3 4 5 0 0 1 BIAS 16 1:1:1:1:0:0:0:0:0\n", "line 6: expected a positive size, not '0'"},
        {head + "gemm 1 2 3 4 5 2147483648 0 1 BIAS 16 1:1:1:1:0:0:0:0:0\n", "line 6: expected a positive size, not '2147483648'"},
        {head + "gemm 1 2 3 4 5 6 2 1 BIAS 16 1:1:1:1:0:0:0:0:0\n", "line 6: expected transa and transb 0 or 1, not '2'"},
        {head + "gemm 1 2 3 4 5 6 0 1 RELU 16 1:1:1:1:0:0:0:0:0\n", "line 6: unknown epilogue 'RELU'"},
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 32 1:1:1:1:0:0:0:0:0\n", "line 6: expected an alignment of 1 to 16 bytes, not '32'"},
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 16 1:1:1:1:0:0:0:0\n", "line 6: expected the algorithm as 9 numbers joined by ':'"},
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 16 1:1:1:1:0:0:0:0:0:0\n", "line 6: expected the algorithm as 9 numbers"},
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 16 1:1:1:1:0:0:0:0:0:\n", "line 6: expected the algorithm as 9 numbers"},
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 16 1:1:1:-1:0:0:0:0:0\n", "line 6: expected the algorithm as 9 numbers"},
        {head + "gemm 1 2 3 4 5 6 0 1 BIAS 16 5\n", "line 6: expected the algorithm as 9 numbers"},
        {head + "# two of one shape\ngemm 1 2 3 4 5 6 0 1 BIAS 16 1:1:1:1:0:0:0:0:0\ngemm 1 2 3 4 5 6 0 1 BIAS 16 2:1:1:1:0:0:0:0:0\n",
         "line 8: shape '1 2 3 4 5 6 0 1 BIAS 16' given twice"},
        {head + "precision fp32\n", "line 6: precision given twice (first at line 5)"},
        {"precision fp16\n", "line 1: expected precision bf16 or fp32, not 'fp16'"},
        {"gpu NVIDIA H200\ncublaslt 13.1\n", "line 2: expected cuBLASLt's version number, not '13.1'"},
        {"sms 0\n", "line 1: expected the GPU's multiprocessor count, not '0'"},
        {"workspace lots\n", "line 1: expected the workspace's bytes, not 'lots'"},
        {head + "algo 1\n", "line 6: expected gpu, sms, cublaslt, workspace, precision or gemm, not 'algo'"},
        {"gpu NVIDIA H200\nsms 132\ncublaslt 130100\nprecision bf16\n", "line 0: expected gpu, sms, cublaslt, workspace and precision lines"},
    };
    for (const auto& [table, want] : bad) {
        const GemmChoices none = parse_gemm_choices(table, &error);
        EXPECT_EQ(error.substr(0, want.size()), want) << table;
        EXPECT_TRUE(none.algorithm.empty() && none.gpu.empty()) << table;
    }
    write_bytes(path("bad.txt"), bad[4].first.data(), bad[4].first.size());
    EXPECT_EXIT(read_gemm_choices(path("bad.txt")), ExitedWithCode(2), "--gemm-algos .*bad.txt: line 6: unknown epilogue 'RELU'");
    EXPECT_EXIT(read_gemm_choices(path("none.txt")), ExitedWithCode(2),
                "--gemm-algos .*none.txt: cannot open: No such file or directory \\(scripts/bench_gemm --write makes one\\)");
    write_bytes(path("good.txt"), text.data(), text.size());
    EXPECT_EQ(read_gemm_choices(path("good.txt")).algorithm, t.algorithm);
}
}  // namespace
