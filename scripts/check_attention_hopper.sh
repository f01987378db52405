#!/usr/bin/env bash
# The sm_90a attention (kernels/cuda/flash_attention_hopper.cuh, in the candidate build) on an
# H100/H200, in one device call, most wanted first:
#   1. the candidate's attention tests (Cuda.Attention*: the sm_90a kernels against the CPU
#      attention at training and odd shapes, wide score ranges, backward twice for the same bits)
#   2. scripts/bench_attention of both builds (the candidate's times the sm_80 kernels beside)
#   3. d12, B=16, T=1024 on Tiny Shakespeare, 100 steps from the same seed, candidate against
#      default: every step's training loss within 1%, the final validation loss within 0.5%
#   4. the candidate's d12, 20 steps, three times (no CUDA graph twice, with one once): the
#      final checkpoints bit-identical
#   5. compute-sanitizer racecheck, synccheck and initcheck over Cuda.AttentionHopper (small shapes)
# Each line of the summary says PASS, FAIL or SKIP (or is a benchmark's); it is printed and
# written to $OUT/attention_summary.txt, the logs beside it.
#
# The device call (.deps: `bash scripts/gpu_check.sh --pack`; data/tinyshakespeare: `make data`):
#   run(carry=[".deps", "data/tinyshakespeare"], command="bash scripts/check_attention_hopper.sh", timeout_s=600)
# BUDGET (seconds, default 540) bounds the whole; what cannot start in time says SKIP.
set -u
cd "$(dirname "$0")/.."
start=$(date +%s)
budget=${BUDGET:-540}
out=${OUT:-/tmp/check_attention_hopper}
mkdir -p "$out"
summary=$out/attention_summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((start + budget - $(date +%s))); }
# COMMAND... under a timeout of at most SECS and the budget left; 124 when it was cut
run_for() {
    local secs=$1 t
    shift
    t=$(left)
    [ "$t" -lt "$secs" ] && secs=$t
    [ "$secs" -gt 5 ] || return 125
    timeout -k 5 "$secs" "$@"
}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

[ -f .deps/env.sh ] && source .deps/env.sh
args=(-f kernels/cuda.mk GPU_ARCHS=90 NO_MPI=1 NVCC_WERROR=)
[ -d .deps/include/gtest ] && args+=(GTEST_ROOT="$PWD/.deps")
make "${args[@]}" -j4 train_gpt scripts/bench_attention >"$out/build_default.log" 2>&1 &
default_build=$!
make "${args[@]}" -j4 KERNELS=candidate build/candidate/train_gpt build/candidate/test/test_kernels_cuda \
    build/candidate/scripts/bench_attention >"$out/build_candidate.log" 2>&1 &
candidate_build=$!
wait $default_build && default_ok=1 || default_ok=0
wait $candidate_build && candidate_ok=1 || candidate_ok=0
[ $default_ok = 1 ] && say "PASS  build default" || say "FAIL  build default: $out/build_default.log"
[ $candidate_ok = 1 ] && say "PASS  build candidate (sm_90a)" || say "FAIL  build candidate: $out/build_candidate.log"
grep -h -i "warning" "$out"/build_*.log | grep -v -- "-Werror\|all-warnings" | head -5 | sed 's/^/WARN  /' | tee -a "$summary"
tests=build/candidate/test/test_kernels_cuda

# 1. tests
if [ $candidate_ok = 1 ]; then
    run_for 240 "$tests" --gtest_color=no --gtest_filter='Cuda.Attention*' >"$out/tests.log" 2>&1
    rc=$?
    grep -E '^worst-error|^\[  (FAILED|SKIPPED) ' "$out/tests.log" | sort -u | tee -a "$summary"
    if [ $rc -eq 0 ] && grep -q '^worst-error PASS Cuda.AttentionHopper:' "$out/tests.log"; then say "PASS  Cuda.Attention* (sm_90a kernels taken)"
    elif [ $rc -eq 0 ]; then say "FAIL  Cuda.Attention*: the sm_90a tests skipped (this GPU or image does not take them): $out/tests.log"
    else say "FAIL  Cuda.Attention* (exit $rc): $out/tests.log"; fi
fi

# 2. benchmarks
for build in candidate default; do
    bin=$([ $build = candidate ] && echo build/candidate/scripts/bench_attention || echo scripts/bench_attention)
    [ -x "$bin" ] || { say "SKIP  bench_attention $build: not built"; continue; }
    run_for 120 "$bin" >"$out/bench_$build.log" 2>&1 || say "FAIL  bench_attention $build (exit $?): $out/bench_$build.log"
    sed "s/^/$build /" "$out/bench_$build.log" | grep -E "bench attention|sm_80 kernels" | tee -a "$summary"
done

# 3. training loss, candidate against default, on Tiny Shakespeare
train=data/tinyshakespeare/tiny_shakespeare_train.bin val=data/tinyshakespeare/tiny_shakespeare_val.bin
if [ ! -f "$train" ] || [ ! -f "$val" ]; then
    say "SKIP  Tiny Shakespeare loss: no $train (make data here, carry data/tinyshakespeare)"
elif [ $default_ok = 1 ] && [ $candidate_ok = 1 ]; then
    for build in default candidate; do
        bin=$([ $build = candidate ] && echo build/candidate/train_gpt || echo ./train_gpt)
        run_for 150 "$bin" --device cuda -e d12 --seed 1 -b 16 -t 1024 -x 100 -i "$train" -j "$val" -v 100 -m 0 -s 0 -o "" \
            >"$out/shakespeare_$build.log" 2>&1 || say "FAIL  Tiny Shakespeare $build run (exit $?): $out/shakespeare_$build.log"
    done
    grep -m1 '^attention:' "$out/shakespeare_candidate.log" | sed 's/^/candidate /' | tee -a "$summary"
    python3 - "$out/shakespeare_default.log" "$out/shakespeare_candidate.log" <<'EOF' | tee -a "$summary"
import re, sys
def read(path):
    text = open(path).read()
    steps = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^step\s+(\d+)/\d+ \| loss ([0-9.]+)', text, re.M)}
    vals = [float(v) for v in re.findall(r'^val loss ([0-9.]+)', text, re.M)]
    return steps, vals
(d, dv), (c, cv) = read(sys.argv[1]), read(sys.argv[2])
common = sorted(set(d) & set(c))
if len(common) < 100 or not dv or not cv:
    print(f"FAIL  Tiny Shakespeare: {len(common)} common steps, val losses {dv} {cv}")
    sys.exit()
worst = max(abs(c[s] - d[s]) / d[s] for s in common)
val = abs(cv[-1] - dv[-1]) / dv[-1]
ok = worst <= 0.01 and val <= 0.005
print(f"{'PASS' if ok else 'FAIL'}  Tiny Shakespeare d12 100 steps: training loss within {100 * worst:.3f}% of default's at every step "
      f"(limit 1%), final validation loss {cv[-1]:.4f} against {dv[-1]:.4f} ({100 * val:.3f}%, limit 0.5%)")
EOF
fi

# 4. same seed, same bits: three candidate runs' final checkpoints
if [ $candidate_ok = 1 ] && [ -f "$train" ]; then
    for run in a b graph; do
        rm -rf "$out/run_$run"
        run_for 90 build/candidate/train_gpt --device cuda -e d12 --seed 7 -b 16 -t 1024 -x 20 -i "$train" -v 0 -s 0 -n 0 \
            --cuda-graph $([ $run = graph ] && echo 1 || echo 0) -o "$out/run_$run" >"$out/run_$run.log" 2>&1 ||
            say "FAIL  d12 run $run (exit $?): $out/run_$run.log"
    done
    same=1
    for f in "$out"/run_a/*.bin; do
        for other in b graph; do
            cmp -s "$f" "$out/run_$other/$(basename "$f")" || { same=0; say "FAIL  $(basename "$f") of run $other differs from run a's"; }
        done
    done
    ls "$out"/run_a/*.bin >/dev/null 2>&1 || same=0
    [ $same = 1 ] && say "PASS  d12 20 steps three times (graph and no graph): final checkpoints bit-identical"
    rm -rf "$out"/run_a "$out"/run_b "$out"/run_graph  # large; the logs stay
fi

# 5. sanitizers over the small shapes
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in racecheck synccheck initcheck; do
    if [ ! -x "$sanitizer" ] || [ $candidate_ok = 0 ]; then say "SKIP  $tool: no compute-sanitizer or no build"; continue; fi
    run_for 150 "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 20 "$tests" --gtest_color=no \
        --gtest_filter='Cuda.AttentionHopper' >"$out/$tool.log" 2>&1
    rc=$?
    case $rc in
        0) say "PASS  compute-sanitizer $tool over Cuda.AttentionHopper: $(grep -m1 'ERROR SUMMARY' "$out/$tool.log")" ;;
        124 | 125) say "SKIP  compute-sanitizer $tool: out of time" ;;
        *) say "FAIL  compute-sanitizer $tool (exit $rc): $(grep -m1 'ERROR SUMMARY' "$out/$tool.log") $out/$tool.log" ;;
    esac
done
tar -czf "$out/attention_logs.tgz" -C "$out" --exclude attention_logs.tgz . 2>/dev/null
say "done in $(($(date +%s) - start)) s"
