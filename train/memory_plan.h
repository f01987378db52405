// The memory plan: the bytes each rank of a run will hold, by category, known before anything is
// allocated. It is not a second formula: plan_memory() below constructs the run's own
// allocating objects (zero/'s Zero, the model, the loss sums), with the very calls the run makes,
// on CountingBackend, which hands out no memory and only counts it; the backend says what it will
// reserve for the shapes its ops see (kernels/backend_memory.h). From the plan: whether a run fits
// its device memory, the largest micro-batch that does (-b auto), the least change that makes a
// run fit, and what --plan prints.
//
// On a GPU some memory is not this trainer's to count: the CUDA context, the kernels it loads on
// first use, cuBLASLt's and NCCL's own buffers, and cudaMalloc's rounding of each allocation.
// A fixed reserve plus 2 MiB an allocation is kept free for them (kCudaReserve).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../common/io.h"
#include "../kernels/backend_memory.h"
#include "../model/gpt2.h"
#include "../model/shape.h"
#include "../zero/comm.h"
#include "../zero/offload.h"  // host_memory_available
#include "../zero/zero.h"
#include "loss_sum.h"
#include "sharded_checkpoint.h"

// what decides a rank's memory
struct RunShape {
    GPT2Config model;
    int B, T, world, stage, recompute;
    bool offload, master_weights;
    int shard_group = 0;  // ranks per shard group (--shard-group); 0: one group of all ranks
    bool quantize_weights = false, quantize_grads = false;  // their buffers (zero/zero.h)
    bool fp8 = false;  // --fp8: the casts' buffers (kernels/fp8_scaling.h)
    bool checkpoint_io = false;     // the run saves checkpoints (-o) or loads one: their staging buffer
    bool async_checkpoint = false;  // --async-checkpoint: the host copy of the rank's part
};

// the bytes one rank holds, by category
struct MemoryUse {
    ZeroMemory zero;                      // parameters, gradients, optimizer, master; host optimizer, staging
    size_t activations = 0, scratch = 0;  // the model's
    size_t fp8 = 0;                       // the model's with --fp8: its casts' copies and scales
    size_t loss_sums = 0;                 // the run's loss accumulators (training, evaluation)
    size_t checkpoint = 0;                // host: checkpoints' staging, an async save's part (train/sharded_checkpoint.h)
    BackendMemory backend;                // the context's buffers, kernel scratch; pinned uploads
    // a plan's only: device bytes allocated but in no category above (the tests see none), and
    // how many device allocations there are
    size_t unnamed = 0, device_allocations = 0;
};

// Each category: its name, bytes, whether in host memory, and when the memory line shows it
enum class Shown { Always, WhenHeld, Never };
struct MemoryCategory {
    const char* name;
    size_t bytes;
    bool host;
    Shown shown;
};
inline std::vector<MemoryCategory> memory_categories(const MemoryUse& m) {
    using S = Shown;
    return {{"parameters", m.zero.params, false, S::Always},
            {"gradients", m.zero.grads, false, S::Always},
            {"optimizer", m.zero.optimizer, false, S::Always},
            {"master weights", m.zero.master, false, S::WhenHeld},
            {"activations", m.activations, false, S::Always},
            {"scratch", m.scratch, false, S::Always},
            {"fp8 copies", m.fp8, false, S::WhenHeld},
            {"comm buffers", m.zero.comm, false, S::Always},
            {"kernel scratch", m.backend.kernel_scratch, false, S::WhenHeld},
            {"cuBLASLt workspace", m.backend.context, false, S::WhenHeld},
            {"loss sums", m.loss_sums, false, S::Never},  // 16 bytes: in the total only
            {"unnamed", m.unnamed, false, S::WhenHeld},
            {"optimizer", m.zero.host_optimizer, true, S::WhenHeld},
            {"staging", m.zero.host_staging, true, S::WhenHeld},
            {"checkpoint", m.checkpoint, true, S::WhenHeld},
            {"pinned uploads", m.backend.pinned_uploads, true, S::WhenHeld}};
}
inline size_t memory_total(const MemoryUse& m, bool host) {
    size_t sum = 0;
    for (const MemoryCategory& c : memory_categories(m)) sum += c.host == host ? c.bytes : 0;
    return sum;
}

// The line each rank prints at start, and --plan for each rank: device categories and their
// total, then, where the rank holds any, host memory after "||"
inline std::string memory_line(int rank, const MemoryUse& m) {
    std::string device, host;
    char item[96];
    for (const MemoryCategory& c : memory_categories(m)) {
        if (c.shown == Shown::Never || (c.shown == Shown::WhenHeld && c.bytes == 0)) continue;
        snprintf(item, sizeof(item), " %s %.2f |", c.name, c.bytes / 1048576.0);
        (c.host ? host : device) += item;
    }
    snprintf(item, sizeof(item), " total %.2f", memory_total(m, false) / 1048576.0);
    std::string line = "rank " + std::to_string(rank) + " memory MiB:" + device + item;
    if (host.empty()) return line;
    snprintf(item, sizeof(item), " total %.2f", memory_total(m, true) / 1048576.0);
    return line + " || host:" + host + item;
}

// A backend that hands out no memory and counts what was asked of it, so that the run's own
// constructors report what they would allocate. Only what those constructors call differs from
// Backend; nothing may read or write what it hands out.
template <class Backend>
struct CountingBackend : Backend {
    static inline size_t device_bytes = 0, device_allocations = 0, host_bytes = 0;
    static void reset_counts() { device_bytes = device_allocations = host_bytes = 0; }
    static void* alloc(size_t bytes) {
        device_bytes += bytes;
        device_allocations++;
        return nowhere();
    }
    static void release(void*) {}
    static void* alloc_pinned(size_t bytes) {
        host_bytes += bytes;
        return nowhere();
    }
    static void release_pinned(void*) {}
    static void from_host(void*, const void*, size_t) {}  // zero/'s optimizer table, at construction

private:
    static void* nowhere() {
        static char byte;
        return &byte;
    }
};

// The communicator a plan constructs zero/ with: it has a rank and a world, and moves nothing
class PlanComm : public Communicator {
public:
    PlanComm(int rank, int world) {
        rank_ = rank;
        world_ = world;
    }
    double all_reduce_host(double) override { refuse(); }
    void barrier(double) override { refuse(); }
    void gather_host(const void*, void*, size_t, int) override { refuse(); }
    [[noreturn]] void abort(int code) override { exit(code); }
    // hybrid sharding's groups: this rank's place among `count` ranks `stride` apart from `first`
    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        return std::make_unique<PlanComm>((rank_ - first) / stride, count);
    }
    NodeRanks node_ranks() override { refuse(); }

protected:
    Ticket start_all_reduce(void*, size_t, DType) override { refuse(); }
    Ticket start_reduce_scatter(const void*, void*, size_t, DType) override { refuse(); }
    Ticket start_all_gather(const void*, void*, size_t, DType) override { refuse(); }
    Ticket start_all_to_all(const void*, void*, size_t, DType) override { refuse(); }
    void do_broadcast_host(void*, size_t, int) override { refuse(); }

private:
    [[noreturn]] static void refuse() { fatal(1, "memory plan: a collective was started while planning"); }
};

// plan(shape, rank): the memory rank `rank` of the run `shape` describes holds (plan_memory()
// below). Rank 0 holds the most: its chunk of every tensor has real elements, so its
// optimizer table has an entry for each (the only thing that differs between ranks).
using Planner = std::function<MemoryUse(const RunShape&, int rank)>;

// ----------------------------------------------------------------------------
// the run's memory, made by the same calls in the run and in its plan

template <class Backend>
std::unique_ptr<Zero<Backend>> make_zero(const RunShape& s, Communicator& comm, const ShardGroups* shard_groups = nullptr) {
    return std::make_unique<Zero<Backend>>(s.stage, param_groups(s.model), comm,
                                           ZeroOptions{s.master_weights, s.offload, s.shard_group, s.quantize_weights, s.quantize_grads, shard_groups});
}
template <class Backend>
std::unique_ptr<GPT2<Backend>> make_model(const RunShape& s, Zero<Backend>& zero) {
    return std::make_unique<GPT2<Backend>>(s.model, s.B, s.T, s.recompute, zero, s.fp8);
}
constexpr int kLossSums = 2;  // a run's: the training loss's and the evaluations'
// what a rank holds, by category, as the objects holding it count it
template <class Backend>
MemoryUse memory_use(const Zero<Backend>& zero, const GPT2<Backend>& model, const BackendMemory& backend, const RunShape& shape) {
    MemoryUse m;
    m.checkpoint = checkpoint_host_bytes(zero, shape.checkpoint_io, shape.async_checkpoint);
    m.zero = zero.memory();
    m.activations = model.activation_bytes();
    m.scratch = model.scratch_bytes();
    m.fp8 = model.fp8_bytes();
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
    MemoryUse m = memory_use(*zero, *model, Backend::planned_memory(GPT2<Backend>::op_shapes(shape.model, shape.B, shape.T)), shape);
    m.unnamed = Counting::device_bytes - (memory_total(m, false) - m.backend.context - m.backend.kernel_scratch);
    m.device_allocations = Counting::device_allocations + m.backend.device_allocations;
    return m;
}

// ----------------------------------------------------------------------------
// what fits

constexpr size_t kGiB = (size_t)1 << 30, kMiB = (size_t)1 << 20;
// kept free on a GPU for what is not this trainer's to count (the CUDA context, the kernels it
// loads on first use, cuBLASLt's and NCCL's own memory): what a small d12 run took on a GPU, with
// room to spare (docs/memory_plan.md has the figures). A run on a GPU prints what it takes
// (train_gpt.cu: "device memory after step 1"), test/test_memory_plan_gpu.sh checks it.
constexpr size_t kCudaReserve = 3 * kGiB / 2;
constexpr size_t kCudaAllocationRounding = 2 * kMiB;  // cudaMalloc's rounding, at most, per allocation

// The memory a rank may use: its device's (the host's on the CPU backend, where the device and
// host categories share it), and what of it is kept free
struct MemoryBudget {
    size_t bytes = 0;
    bool device_is_host = false;
    std::string source;  // where bytes came from, for the messages
};

// bytes that must fit into budget.bytes: the device categories (and the host ones where they
// share a memory), and on a GPU the reserve and the rounding of each allocation
inline size_t bytes_needed(const MemoryUse& m, const MemoryBudget& budget) {
    if (budget.device_is_host) return memory_total(m, false) + memory_total(m, true);
    return memory_total(m, false) + kCudaReserve + m.device_allocations * kCudaAllocationRounding;
}
inline bool fits(const MemoryUse& m, const MemoryBudget& budget) { return bytes_needed(m, budget) <= budget.bytes; }
// what is kept free, in words
inline std::string reserve_words(const MemoryUse& m, const MemoryBudget& budget) {
    if (budget.device_is_host) return "the host categories included";
    char s[160];
    snprintf(s, sizeof(s), "%.2f GiB kept free for the CUDA context and libraries, %zu MiB for %zu allocations' rounding",
             kCudaReserve / (double)kGiB, m.device_allocations * kCudaAllocationRounding / kMiB, m.device_allocations);
    return s;
}

// "79.10 GiB", "3.51 MiB": bytes as a person reads them
inline std::string bytes_words(size_t bytes) {
    char s[32];
    if (bytes >= kGiB) snprintf(s, sizeof(s), "%.2f GiB", bytes / (double)kGiB);
    else snprintf(s, sizeof(s), "%.2f MiB", bytes / (double)kMiB);
    return s;
}
inline double GiB(size_t bytes) { return bytes / (double)kGiB; }

// the most B may be: the flag's limit, and B*T an int, as the model's kernels count rows
inline int max_micro_batch(int T) { return (int)std::min<long>(65536, 2147483647L / T); }

// The largest B that fits (the plan grows with B), 0 when not even B = 1 does
inline int largest_fitting_B(const Planner& plan, RunShape shape, const MemoryBudget& budget) {
    int lo = 0, hi = max_micro_batch(shape.T);  // B = lo fits (0: nothing yet), B = hi + 1 does not
    while (lo < hi) {
        shape.B = lo + (hi - lo + 1) / 2;
        if (fits(plan(shape, 0), budget)) lo = shape.B;
        else hi = shape.B - 1;
    }
    return lo;
}

// -b auto: the largest B that fits and, with -d (total_batch > 0), divides the sequences each
// rank takes per step, so that -d stays as given and accumulation makes up the rest; 0: none
inline int auto_micro_batch(const Planner& plan, const RunShape& shape, const MemoryBudget& budget, long total_batch) {
    const long per_sequence = (long)shape.T * shape.world;
    if (total_batch > 0 && total_batch % per_sequence != 0)
        fatal(2, "-d %ld with -b auto: expected a multiple of T*ranks = %ld", total_batch, per_sequence);
    int B = largest_fitting_B(plan, shape, budget);
    while (total_batch > 0 && B > 0 && (total_batch / per_sequence) % B != 0) B--;
    return B;
}

// "80GiB", "24GB", "512MiB", "1073741824": bytes; false when it is no size
inline bool parse_size(const std::string& text, size_t* bytes) {
    char* end = nullptr;
    const double x = strtod(text.c_str(), &end);
    if (end == text.c_str() || !std::isfinite(x) || x <= 0) return false;
    const std::string unit = end;
    struct Unit { const char* name; double bytes; };
    static const Unit units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                                 {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (const Unit& u : units)
        if (unit == u.name) {
            *bytes = (size_t)llround(x * u.bytes);
            return *bytes > 0;
        }
    return false;
}

// ----------------------------------------------------------------------------
// the least change that fits

// the flags of a shape that a change may touch
inline std::string shape_flags(const RunShape& s) {
    return "-z " + std::to_string(s.stage) + " --offload " + (s.offload ? "cpu" : "none") + " -r " + std::to_string(s.recompute) +
           (s.shard_group > 0 ? " --shard-group " + std::to_string(s.shard_group) : "") + (s.quantize_weights ? " --quantize-weights int8" : "") +
           (s.quantize_grads ? " --quantize-grads int8" : "") + (s.fp8 ? " --fp8 e4m3" : "");
}
// the flags that differ from `from`, e.g. "-r 2 --offload cpu"
inline std::string changed_flags(const RunShape& from, const RunShape& to) {
    std::string s;
    if (to.world != from.world) s += " -pn " + std::to_string(to.world) + " (mpirun -np " + std::to_string(to.world) + ")";
    if (to.stage != from.stage) s += " -z " + std::to_string(to.stage);
    if (to.recompute != from.recompute) s += " -r " + std::to_string(to.recompute);
    if (to.offload != from.offload) s += std::string(" --offload ") + (to.offload ? "cpu" : "none");
    return s.empty() ? "none" : s.substr(1);
}

// The shapes a run may change to without more ranks, cheapest first: as few flags changed as can
// be, and of those recompute before a higher stage before offload (the order of what each costs
// in time). The first is the shape itself.
inline std::vector<RunShape> changes_in_cost_order(const RunShape& s, bool offload_allowed) {
    std::vector<RunShape> out;
    for (int z = s.stage; z <= 3; z++)
        for (int r = s.recompute; r <= 2; r++)
            for (int o = s.offload; o <= (offload_allowed ? 1 : (int)s.offload); o++) {
                RunShape c = s;
                c.stage = z, c.recompute = r, c.offload = o;
                out.push_back(c);
            }
    auto key = [&](const RunShape& c) {
        const int changed = (c.stage != s.stage) + (c.recompute != s.recompute) + (c.offload != s.offload);
        return std::vector<int>{changed, c.offload != s.offload, c.stage, c.recompute};
    };
    std::stable_sort(out.begin(), out.end(), [&](const RunShape& a, const RunShape& b) { return key(a) < key(b); });
    return out;
}

// the fewest ranks, more than shape.world, at which the shape fits (0: none up to 65536); found
// by doubling, then halving the gap. None with shard groups: more ranks add replicas, and a
// group's shards stay as large.
inline int fewest_ranks_that_fit(const Planner& plan, RunShape shape, const MemoryBudget& budget) {
    if (shape.shard_group > 0) return 0;
    const int base = shape.world, limit = 65536;
    int lo = base, hi = 0;  // lo does not fit, hi does
    for (int n = base * 2; n <= limit && hi == 0; n *= 2) {
        shape.world = n;
        if (fits(plan(shape, 0), budget)) hi = n;
        else lo = n;
    }
    while (hi > 0 && hi - lo > 1) {
        shape.world = lo + (hi - lo) / 2;
        if (fits(plan(shape, 0), budget)) hi = shape.world;
        else lo = shape.world;
    }
    return hi;
}

// The cheapest change of `shape` that fits at its B: its flags in cost order, then more ranks
// (the fewest, and of shapes needing as few the cheapest). False when nothing does.
inline bool least_change(const Planner& plan, const RunShape& shape, const MemoryBudget& budget, bool offload_allowed,
                         RunShape* change) {
    const std::vector<RunShape> order = changes_in_cost_order(shape, offload_allowed);
    for (const RunShape& c : order)
        if (fits(plan(c, 0), budget)) return *change = c, true;
    int best = 0;
    for (const RunShape& c : order) {
        const int n = fewest_ranks_that_fit(plan, c, budget);
        if (n > 0 && (best == 0 || n < best)) {
            best = n;
            *change = c;
            change->world = n;
        }
    }
    return best > 0;
}

// What a run that does not fit should do, in one line's words: at B, the largest B that fits as
// given (if any) and the least change that keeps B; with neither, the least change at B = 1.
inline std::string what_fits_instead(const Planner& plan, const RunShape& shape, const MemoryBudget& budget, bool offload_allowed) {
    const int B_max = largest_fitting_B(plan, shape, budget);
    RunShape change;
    std::string s;
    if (B_max > 0) s = "-b " + std::to_string(B_max) + " fits as given (or -b auto)";
    if (least_change(plan, shape, budget, offload_allowed, &change)) {
        const int B_then = largest_fitting_B(plan, change, budget);
        s += (s.empty() ? "the least change that fits: " : "; at B=" + std::to_string(shape.B) + ": ") + changed_flags(shape, change) +
             " (B up to " + std::to_string(B_then) + ")";
    } else if (B_max == 0) {
        RunShape one = shape;
        one.B = 1;
        if (shape.B > 1 && least_change(plan, one, budget, offload_allowed, &change))
            s = "the least change that fits at B=1: " + changed_flags(shape, change);
        else
            s = "nothing fits, not at B=1 with -z 3 -r 2 --offload cpu on 65536 ranks";
    }
    return s;
}

// One line on a rank that does not fit: what it needs and has, and what would fit instead
inline std::string does_not_fit_words(const Planner& plan, const RunShape& shape, int rank, const MemoryBudget& budget,
                                      bool offload_allowed) {
    const MemoryUse mine = plan(shape, rank);
    char s[512];
    snprintf(s, sizeof(s), "B=%d T=%d with %s needs %s on rank %d (%s), which has %s (%s); ", shape.B, shape.T, shape_flags(shape).c_str(),
             bytes_words(bytes_needed(mine, budget)).c_str(), rank, reserve_words(mine, budget).c_str(), bytes_words(budget.bytes).c_str(),
             budget.source.c_str());
    return s + what_fits_instead(plan, shape, budget, offload_allowed);
}

// The host memory of a node's ranks (the host categories: the offloaded optimizer, its staging,
// checkpoints) comes from the node's `available` (0: not known, taken as enough).
// node_bytes: what its `node_ranks` ranks need there together; mine: rank `rank`'s, one of them,
// whose categories the line names. One line saying whether it fits (*fits), if not what to change.
inline std::string host_memory_words(const MemoryUse& mine, int rank, size_t node_bytes, int node_ranks, const RunShape& shape, size_t available,
                                     bool* fits) {
    *fits = available == 0 || node_bytes <= available;
    std::string held;
    for (const MemoryCategory& c : memory_categories(mine))
        if (c.host && c.bytes > 0) held += (held.empty() ? "" : ", ") + std::string(c.name) + " " + bytes_words(c.bytes);
    std::string line = "host memory: " + std::to_string(node_ranks) + " rank(s) on this node need " + bytes_words(node_bytes) +
                       (held.empty() ? "" : " (rank " + std::to_string(rank) + ": " + held + ")") + ", " +
                       (available == 0 ? "available memory not known" : bytes_words(available) + " available on this machine");
    if (*fits) return line + ": fits";
    std::vector<std::string> instead;
    if (node_ranks > 1) instead.push_back("fewer ranks per node");
    if (shape.offload) instead.insert(instead.end(), {"more ranks at -z 1 or above (each holds its shard of the offloaded state)", "--offload none"});
    if (shape.async_checkpoint) instead.push_back("--async-checkpoint 0");
    line += ": does not fit";
    for (size_t i = 0; i < instead.size(); i++) line += (i == 0 ? "; use " : i + 1 == instead.size() ? " or " : ", ") + instead[i];
    return line;
}

// What -b auto chose (shape.B) and why: the memory it needs of the budget, what one more would
// need, and with -d how accumulation keeps it
inline std::string auto_batch_words(const Planner& plan, RunShape shape, const MemoryBudget& budget, long total_batch) {
    const int chosen = shape.B;
    const MemoryUse at = plan(shape, 0);
    std::string s = "-b auto: B=" + std::to_string(chosen) + ": " + bytes_words(bytes_needed(at, budget)) + " of the " +
                    bytes_words(budget.bytes) + " per rank (" + budget.source + "; " + reserve_words(at, budget) + ")";
    const int fitting = largest_fitting_B(plan, shape, budget);
    shape.B = fitting + 1;
    if (fitting < max_micro_batch(shape.T)) s += "; B=" + std::to_string(shape.B) + " would need " + bytes_words(bytes_needed(plan(shape, 0), budget));
    if (total_batch > 0) {
        const long per_sequence = (long)shape.T * shape.world;
        s += "; of the B up to " + std::to_string(fitting) + " that fit, " + std::to_string(chosen) + " is the largest dividing -d's " +
             std::to_string(total_batch / per_sequence) + " sequences per rank: -d " + std::to_string(total_batch) + " kept, " +
             std::to_string(total_batch / (per_sequence * chosen)) + " accumulation step(s)";
    }
    return s;
}

// the smallest value any rank has (a collective)
inline int min_over_ranks(Communicator& comm, int mine) {
    const std::vector<int> all = gather_everywhere(comm, mine);
    return *std::min_element(all.begin(), all.end());
}

// The memory each rank may use: `device_memory` (--device-memory) when given, else what its
// device has free for the run (on the CPU backend the host's available memory), divided among
// the `sharing` ranks that use that device (or host)
template <class Backend>
MemoryBudget memory_budget(const std::string& device_memory, int sharing) {
    MemoryBudget b;
    b.device_is_host = Backend::device_is_host;
    if (!device_memory.empty()) {
        if (!parse_size(device_memory, &b.bytes)) fatal(2, "--device-memory %s: expected a size such as 80GiB", device_memory.c_str());
        b.source = "--device-memory";
        return b;
    }
    size_t total = 0;
    if constexpr (Backend::device_is_host) {
        total = host_memory_available();
        b.source = "available host memory";
        if (total == 0) {  // not known (no /proc/meminfo): nothing is refused
            b.bytes = SIZE_MAX;
            b.source = "host memory, not known";
            return b;
        }
    } else {
        total = Backend::device_memory_free_for_run();
        b.source = "free on the GPU";
    }
    sharing = std::max(1, sharing);
    b.bytes = total / sharing;
    if (sharing > 1) b.source += ", shared by " + std::to_string(sharing) + " ranks";
    return b;
}

// ----------------------------------------------------------------------------
// --plan's report

inline void print_plan(const Planner& plan, const RunShape& shape, int accum, const MemoryBudget& budget, bool offload_allowed,
                       const char* backend, FILE* out) {
    const GPT2Config& c = shape.model;
    const MemoryUse mine = plan(shape, 0);
    fprintf(out, "memory plan: L=%d NH=%d C=%d V=%d (padded %d) maxT=%d, %zu parameters | backend %s, %d rank(s) | %s -w %d | B=%d T=%d, %d accumulation step(s)\n",
            c.num_layers, c.num_heads, c.channels, c.vocab_size, c.padded_vocab_size, c.max_seq_len, ParamLayout(c).total, backend,
            shape.world, shape_flags(shape).c_str(), shape.master_weights ? 1 : 0, shape.B, shape.T, accum);
    fprintf(out, "bytes of rank 0 (the others hold the same, or a few bytes less of the optimizer's table):\n");
    bool host_started = false;
    for (const MemoryCategory& m : memory_categories(mine)) {
        if (m.bytes == 0 && (m.shown != Shown::Always || m.host)) continue;
        if (m.host && !host_started) {
            fprintf(out, "  %-22s %16zu %12.2f MiB\n", "device total", memory_total(mine, false), memory_total(mine, false) / (double)kMiB);
            fprintf(out, "  host:\n");
            host_started = true;
        }
        fprintf(out, "  %-22s %16zu %12.2f MiB\n", m.name, m.bytes, m.bytes / (double)kMiB);
    }
    if (!host_started) fprintf(out, "  %-22s %16zu %12.2f MiB\n", "device total", memory_total(mine, false), memory_total(mine, false) / (double)kMiB);
    fprintf(out, "  %-22s %16zu %12.2f MiB\n", "host total", memory_total(mine, true), memory_total(mine, true) / (double)kMiB);
    if (!budget.device_is_host)
        fprintf(out, "  not counted: the CUDA context, the kernels it loads on first use, cuBLASLt's and NCCL's own memory, cudaMalloc's rounding: %s\n",
                reserve_words(mine, budget).c_str());
    for (int r = 0; r < shape.world; r++) fprintf(out, "%s\n", memory_line(r, plan(shape, r)).c_str());

    const size_t needed = bytes_needed(mine, budget);
    fprintf(out, "memory per rank: %s (%s); this run needs %s (%s): %s\n", bytes_words(budget.bytes).c_str(), budget.source.c_str(),
            bytes_words(needed).c_str(), reserve_words(mine, budget).c_str(), needed <= budget.bytes ? "fits" : "does not fit");
    if (needed > budget.bytes) fprintf(out, "instead: %s\n", what_fits_instead(plan, shape, budget, offload_allowed).c_str());

    fprintf(out, "the largest B that fits %s per rank, on %d rank(s) at T=%d (* this run's flags):\n", bytes_words(budget.bytes).c_str(), shape.world, shape.T);
    fprintf(out, "  %2s %9s %3s %10s %12s %10s\n", "-z", "--offload", "-r", "largest B", "needed GiB", "host GiB");
    for (int z = 0; z <= 3; z++)
        for (int o = 0; o <= 1; o++)
            for (int r = 0; r <= 2; r++) {
                RunShape s = shape;
                s.stage = z, s.offload = o, s.recompute = r;
                const bool own = z == shape.stage && o == shape.offload && r == shape.recompute;
                if (o && !offload_allowed) {
                    fprintf(out, "%c %2d %9s %3d %10s\n", own ? '*' : ' ', z, "cpu", r, "n/a (-w 0)");
                    continue;
                }
                s.B = largest_fitting_B(plan, s, budget);
                if (s.B == 0) {
                    fprintf(out, "%c %2d %9s %3d %10s\n", own ? '*' : ' ', z, o ? "cpu" : "none", r, "-");
                    continue;
                }
                const MemoryUse m = plan(s, 0);
                fprintf(out, "%c %2d %9s %3d %10d %12.2f %10.2f\n", own ? '*' : ' ', z, o ? "cpu" : "none", r, s.B, GiB(bytes_needed(m, budget)),
                        GiB(memory_total(m, true)));
            }

    // the two answers the README's table quotes: the least change of these flags that fits at
    // B = 1 (with the B it reaches), and the largest B of all, at the cheapest flags reaching it
    RunShape at_one = shape, least;
    at_one.B = 1;
    if (!least_change(plan, at_one, budget, offload_allowed, &least)) {
        fprintf(out, "least change that fits: none, not at B=1 with -z 3 -r 2 --offload cpu on up to 65536 ranks\n");
        return;
    }
    least.B = largest_fitting_B(plan, least, budget);
    RunShape widest = least;
    for (RunShape s : changes_in_cost_order(least, offload_allowed))
        if ((s.B = largest_fitting_B(plan, s, budget)) > widest.B) widest = s;
    fprintf(out, "least change that fits: %s, B up to %d\n", changed_flags(shape, least).c_str(), least.B);
    fprintf(out, "largest B: %d with %s\n", widest.B, changed_flags(shape, widest).c_str());
}
