#!/usr/bin/env bash
# The measurement behind --fp8's scaling choice (docs/fp8.md), on the CPU: a small GPT-2 trained on
# Tiny Shakespeare with the blocks' matmuls emulated in fp8 under three scalings, against the same
# run in fp32, and against fp32 with the learning rate 0.1% higher (how far two runs drift apart for
# nothing); each on three seeds.
#   current     each tensor's own amax (what --fp8 e4m3 does)
#   delayed1    the amax the same cast took in the previous micro-step
#   delayed16   the largest of the last 16 (Transformer Engine's recipe, its "max" rule)
#   grad_e4m3   current, the output gradients in e4m3 instead of e5m2 (one seed)
# Delayed scaling exists only here: the script copies the committed tree to a temporary folder and
# adds it to the CPU cast there (FP8_DELAYED=H; the casts of a micro-step, in order, are the cast
# sites), with a count of the values it saturates. Prints one line a run: the final validation loss
# and its relative gap to fp32's of the same seed, the mean training loss over the last 100 steps,
# the mean relative gap of the training losses over steps 51-600, the fraction saturated.
# About 40 runs of 600 steps: an hour or more on two cores. make data first.
#   bash scripts/fp8_scaling_experiment.sh [SEEDS, default "1337 1338 1339"]
set -u
cd "$(dirname "$0")/.."
seeds=${1:-1337 1338 1339}
data=$PWD/data/tinyshakespeare
[ -f "$data/tiny_shakespeare_train.bin" ] || { echo "error: no $data/tiny_shakespeare_train.bin: make data first"; exit 1; }
work=$(mktemp -d /tmp/fp8_scaling.XXXXXX)
git archive HEAD | tar -x -C "$work"
python3 - "$work" <<'EOF' || exit 1
import sys
def edit(path, old, new):
    s = open(path).read()
    if old not in s:
        sys.exit(f"error: {path} no longer holds what this experiment edits; update scripts/fp8_scaling_experiment.sh")
    open(path, "w").write(s.replace(old, new, 1))
work = sys.argv[1]
edit(f"{work}/kernels/cpu/fp8.h", "#include <cstdint>\n", "#include <cstdint>\n#include <cmath>\n#include <cstdio>\n#include <cstdlib>\n#include <vector>\n")
edit(f"{work}/kernels/cpu/fp8.h", """    noted->amax_bits = amax_bits(x, n);
    noted->descale = fp8_descale(noted->amax_bits, f);
    *nonfinite_amaxes += amax_nonfinite(noted->amax_bits) ? 1 : 0;
    const float scale = fp8_scale(noted->amax_bits, f), descale = noted->descale;""", """    if (f == Fp8Format::E5M2 && getenv("FP8_GRAD_E4M3")) f = Fp8Format::E4M3;
    noted->amax_bits = amax_bits(x, n);
    static const int H = getenv("FP8_DELAYED") ? atoi(getenv("FP8_DELAYED")) : 0;
    static std::vector<std::vector<uint32_t>> history;
    static Fp8Saturation saturation;
    uint32_t used = noted->amax_bits;
    if (H > 0) {
        const int site = fp8_site()++;
        if ((int)history.size() <= site) history.resize(site + 1);
        std::vector<uint32_t>& h = history[site];
        if (!h.empty()) used = *std::max_element(h.begin(), h.end());
        h.push_back(noted->amax_bits);
        if ((int)h.size() > H) h.erase(h.begin());
        const float limit = fp8_layout(f).largest / fp8_scale(used, f);
        long over = 0;
        #pragma omp parallel for reduction(+ : over)
        for (size_t i = 0; i < n; i++) over += std::fabs(x[i]) > limit;
        saturation.saturated += over, saturation.total += (long)n;
    }
    noted->descale = fp8_descale(used, f);
    *nonfinite_amaxes += amax_nonfinite(noted->amax_bits) ? 1 : 0;
    const float scale = fp8_scale(used, f), descale = noted->descale;""")
edit(f"{work}/kernels/cpu/fp8.h", "inline void fp8_round_trip(", """inline int& fp8_site() { static int s = 0; return s; }
struct Fp8Saturation {
    long saturated = 0, total = 0;
    ~Fp8Saturation() { fflush(stdout); fprintf(stderr, "saturated %ld of %ld\\n", saturated, total); }
};
inline void fp8_round_trip(""")
edit(f"{work}/model/gpt2.h", """        zero_.prefetch(layer_group(0));  // the first layer's""", """        cpu::fp8_site() = 0;
        zero_.prefetch(layer_group(0));  // the first layer's""")
EOF
(cd "$work" && make NVCC= train_gpt >build.log 2>&1) || { tail -20 "$work/build.log"; echo "error: the experiment's build failed"; exit 1; }
STEPS=${STEPS:-600}  # a shorter run checks the script
common=(--device cpu -e L=4,NH=4,C=128 -b 8 -t 64 -x "$STEPS" -u 20 -v "$STEPS" -m 40 -s 0 -i "$data/tiny_shakespeare_train.bin"
        -j "$data/tiny_shakespeare_val.bin")
run() {  # NAME SEED LR FP8 [VAR=VALUE...]: one run's output into $work/NAME_sSEED.txt
    env OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" "${@:5}" "$work/train_gpt" "${common[@]}" -l "$3" --fp8 "$4" --seed "$2" -o "" \
        >"$work/$1_s$2.txt" 2>&1
}
for seed in $seeds; do
    run fp32 "$seed" 3e-3 none
    run lr_plus_0.1pct "$seed" 3.003e-3 none
    run current "$seed" 3e-3 e4m3
    run delayed1 "$seed" 3e-3 e4m3 FP8_DELAYED=1
    run delayed16 "$seed" 3e-3 e4m3 FP8_DELAYED=16
done
run grad_e4m3 "${seeds%% *}" 3e-3 e4m3 FP8_GRAD_E4M3=1
python3 - "$work" <<'EOF'
import glob, os, re, statistics, sys
def read(path):
    text = open(path, errors="replace").read()
    train = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step +(\d+)/\d+ \| loss ([0-9.]+)", text, re.M)}
    val = [float(v) for v in re.findall(r"^val loss ([0-9.]+)", text, re.M)]
    sat = re.search(r"saturated (\d+) of (\d+)", text)
    return train, val, (int(sat.group(1)) / int(sat.group(2)) if sat and int(sat.group(2)) else None)
runs = {os.path.basename(p)[:-4]: read(p) for p in sorted(glob.glob(f"{sys.argv[1]}/*_s*.txt"))}
n = max(max(train) for train, _, _ in runs.values())  # steps (600: the gap over 51-600, the last 100)
print(f"{'run':26} {'final val':>9} {'vs fp32':>8} {'train, last ' + str(n // 6):>15} {f'train gap {n // 12 + 1}-{n}':>16} {'saturated':>9}")
for name, (train, val, sat) in runs.items():
    ref_train, ref_val, _ = runs["fp32_s" + name.rsplit("_s", 1)[1]]
    steps = [s for s in range(n // 12 + 1, n + 1) if s in train and s in ref_train]
    gap = statistics.mean(abs(train[s] - ref_train[s]) / ref_train[s] for s in steps)
    last = statistics.mean(train[s] for s in range(n - n // 6 + 1, n + 1) if s in train)
    print(f"{name:26} {val[-1]:9.4f} {100 * (val[-1] / ref_val[-1] - 1):+7.2f}% {last:15.4f} {100 * gap:15.2f}% {'' if sat is None else f'{sat:.2g}':>9}")
EOF
echo "the runs' output: $work"
