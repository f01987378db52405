#!/usr/bin/env bash
# GPU benchmark: attention alone beside PyTorch's; d12 (B=64, T=1024, -r 1 and 0) and d48 (B=16,
# -r 1 and 0) beside PyTorch's nanoGPT recipe (scripts/bench_nanogpt.py, torch.compile) on the same
# tokens, in one table with peak device memory, and the SM clock, power and clock event reasons
# sampled during each run (scripts/gpu_clocks.py); one d12 step traced as it ran (CUPTI:
# scripts/kernel_trace.so, scripts/step_trace.py): busy, idle and where the idle time is; each kernel
# outside attention and the GEMMs; the step's GEMMs with each algorithm cuBLASLt offers; d12's
# kernels one by one (Nsight Compute); d12 and d48 again with the fastest GEMM algorithms
# (--gemm-algos), d48's kernel table, d48 with --offload cpu (the optimizer on the host), d24, the
# ZeRO stages. ms/step: the median of the steps after the first three; MFU the trainer's own (its
# step lines: 6N + 6LCT FLOPs per token, N with the padded vocabulary, as llm.c counts, against the
# GPU's dense peak in train/progress.h), averaged.
set -u
cd "$(dirname "$0")/.."
DATA=${DATA:-/tmp/bench_tokens.bin}
TRAIN_GPT=${TRAIN_GPT:-./train_gpt}  # which build's (scripts/gpu_check.sh runs each)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}  # seconds one run may take: a hang costs that, not the rest
# BENCH_DEADLINE: the time (seconds since the epoch) by which every run has ended, so that none
# outlives the caller's time (scripts/gpu_check.sh: its phase's end), on the GPU beside the next
BENCH_DEADLINE=${BENCH_DEADLINE:-}
PEER_TIMEOUT=${PEER_TIMEOUT:-$((2 * BENCH_TIMEOUT))}  # PyTorch's run: torch.compile takes a minute or more at d48
timed() { timed_for "$BENCH_TIMEOUT" "$@"; }  # COMMAND...
timed_for() {  # SECONDS COMMAND...: runs it, cut at SECONDS or BENCH_DEADLINE, and says so when it was
    local t=$1 left
    shift
    if [ -n "$BENCH_DEADLINE" ]; then
        left=$((BENCH_DEADLINE - $(date +%s)))
        [ "$left" -ge "$t" ] || t=$left
        if [ "$t" -lt 1 ]; then echo "not run: out of time"; return 124; fi
    fi
    timeout -k 5 "$t" "$@" 2>&1
    [ $? -ne 124 ] || echo "cut at its ${t} s timeout"
}
[ -f "$DATA" ] || python3 -c "
import sys, numpy as np; sys.path.insert(0, 'data')
from data_common import write_token_shard
write_token_shard('$DATA', np.random.default_rng(0).integers(0, 50257, 2_000_000))"
# the Python with PyTorch, for its attention and the nanoGPT peer (the H200's python3 is /opt/torch/.venv's)
TORCH_PYTHON=${TORCH_PYTHON:-$(for py in python3 /opt/torch/.venv/bin/python3; do
    if "$py" -c 'import torch' 2>/dev/null; then echo "$py"; break; fi; done)}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
report() {  # TITLE ROWS OUTPUT: "bench TITLE: ms/step, tok/s, MFU" of train_gpt's OUTPUT, ROWS x 1024 tokens a step
    local ms mfu
    # the steps after the first three: the median ms (5th field) and the mean MFU ("MFU 41.2%" or "MFU n/a")
    ms=$(echo "$3" | grep -E '^step' | awk -F'|' 'NR>3 { sub(/ ms/, "", $5); print $5 + 0 }' | median)
    mfu=$(echo "$3" | grep -E '^step' | awk 'NR>3 { if (match($0, /MFU [0-9.]+%/)) { s += substr($0, RSTART + 4, RLENGTH - 5); n++ } }
                                         END { if (n) printf "%.1f%%", s / n; else print "n/a (GPU not in train/progress.h)" }')
    if [ "$3" = "not run: out of time" ]; then echo "bench $1: not run (out of time)"; return 1; fi
    if [ -z "$ms" ]; then echo "bench $1: FAILED"; echo "$3" | tail -5; return 1; fi
    awk -v title="$1" -v rows="$2" -v ms="$ms" -v mfu="$mfu" 'BEGIN {
        printf "bench %s: %.1f ms/step, %.0f tok/s, MFU %s\n", title, ms, rows * 1024 / (ms / 1000), mfu }'
}
# the SM clock, power and clock event reasons while a run runs (nvidia-smi every 100 ms), said after
# its bench line; an older driver names the reasons clocks_throttle_reasons
CLOCKS=/tmp/bench_clocks.csv CLOCK_FIELDS=clocks.sm,clocks.max.sm,power.draw,utilization.gpu,clocks_event_reasons.active
if command -v nvidia-smi >/dev/null && ! nvidia-smi --query-gpu=$CLOCK_FIELDS --format=csv >/dev/null 2>&1; then
    CLOCK_FIELDS=${CLOCK_FIELDS/clocks_event/clocks_throttle}
fi
sampler=""
trap '[ -z "$sampler" ] || kill "$sampler" 2>/dev/null' EXIT
clocks_start() {
    rm -f "$CLOCKS"
    command -v nvidia-smi >/dev/null || return 0
    stdbuf -oL nvidia-smi --query-gpu=$CLOCK_FIELDS --format=csv -lms 100 >"$CLOCKS" 2>&1 &
    sampler=$!
}
clocks_stop() {  # ends the sampler (SIGINT, as Ctrl-C does), then KILL if it lingers
    [ -n "$sampler" ] || return 0
    kill -INT "$sampler" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$sampler" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    sampler=""
}
clocks_said() {  # TITLE: what the samples of the last run say, indented
    if [ -f "$CLOCKS" ]; then python3 scripts/gpu_clocks.py "$CLOCKS" "$1" 2>&1 | sed 's/^/  /'; fi
}
bench() {  # DESC B STEPS RECOMPUTE [more train_gpt flags]
    local out desc=$1 b=$2 steps=$3 r=$4
    shift 4
    clocks_start
    out=$(timed "$TRAIN_GPT" --device cuda -e "$desc" -b "$b" -t 1024 -x "$steps" -r "$r" -v 0 -s 0 -o "" -i "$DATA" "$@")
    clocks_stop
    report "$desc B=$b T=1024 r=$r${*:+ $*}" "$b" "$out" || return
    echo "$out" | grep -E '^rank 0 (memory|peak device memory|device memory after step 1|kernel launches)'
    # the same seed and tokens in every build: losses to compare between them
    echo "  losses: $(echo "$out" | awk '/^step/ { n = $2; sub(/\/.*/, "", n); if (n == 1 || n % 10 == 0) printf "%s %s  ", n, $5 }')"
    clocks_said "during $desc B=$b r=$r${*:+ $*}"
}
# PyTorch's nanoGPT recipe (scripts/bench_nanogpt.py: bf16 autocast, SDPA, fused AdamW,
# torch.compile) on the same tokens, for the default build (the candidate's is the same PyTorch)
peer() {  # DESC B STEPS: its step lines' last, its bench line, the clocks during it
    local out title="peer PyTorch $1 B=$2 T=1024"
    if [ -z "$TORCH_PYTHON" ]; then echo "bench $title: FAILED (no python3 with torch: tried python3, /opt/torch/.venv/bin/python3)"; return 1; fi
    clocks_start
    out=$(timed_for "$PEER_TIMEOUT" "$TORCH_PYTHON" scripts/bench_nanogpt.py -e "$1" -b "$2" -t 1024 -x "$3" -i "$DATA" --compile 1 --device cuda)
    clocks_stop
    if [ "$out" = "not run: out of time" ]; then echo "bench $title: not run (out of time)"; return 1; fi
    if ! echo "$out" | grep -E '^bench peer'; then echo "bench $title: FAILED"; echo "$out" | tail -5; return 1; fi
    echo "$out" | grep -E '^(peer|compile|attention|optimizer):'
    echo "  losses: $(echo "$out" | awk '/^step/ { n = $2; sub(/\/.*/, "", n); if (n == 1 || n % 10 == 0) printf "%s %s  ", n, $5 }')"
    clocks_said "during PyTorch $1 B=$2"
}
# OURS PEER TITLE: a row of the table below, from the output of bench and of peer
summary_row() {
    local ours_ms ours_mib peer_ms peer_mib peer_pytorch
    ours_ms=$(echo "$1" | sed -n 's/^bench [^:]*: \([0-9.]*\) ms\/step.*/\1/p' | head -1)
    ours_mib=$(echo "$1" | sed -n 's/^rank 0 peak device memory in use after a step.*: \([0-9.]*\) MiB$/\1/p' | head -1)
    peer_ms=$(echo "$2" | sed -n 's/^bench peer [^:]*: \([0-9.]*\) ms\/step.*/\1/p' | head -1)
    peer_mib=$(echo "$2" | sed -n 's/^bench peer .*, \([0-9.]*\) MiB in use on the GPU$/\1/p' | head -1)
    peer_pytorch=$(echo "$2" | sed -n 's/^bench peer .* peak \([0-9.]*\) MiB allocated, \([0-9.]*\) MiB reserved.*/\1 \/ \2/p' | head -1)
    awk -v t="$3" -v om="${ours_ms:-}" -v oi="${ours_mib:-}" -v pm="${peer_ms:-}" -v pi="${peer_mib:-}" -v pp="${peer_pytorch:-}" 'BEGIN {
        speed = om != "" && pm != "" ? sprintf("%.2fx", pm / om) : "n/a"
        memory = oi != "" && pi != "" ? sprintf("%.2fx", oi / pi) : "n/a"
        printf "  %-16s %9s %11s %9s  %10s %12s %9s  %s\n", t, om == "" ? "n/a" : om, pm == "" ? "n/a" : pm, speed,
            oi == "" ? "n/a" : oi, pi == "" ? "n/a" : pi, memory, pp == "" ? "" : "(" pp ")" }'
}
# Most wanted first: a run cut short by its time keeps the lines that matter most.
# The build of TRAIN_GPT (. or build/candidate) holds the benchmarks' binaries too.
BUILD=$(dirname "$TRAIN_GPT")
# attention alone at d12's and d48's shapes (no candidate kernel: timed in the default build):
# ours (scripts/bench_attention) and PyTorch's scaled_dot_product_attention (FlashAttention-2 and
# cuDNN) where python3 has torch
if [ "$BUILD" = . ]; then
    if [ -x scripts/bench_attention ]; then timed scripts/bench_attention | grep -v '^  sweep'; else echo "bench attention: FAILED (scripts/bench_attention not built)"; fi
    timed "${TORCH_PYTHON:-python3}" scripts/bench_sdpa.py | grep -E '^bench|cut at'
fi
# ours beside PyTorch, the most wanted after attention: d12 and d48 at the default -r 1, and at -r 0
# (in bf16 the two round differently: the user's choice, both shown)
BENCH_PEER=${BENCH_PEER:-$([ "$BUILD" = . ] && echo 1 || echo 0)}
d12=$(bench d12 64 50 1)
echo "$d12"
peer_d12=""
if [ "$BENCH_PEER" = 1 ]; then peer_d12=$(peer d12 64 30); echo "$peer_d12"; fi
d48_r1=$(bench d48 16 10 1)
echo "$d48_r1"
d48=$(bench d48 16 10 0)
echo "$d48"
peer_d48=""
if [ "$BENCH_PEER" = 1 ]; then peer_d48=$(peer d48 16 10); echo "$peer_d48"; fi
d12_r0=$(bench d12 64 50 0)
echo "$d12_r0"
echo "ours beside PyTorch (nanoGPT recipe, torch.compile), this call: median ms/step after 3 steps; peak device memory in use"
echo "after a step, MiB (every process on the GPU, the CUDA context included); speed: PyTorch's ms over ours"
printf '  %-16s %9s %11s %9s  %10s %12s %9s  %s\n' run "ours ms" "PyTorch ms" speed "ours MiB" "PyTorch MiB" "ours/its" \
    "(PyTorch's allocator: peak allocated / reserved MiB)"
summary_row "$d12" "$peer_d12" "d12 B=64 -r 1"
summary_row "$d12_r0" "$peer_d12" "d12 B=64 -r 0"
summary_row "$d48_r1" "$peer_d48" "d48 B=16 -r 1"
summary_row "$d48" "$peer_d48" "d48 B=16 -r 0"
# one d12 step as it ran, kernels back to back (CUPTI through scripts/kernel_trace.so, the last of 5
# steps: train_gpt's cudaProfilerStart/Stop window): busy, idle and where the idle time is
trace_step() {  # DESC B RECOMPUTE
    local out lib=$BUILD/scripts/kernel_trace.so trace=/tmp/bench_trace.tsv title="trace $1 B=$2 T=1024 r=$3"
    if [ ! -f "$lib" ]; then echo "bench $title: FAILED ($lib not built)"; return; fi
    rm -f "$trace"
    out=$(timed env CUDA_INJECTION64_PATH="$(cd "$(dirname "$lib")" && pwd)/kernel_trace.so" KERNEL_TRACE_FILE="$trace" \
        "$TRAIN_GPT" --device cuda -e "$1" -b "$2" -t 1024 -x 5 -r "$3" -v 0 -s 0 -o "" -i "$DATA")
    if [ "$out" = "not run: out of time" ]; then echo "bench $title: not run (out of time)"; return; fi
    if [ ! -f "$trace" ]; then echo "bench $title: FAILED (no trace written)"; echo "$out" | tail -5; return; fi
    # kept for another look without a GPU (step_trace.py --top 40), one file per build
    [ -z "${OUT:-}" ] || cp "$trace" "$OUT/step_trace_$1_$([ "$BUILD" = . ] && echo default || basename "$BUILD").tsv"
    echo "traced run's last step (the window): $(echo "$out" | grep -E '^step' | tail -1)"
    echo "$out" | grep -E '^kernel_trace:'
    python3 scripts/step_trace.py "$trace" 2>&1
}
trace_step d12 64 1
# each kernel of the d12 step other than attention and the GEMMs, beside the bytes it moves; the
# encoder backward also on Tiny Shakespeare's tokens when make data has written them
SHAKESPEARE=data/tinyshakespeare/tiny_shakespeare_train.bin
if [ -x "$BUILD/test/bench_kernels_cuda" ]; then timed "$BUILD/test/bench_kernels_cuda" $([ -f "$SHAKESPEARE" ] && echo "$SHAKESPEARE"); fi
# the step's GEMMs: the algorithm in use against the others cuBLASLt offers for each; the fastest
# of each kept as a --gemm-algos table for the runs below
GEMM_TABLE=/tmp/bench_gemm_algos.txt
rm -f "$GEMM_TABLE"
if [ "$BUILD" = . ] && [ -x scripts/bench_gemm ]; then timed scripts/bench_gemm --write "$GEMM_TABLE"; fi
# where a step's time goes, kernel by kernel (Nsight Compute on the last of 3 steps, caches as
# the run leaves them), and the step's time (its bench line) less its kernels' (scripts/kernel_table.py)
kernel_table() {  # BENCH_LINE DESC B RECOMPUTE
    if ! command -v ncu >/dev/null; then echo "kernel table: skipped (no ncu)"; return; fi
    echo "kernel table of $2 B=$3 -r $4:"
    timed ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum \
        --print-kernel-base function --csv --page raw \
        "$TRAIN_GPT" --device cuda -e "$2" -b "$3" -t 1024 -x 3 -r "$4" -v 0 -s 0 -o "" -i "$DATA" >/tmp/bench_ncu.csv &&
        python3 scripts/kernel_table.py /tmp/bench_ncu.csv 1 $(echo "$1" | sed -n 's/^bench [^:]*: \([0-9.]*\) ms\/step.*/\1/p') ||
        echo "kernel table: FAILED ($(tail -1 /tmp/bench_ncu.csv))"
}
kernel_table "$d12" d12 64 1
# the same runs with the table's algorithms
if [ -f "$GEMM_TABLE" ]; then
    bench d12 64 50 1 --gemm-algos "$GEMM_TABLE"
    bench d48 16 10 0 --gemm-algos "$GEMM_TABLE"
fi
[ "$BUILD" = . ] && kernel_table "$d48" d48 16 0
bench d48 16 10 2
# GPT-2 1.5B on one GPU with the optimizer state (12 bytes per parameter, 18.7 GB) on the host
bench d48 16 10 2 --offload cpu
bench d24 32 20 0

# ZeRO stages on one GPU shared by 2 ranks (MPI, staged through host memory): relative figures
# only, since the staging costs what NCCL between GPUs would not
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    for z in 0 1 2 3; do
        out=$(timed mpirun -np 2 --oversubscribe "$TRAIN_GPT" --device cuda -e d12 -b 16 -t 1024 -z "$z" -x 10 -v 0 -s 0 -o "" -i "$DATA")
        report "d12 B=16 T=1024, 2 ranks sharing the GPU, ZeRO $z" 32 "$out"
    done
fi
