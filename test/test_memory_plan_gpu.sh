#!/usr/bin/env bash
# The memory plan on a GPU; "skipped: no GPU" (exit 0) where there is none. For a few one-GPU runs
# of the CUDA build (recompute 0-2, offload, -b auto):
#   - the run's memory line is the one --plan prints for it, and after step 1 its buffers still
#     hold exactly that (no op grew the scratch past what was reserved for it)
#   - the device memory taken from the CUDA context's making to the end of step 1
#     (cudaMemGetInfo) is at least the plan's device total, and what it takes beyond that (the
#     rounding of each allocation, the kernels loaded on first use, cuBLASLt's own) stays within
#     what the plan keeps free for it (train/memory_plan.h: kCudaReserve, 2 MiB an allocation)
#   - all the GPU holds after step 1, the context included, and at its peak over 3 steps (the
#     CUDA graph made at step 2 included, where one applies), is within what the plan says the
#     run needs (so -b auto's margin is enough), on a GPU that nothing else uses
# Each run prints its measured figures: the context, and the memory beyond the plan.
# Usage: bash test/test_memory_plan_gpu.sh [TRAIN_GPT]   (default ./train_gpt, the CUDA build)
set -u
cd "$(dirname "$0")/.."
bin=${1:-./train_gpt}
out=$(mktemp)
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "skipped: no GPU"
    rm -f "$out"
    exit 0
fi

# random tokens to train on (the GPU machine has no data of its own): llm.c's shard format
shard=$(mktemp)
python3 -c "
import sys, numpy as np; sys.path.insert(0, 'data')
from data_common import write_token_shard
write_token_shard('$shard', np.random.default_rng(0).integers(0, 50257, 1 << 21))" || fail "writing a token shard"
trap 'rm -f "$out" "$shard"' EXIT

mib() { sed -n "s/$1/\\1/p" "$out" | head -1; }
check() {  # FLAGS...: one run against its plan
    timeout 300 "$bin" --device cuda -i "$shard" -t 1024 -x 3 -v 0 -s 0 -o "" "$@" >"$out" 2>&1 || fail "$* exited $?"
    local ran buffers taken in_use peak planned needed allocations reserve B
    ran=$(grep '^rank 0 memory MiB' "$out")
    B=$(sed -n 's/.* | B=\([0-9]*\) T=1024.*/\1/p' "$out")
    buffers=$(mib '^rank 0 device memory after step 1: \([0-9.]*\) MiB in the run.s buffers.*')
    taken=$(mib '.*, \([0-9.]*\) MiB taken since the CUDA context was made.*')
    in_use=$(mib '.*, \([0-9.]*\) MiB in use on the GPU$')
    peak=$(mib '^rank 0 peak device memory in use after a step.*: \([0-9.]*\) MiB$')
    [ -n "$ran" ] && [ -n "$B" ] && [ -n "$buffers" ] && [ -n "$taken" ] && [ -n "$in_use" ] && [ -n "$peak" ] || fail "$*: no memory lines"
    local -a plan_flags=()
    for a in "$@"; do [ "$a" = auto ] && plan_flags+=("$B") || plan_flags+=("$a"); done
    "$bin" --plan --device cuda -t 1024 "${plan_flags[@]}" >"$out" 2>&1 || fail "--plan $* exited $?"
    planned=$(grep '^rank 0 memory MiB' "$out")
    [ "$ran" = "$planned" ] || fail "$*: the run printed
$ran
and --plan
$planned"
    local total=${planned%% || host:*}  # the device part's total
    total=${total##* | total }
    allocations=$(mib '.* MiB for \([0-9]*\) allocations. rounding.*')
    reserve=$(mib '.*(\([0-9.]*\) GiB kept free for the CUDA context and libraries.*')
    needed=$(awk "BEGIN { print $total + 1024 * $reserve + 2 * $allocations }")
    echo "$* (B=$B): planned $total MiB, buffers after step 1 $buffers, taken $taken (beyond the plan $(awk "BEGIN { print $taken - $total }")), in use $in_use (the context and what was there before: $(awk "BEGIN { print $in_use - $taken }")), peak $peak, needed by the plan $needed"
    [ "$buffers" = "$total" ] || fail "$*: the buffers hold $buffers MiB after step 1, the plan $total"
    awk "BEGIN { exit !($taken + 1 >= $total) }" || fail "$*: $taken MiB taken, less than the $total planned"
    awk "BEGIN { exit !($in_use <= $needed) }" || fail "$*: $in_use MiB in use, more than the $needed MiB the plan says it needs"
    awk "BEGIN { exit !($peak <= $needed) }" || fail "$*: $peak MiB in use at the peak of 3 steps, more than the $needed MiB the plan says it needs"
}

check -e d12 -b 8 -r 0
check -e d12 -b 8 -r 1
check -e d12 -b 8 -r 2
check -e d12 -b 8 --offload cpu
check -e d24 -b auto -r 2 --device-memory 20GiB
echo "ok"
