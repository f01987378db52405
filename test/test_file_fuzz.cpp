// A mutation fuzzer over every file train_gpt reads: the model file (-e, and model_N.bin on
// -y 1), the state file and main.log of a resumed run, the token shards (-i, -j), the tokenizer
// and the HellaSwag file. Each mutant goes to a real training run, train() in a forked child
// whose address space is capped (so an allocation that no file of this size could justify fails
// rather than succeeding on overcommit), and the run must end with exit 0, or with exit 1, 2 or 3
// and exactly one line on stderr beginning "error: ": never a signal (an uncaught std::bad_alloc,
// a segfault), a hang or a second line. The mutants: every header int from the magic to two past
// the last non-zero one (so a field added later is covered too) set to edge values, body bytes
// flipped and words overwritten, the file cut short and extended. A fixed seed: the same inputs
// every time (but for main.log, whose timings vary), about 9,200 runs, 20 to 40 s here (on the
// code before these checks 21 of them ended in std::bad_alloc or std::length_error, from the
// tokenizer's and the state file's counts).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <climits>
#include <map>

#include "test_util.h"

namespace {

constexpr int kV = 64, kB = 4;  // tiny_config's vocabulary; T is its 16
constexpr const char* kModel = "L=1,NH=1,C=8,V=64,maxT=16";

struct Mutant {
    std::string name;
    std::vector<char> bytes;
};

void put_int(std::vector<char>& b, size_t at, int32_t v) { memcpy(b.data() + at, &v, 4); }
int32_t get_int(const std::vector<char>& b, size_t at) {
    int32_t v;
    memcpy(&v, b.data() + at, 4);
    return v;
}

// edge values for a header int, besides its own value minus one, plus one and doubled
const int64_t kEdgeInts[] = {0, 1, -1, 2, 3, 255, 65535, 65536, 1 << 20, (1 << 20) + 1, 1 << 30, INT_MAX, INT_MIN};
// and for two ints read as one uint64 (the state file's counts)
const uint64_t kEdgeWords[] = {1ull << 32, (1ull << 32) + 1, 1ull << 62, 1ull << 63, ~0ull};

// Mutants of a file. binary: it begins with llm.c's 256-int header, whose ints from 0 to two past
// the last non-zero one each take every edge value, also two at a time, and each pair of them the
// 64-bit edge values; then, for any file, bytes flipped, 4-byte words overwritten with NaN,
// infinities and edge ints, and cuts and extensions.
std::vector<Mutant> mutants(const std::vector<char>& good, bool binary, uint32_t seed) {
    std::vector<Mutant> out;
    std::mt19937 rng(seed);
    int fields = 0;  // header ints mutated: 0 to two past the last non-zero one
    for (int i = 0; i < kHeaderInts && binary; i++)
        if (get_int(good, 4 * i) != 0) fields = std::min(i + 3, kHeaderInts);
    auto edge_values = [&](int i) {
        const int64_t was = get_int(good, 4 * i);
        std::vector<int32_t> v;
        for (int64_t x : kEdgeInts) v.push_back((int32_t)x);
        for (int64_t x : {was - 1, was + 1, 2 * was})
            if (x >= INT_MIN && x <= INT_MAX) v.push_back((int32_t)x);
        v.erase(std::remove(v.begin(), v.end(), (int32_t)was), v.end());
        return v;
    };
    for (int i = 0; i < fields; i++)
        for (int32_t v : edge_values(i)) {
            Mutant m{"header int " + std::to_string(i) + " = " + std::to_string(v), good};
            put_int(m.bytes, 4 * i, v);
            out.push_back(m);
        }
    for (int k = 0; k < 40 * fields; k++) {  // two ints at once
        const int i = rng() % fields, j = rng() % fields;
        const std::vector<int32_t> vi = edge_values(i), vj = edge_values(j);
        const int32_t a = vi[rng() % vi.size()], b = vj[rng() % vj.size()];
        Mutant m{"header ints " + std::to_string(i) + ", " + std::to_string(j) + " = " + std::to_string(a) + ", " + std::to_string(b), good};
        put_int(m.bytes, 4 * i, a);
        put_int(m.bytes, 4 * j, b);
        out.push_back(m);
    }
    for (int i = 0; i + 1 < fields; i++)
        for (uint64_t w : kEdgeWords) {
            Mutant m{"header ints " + std::to_string(i) + ".." + std::to_string(i + 1) + " = uint64 " + std::to_string(w), good};
            memcpy(m.bytes.data() + 4 * i, &w, 8);
            out.push_back(m);
        }
    const size_t body = binary ? kHeaderBytes : 0, n = good.size();
    for (int k = 0; k < 600 && n > body; k++) {  // 1 to 4 bytes flipped
        Mutant m{"bytes flipped at", good};
        for (int j = 0; j <= k % 4; j++) {
            const size_t at = body + rng() % (n - body);
            m.bytes[at] ^= (char)(1 + rng() % 255);
            m.name += " " + std::to_string(at);
        }
        out.push_back(m);
    }
    const uint32_t words[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xffffffffu, 0x80000000u, 0x7fffffffu, 0x0000ffffu};
    for (int k = 0; k < 20 && n >= body + 4; k++)
        for (uint32_t w : words) {  // a 4-byte word overwritten: NaN, infinities, the largest float, edge ints
            const size_t at = body + 4 * (rng() % ((n - body) / 4));
            Mutant m{"word at " + std::to_string(at) + " = " + std::to_string(w), good};
            memcpy(m.bytes.data() + at, &w, 4);
            out.push_back(m);
        }
    for (size_t cut : {(size_t)0, (size_t)4, kHeaderBytes - 1, kHeaderBytes, kHeaderBytes + 1, n / 3, n / 2, n - 4, n - 2, n - 1})
        if (cut < n) out.push_back({"cut to " + std::to_string(cut) + " bytes", std::vector<char>(good.begin(), good.begin() + cut)});
    for (size_t extra : {1, 2, 4, 1024}) {
        Mutant m{"extended by " + std::to_string(extra) + " bytes", good};
        m.bytes.resize(n + extra, 0x11);
        out.push_back(m);
    }
    return out;
}

// llm.c's tokenizer of kV tokens "t0".."t62" and "<|endoftext|>" (its last, the end-of-text one)
std::vector<char> tokenizer_file() {
    int32_t h[kHeaderInts] = {20240328, 2, kV, kV - 1};
    std::vector<char> b((char*)h, (char*)h + sizeof(h));
    for (int t = 0; t < kV; t++) {
        const std::string s = t == kV - 1 ? "<|endoftext|>" : "t" + std::to_string(t);
        b.push_back((char)s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
    return b;
}

// llm.c's HellaSwag layout (data/hellaswag.h) with three examples of short contexts and endings
std::vector<char> hellaswag_file() {
    std::vector<uint16_t> stream;
    int longest = 0;
    for (int i = 0; i < 3; i++) {
        std::vector<uint16_t> s = {65535, 0, (uint16_t)i, (uint16_t)(i % 4), 4, 3, (uint16_t)(1 + i), 2, 3};
        for (int c = 0; c < 4; c++) {
            s.push_back((uint16_t)(1 + c % 2));
            for (int t = 0; t <= c % 2; t++) s.push_back((uint16_t)(10 + c + t));
        }
        s[1] = (uint16_t)(2 * s.size());
        longest = std::max(longest, (int)s[1]);
        stream.insert(stream.end(), s.begin(), s.end());
    }
    int32_t h[kHeaderInts] = {20240522, 1, 3, longest};
    std::vector<char> b((char*)h, (char*)h + sizeof(h));
    b.insert(b.end(), (char*)stream.data(), (char*)(stream.data() + stream.size()));
    return b;
}

class FileFuzz : public ::testing::Test {
protected:
    void SetUp() override {
        // in memory where there is a tmpfs: the resumed runs' checkpoints are synced to the disk
        char in_memory[] = "/dev/shm/train_gpt_fuzz_XXXXXX";
        dir_ = mkdtemp(in_memory) ? in_memory : temp_dir();
        write_shard(dir_ + "/train.bin", random_tokens(3000, kV, 1));
        write_shard(dir_ + "/val.bin", random_tokens(600, kV, 2));
        const std::vector<char> tok = tokenizer_file(), hs = hellaswag_file();
        write_bytes(dir_ + "/tok.bin", tok.data(), tok.size());
        write_bytes(dir_ + "/hellaswag.bin", hs.data(), hs.size());
        GPT2Config c;
        config_from_descriptor(kModel, &c);
        write_checkpoint(dir_ + "/model.bin", c, random_init(c, 1), kCheckpointFp32);
    }
    void TearDown() override { [[maybe_unused]] int rc = system(("rm -rf " + dir_).c_str()); }

    // one update from model.bin with every other file: validation, HellaSwag and a text sample
    TrainConfig fresh_run() const {
        TrainConfig cfg = tiny_config(dir_ + "/train.bin", 1);
        cfg.init = dir_ + "/model.bin";
        cfg.val_data = dir_ + "/val.bin";
        cfg.tokenizer = dir_ + "/tok.bin";
        cfg.hellaswag = 1;
        cfg.hellaswag_file = dir_ + "/hellaswag.bin";
        cfg.B = kB;  // HellaSwag's 4 rows
        cfg.max_steps = 1;
        cfg.val_every = cfg.val_steps = cfg.sample_every = 1;
        cfg.gen_len = 4;
        return cfg;
    }

    // Runs train(cfg) in a child with its memory capped and a time limit; "" when it ended as a
    // run must (exit 0, or 1, 2, 3 with one line "error: ..."), else what happened.
    std::string run_child(const TrainConfig& cfg) const {
        const std::string err = dir_ + "/stderr";
        const pid_t pid = fork();
        if (pid == 0) {
            const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_WRONLY);
            dup2(null, 1), dup2(e, 2);
            const rlimit memory{2ull << 30, 2ull << 30};
            setrlimit(RLIMIT_AS, &memory);
            alarm(30);
            SingleComm comm(CpuBackend::copy);
            // noexcept: an exception ends the child as it ends train_gpt (std::terminate), not in GoogleTest's catch
            auto train_run = [&]() noexcept { return exit_status(train<CpuBackend>(cfg, comm)); };
            const int code = train_run();
            fflush(stdout);
            _exit(code);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        std::vector<char> text = read_bytes(err);
        const std::string said(text.begin(), text.end());
        if (WIFSIGNALED(status))
            return WTERMSIG(status) == SIGALRM ? "hung (30 s): " + said : "signal " + std::to_string(WTERMSIG(status)) + ": " + said;
        const int code = WEXITSTATUS(status);
        if (code == 0) return "";
        const bool one_line = std::count(said.begin(), said.end(), '\n') == 1 && said.rfind("error: ", 0) == 0;
        if ((code == 1 || code == 2 || code == kExitNonFinite) && one_line) return "";
        return "exit " + std::to_string(code) + (one_line ? "" : " without exactly one error line") + ": " + said.substr(0, 600);
    }

    // every mutant of `file` through cfg (reset() first before each), then the file as it was;
    // failures are collected
    int fuzz(const TrainConfig& cfg, const std::string& file, bool binary, bool header_too, uint32_t seed,
             const std::function<void()>& reset = [] {}) {
        const std::vector<char> good = read_bytes(file);
        int runs = 0;
        for (const Mutant& m : mutants(good, binary, seed)) {
            if (!header_too && m.name.rfind("header", 0) == 0) continue;
            reset();
            write_bytes(file, m.bytes.data(), m.bytes.size());
            const std::string what = run_child(cfg);
            if (!what.empty()) failures_.push_back(file.substr(dir_.size() + 1) + ", " + m.name + ": " + what);
            runs++;
        }
        write_bytes(file, good.data(), good.size());
        return runs;
    }

    std::string dir_;
    std::vector<std::string> failures_;
};

TEST_F(FileFuzz, EveryFileTrainGptReads) {
    const auto start = std::chrono::steady_clock::now();
    const TrainConfig fresh = fresh_run();
    ASSERT_EQ(run_child(fresh), "") << "the unmutated run must succeed";

    // a checkpoint at step 2 to resume from (written in a child: the parent stays without OpenMP threads, which fork does not copy)
    TrainConfig first = fresh;
    first.output_dir = dir_ + "/run";
    first.max_steps = 2;
    ASSERT_EQ(run_child(first), "");
    TrainConfig resumed = first;
    resumed.resume = 1;
    resumed.max_steps = 3;
    const std::string run = first.output_dir;
    // each resumed run writes step 3 and rewrites main.log: both go before the next
    const std::vector<char> log = read_bytes(run + "/main.log");
    auto back_to_step_2 = [&] {
        for (const char* kind : {"model", "state", "DONE"}) remove(checkpoint_path(run, kind, 3).c_str());
        write_bytes(run + "/main.log", log.data(), log.size());
    };
    ASSERT_EQ(run_child(resumed), "") << "the unmutated resumed run must succeed";

    std::map<std::string, int> runs;
    runs["model (-e)"] = fuzz(fresh, dir_ + "/model.bin", true, true, 1);
    runs["train shard (-i)"] = fuzz(fresh, dir_ + "/train.bin", true, true, 2);
    runs["val shard (-j)"] = fuzz(fresh, dir_ + "/val.bin", true, true, 3);
    runs["tokenizer"] = fuzz(fresh, dir_ + "/tok.bin", true, true, 4);
    runs["HellaSwag"] = fuzz(fresh, dir_ + "/hellaswag.bin", true, true, 5);
    runs["state (-y 1)"] = fuzz(resumed, checkpoint_path(run, "state", 2), true, true, 6, back_to_step_2);
    runs["model (-y 1)"] = fuzz(resumed, checkpoint_path(run, "model", 2), true, false, 7, back_to_step_2);
    runs["main.log (-y 1)"] = fuzz(resumed, run + "/main.log", false, false, 8, back_to_step_2);
    int total = 0;
    for (const auto& [file, n] : runs) printf("%-18s %4d mutants\n", file.c_str(), n), total += n;
    printf("%d runs in %.0f s\n", total, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::string report;
    for (size_t i = 0; i < failures_.size() && i < 30; i++) report += failures_[i] + "\n";
    EXPECT_TRUE(failures_.empty()) << failures_.size() << " of " << total << " mutants did not end with exit 0 or one error line:\n" << report;
}

}  // namespace
