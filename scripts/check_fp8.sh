#!/usr/bin/env bash
# --fp8 e4m3 on one GPU (sm_89 or later), the checks and measurements issue 46 asks for, in the
# KERNELS=candidate build that holds the CUDA fp8 path (docs/fp8.md):
#   tests  the fp8 GPU tests against the CPU's emulation (scripts/gpu_check.sh builds and runs
#          build/candidate/test/test_kernels_cuda --gtest_filter='Cuda.Fp8*'; it needs .deps/)
#   step   d12 B=64 and d48 B=16 at T=1024, bf16 then --fp8 e4m3, the same binary in this call:
#          median ms/step after the first 3 steps, and bf16's over fp8's (targets: d48 1.15x or
#          more, d12 above 1x)
#   loss   d12 on Tiny Shakespeare from the same initial weights (--seed: one random init for
#          both), B=8, T=1024, 300 steps, validation every 50: the mean relative gap between the
#          training losses over steps 50-300 (target: 1% at most), the final validation losses'
#          relative gap (target: 2% at most), both curves in one plot (scripts/plot_log.py)
# In that order of value: tests, loss, step. BUDGET (seconds, default 540) bounds the whole, so
# that one device call of 600 s holds it: a run is cut at what is left, and what cannot start in
# time says SKIP.
# Each prints its lines as "fp8 <phase>: ..."; the runs' output, the two curves as main.log lines
# ($OUT/bf16/main.log, $OUT/fp8/main.log) and the plot go to $OUT (or /tmp/check_fp8).
#
# The device call (.deps/ from `bash scripts/gpu_check.sh --pack`; Tiny Shakespeare from `make data`):
#   run(carry=[".deps", "data/tinyshakespeare"], command="bash scripts/check_fp8.sh", timeout_s=600)
# or a phase at a time: bash scripts/check_fp8.sh tests | loss | step
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/check_fp8}
mkdir -p "$OUT"
phases=${1:-tests,step,loss}
TRAIN_GPT=build/candidate/train_gpt
SHAKESPEARE=data/tinyshakespeare/tiny_shakespeare_train.bin
SHAKESPEARE_VAL=data/tinyshakespeare/tiny_shakespeare_val.bin
RUN_TIMEOUT=${RUN_TIMEOUT:-240}  # seconds one training run may take
budget=${BUDGET:-540}
start=$(date +%s)
left() { echo $((start + budget - $(date +%s))); }
# seconds a run may take: RUN_TIMEOUT, or what is left of the budget if less (0: under 20 s left)
run_limit() { local l; l=$(left); if [ "$l" -lt 20 ]; then echo 0; elif [ "$l" -lt "$RUN_TIMEOUT" ]; then echo "$l"; else echo "$RUN_TIMEOUT"; fi; }
status=0
wants() { [[ ",$phases," == *",$1,"* ]]; }

if wants tests; then
    bash scripts/gpu_check.sh --only candidate,kernels --filter 'Cuda.Fp8*' --budget $(( $(left) < 300 ? $(left) : 300 )) 2>&1 | sed 's/^/fp8 tests: /'
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if wants step || wants loss; then
    [ -f .deps/env.sh ] && source .deps/env.sh
    blas=$(echo '#include <cblas.h>' | g++ -E -x c++ - >/dev/null 2>&1 || echo NO_BLAS=1)
    [ "$(left)" -ge 20 ] || { echo "fp8 build: SKIP (out of time)"; exit 1; }
    # shellcheck disable=SC2086
    if ! timeout -k 5 "$(left)" make -f kernels/cuda.mk KERNELS=candidate GPU_ARCHS=90 NVCC_WERROR= NO_MPI=1 $blas "$TRAIN_GPT" >"$OUT/build.log" 2>&1; then
        echo "fp8 build: FAILED"; tail -20 "$OUT/build.log"; exit 1
    fi
    [ -f "$SHAKESPEARE" ] && [ -f "$SHAKESPEARE_VAL" ] || { echo "fp8: no $SHAKESPEARE: make data here, and carry data/tinyshakespeare"; exit 1; }
fi

# ms/step: the median of the steps after the first three (the step lines' 5th field)
median_ms() { grep -E '^step' | awk -F'|' 'NR > 3 { sub(/ ms/, "", $5); print $5 + 0 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
if wants loss; then
    for fp8 in none e4m3; do
        out="$OUT/loss_$fp8.txt" dir="$OUT/$([ "$fp8" = none ] && echo bf16 || echo fp8)"
        limit=$(run_limit)
        [ "$limit" -gt 0 ] || { echo "fp8 loss: SKIP --fp8 $fp8 (out of time)"; status=1; continue; }
        timeout -k 5 "$limit" "$TRAIN_GPT" --device cuda -e d12 --seed 1337 -b 8 -t 1024 -x 300 -v 50 -m 0 -s 0 -o "" \
            -i "$SHAKESPEARE" -j "$SHAKESPEARE_VAL" --fp8 "$fp8" >"$out" 2>&1 ||
            { echo "fp8 loss: the --fp8 $fp8 run FAILED"; tail -5 "$out"; status=1; }
        # its step and validation lines as main.log's (s:<updates done> ...), without the checkpoint -o would write
        mkdir -p "$dir"
        awk '/^step/ { n = $2; sub(/\/.*/, "", n); printf "s:%d trl:%s\n", n - 1, $5; done = n }
             /^val loss/ { printf "s:%d tel:%s\n", done, $3 }' "$out" >"$dir/main.log"
    done
    python3 - "$OUT/bf16/main.log" "$OUT/fp8/main.log" <<'EOF2' || status=1
import sys

def read(path):
    train, val = {}, {}
    for line in open(path):
        f = dict(item.split(":", 1) for item in line.split() if ":" in item)
        if "trl" in f: train[int(f["s"])] = float(f["trl"])
        if "tel" in f: val[int(f["s"])] = float(f["tel"])
    return train, val

(bt, bv), (ft, fv) = read(sys.argv[1]), read(sys.argv[2])
steps = [s for s in range(50, 300) if s in bt and s in ft]
gap = sum(abs(ft[s] - bt[s]) / bt[s] for s in steps) / max(len(steps), 1)
last = max(set(bv) & set(fv), default=None)
val_gap = abs(fv[last] - bv[last]) / bv[last] if last is not None else float("nan")
ok = len(steps) == 250 and gap <= 0.01 and last == 300 and val_gap <= 0.02
print(f"fp8 loss: mean relative gap of the training losses over steps 50-299 ({len(steps)} steps): {100 * gap:.3f}% (target <= 1%)")
print(f"fp8 loss: validation after step {last}: bf16 {bv.get(last)}, fp8 {fv.get(last)}, relative gap {100 * val_gap:.3f}% (target <= 2%)")
print("fp8 loss: training losses (step bf16 fp8): " + "  ".join(f"{s} {bt[s]:.4f} {ft[s]:.4f}" for s in range(0, 300, 25) if s in bt and s in ft))
print(f"fp8 loss: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF2
    # the plot where this Python has matplotlib; else the two main.log files in $OUT make it elsewhere
    "${PLOT_PYTHON:-python3}" scripts/plot_log.py "$OUT/bf16/main.log" "$OUT/fp8/main.log" -o "$OUT/fp8_loss.png" 2>&1 | sed 's/^/fp8 loss: plot: /'
fi
if wants step; then
    for run in "d12 64 30" "d48 16 10"; do
        read -r model B steps <<<"$run"
        declare -A ms=()
        for fp8 in none e4m3; do
            log="$OUT/step_${model}_${fp8}.txt"
            limit=$(run_limit)
            [ "$limit" -gt 0 ] || { echo "fp8 step: SKIP $model --fp8 $fp8 (out of time)"; status=1; continue; }
            timeout -k 5 "$limit" "$TRAIN_GPT" --device cuda -e "$model" -b "$B" -t 1024 -x "$steps" -r 1 -v 0 -s 0 -o "" \
                -i "$SHAKESPEARE" --fp8 "$fp8" >"$log" 2>&1
            ms[$fp8]=$(median_ms <"$log")
            echo "fp8 step: $model B=$B T=1024 --fp8 $fp8: ${ms[$fp8]:-FAILED} ms/step; $(grep -E '^rank 0 (memory|peak device memory)' "$log" | tr '\n' ' ')"
            [ -n "${ms[$fp8]}" ] || { status=1; tail -5 "$log"; }
        done
        if [ -n "${ms[none]}" ] && [ -n "${ms[e4m3]}" ]; then
            awk -v m="$model" -v a="${ms[none]}" -v b="${ms[e4m3]}" 'BEGIN { printf "fp8 step: %s: bf16 %.2f ms, fp8 %.2f ms: %.3fx\n", m, a, b, a / b }'
        fi
    done
fi

exit $status
