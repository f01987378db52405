#!/usr/bin/env bash
# GPU benchmark: attention alone beside PyTorch's; each kernel outside attention and the GEMMs;
# the step's GEMMs with each algorithm cuBLASLt offers; tok/s and MFU of d12 (B=64, T=1024) with
# its losses and, kernel by kernel, where its step goes (Nsight Compute); d48 (with and without
# recomputation, and with --offload cpu: the optimizer on the host) and d24 on one GPU, with peak
# device memory; d12 and d48 again with the fastest GEMM algorithms (--gemm-algos), and d48's
# kernel table; the ZeRO stages. MFU is the trainer's own
# (its step lines: 6N + 6LCT FLOPs per token, N with the padded vocabulary, as llm.c counts,
# against the GPU's dense peak in train/progress.h), averaged here.
set -u
cd "$(dirname "$0")/.."
DATA=${DATA:-/tmp/bench_tokens.bin}
TRAIN_GPT=${TRAIN_GPT:-./train_gpt}  # which build's (scripts/gpu_check.sh runs each)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}  # seconds one run may take: a hang costs that, not the rest
# BENCH_DEADLINE: the time (seconds since the epoch) by which every run has ended, so that none
# outlives the caller's time (scripts/gpu_check.sh: its phase's end), on the GPU beside the next
BENCH_DEADLINE=${BENCH_DEADLINE:-}
timed() {  # COMMAND...: runs it, cut at BENCH_TIMEOUT or BENCH_DEADLINE, and says so when it was
    local t=$BENCH_TIMEOUT left
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
report() {  # TITLE ROWS OUTPUT: "bench TITLE: ms/step, tok/s, MFU" of train_gpt's OUTPUT, ROWS x 1024 tokens a step
    local ms mfu
    # the steps after the first three: ms (5th field) and MFU ("MFU 41.2%" or "MFU n/a")
    ms=$(echo "$3" | grep -E '^step' | awk -F'|' 'NR>3 { sub(/ ms/, "", $5); s += $5; n++ } END { if (n) printf "%.2f", s / n }')
    mfu=$(echo "$3" | grep -E '^step' | awk 'NR>3 { if (match($0, /MFU [0-9.]+%/)) { s += substr($0, RSTART + 4, RLENGTH - 5); n++ } }
                                         END { if (n) printf "%.1f%%", s / n; else print "n/a (GPU not in train/progress.h)" }')
    if [ "$3" = "not run: out of time" ]; then echo "bench $1: not run (out of time)"; return 1; fi
    if [ -z "$ms" ]; then echo "bench $1: FAILED"; echo "$3" | tail -5; return 1; fi
    awk -v title="$1" -v rows="$2" -v ms="$ms" -v mfu="$mfu" 'BEGIN {
        printf "bench %s: %.1f ms/step, %.0f tok/s, MFU %s\n", title, ms, rows * 1024 / (ms / 1000), mfu }'
}
bench() {  # DESC B STEPS RECOMPUTE [more train_gpt flags]
    local out desc=$1 b=$2 steps=$3 r=$4
    shift 4
    out=$(timed "$TRAIN_GPT" --device cuda -e "$desc" -b "$b" -t 1024 -x "$steps" -r "$r" -v 0 -s 0 -o "" -i "$DATA" "$@")
    report "$desc B=$b T=1024 r=$r${*:+ $*}" "$b" "$out" || return
    echo "$out" | grep -E '^rank 0 (memory|peak device memory|device memory after step 1|kernel launches)'
    # the same seed and tokens in every build: losses to compare between them
    echo "  losses: $(echo "$out" | awk '/^step/ { n = $2; sub(/\/.*/, "", n); if (n == 1 || n % 10 == 0) printf "%s %s  ", n, $5 }')"
}
# Most wanted first: a run cut short by its time keeps the lines that matter most.
# The build of TRAIN_GPT (. or build/candidate) holds the benchmarks' binaries too.
BUILD=$(dirname "$TRAIN_GPT")
# attention alone at d12's and d48's shapes (no candidate kernel: timed in the default build):
# ours (scripts/bench_attention) and PyTorch's scaled_dot_product_attention (FlashAttention-2 and
# cuDNN) where python3 has torch
if [ "$BUILD" = . ]; then
    if [ -x scripts/bench_attention ]; then timed scripts/bench_attention | grep -v '^  sweep'; else echo "bench attention: FAILED (scripts/bench_attention not built)"; fi
    timed python3 scripts/bench_sdpa.py | grep -E '^bench|cut at'
fi
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
d12=$(bench d12 64 50 1)
echo "$d12"
kernel_table "$d12" d12 64 1
d48=$(bench d48 16 10 0)
echo "$d48"
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
