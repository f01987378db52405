#!/usr/bin/env bash
# GPT-2 124M over NCCL, a GPU per rank, against one GPU: the first multi-GPU run a user makes.
# On N >= 2 GPUs, from the same random weights and the same sequences per step (one GPU
# accumulates N micro-steps of the N ranks' B sequences), ten steps of:
#   - -z 1 over NCCL (each rank's GPU found by its node rank, the communicator says NCCL);
#   - -z 3, and with 4 or more GPUs -z 3 --shard-group 2 (two communicators split from the
#     world's, their collectives in flight at once);
# each step's loss within 2% of the one GPU's (bf16, other summation orders), exit 0, and the
# collective watchdog silent. scripts/gpu_check.sh runs it where nvidia-smi lists two or more GPUs.
# Usage: test/test_nccl_gpus.sh [TRAIN_GPT]
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
TRAIN_GPT=${1:-./train_gpt}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge 1 ] || { echo "skipped: no GPU"; exit 0; }
[ "$gpus" -ge 2 ] || { echo "skipped: one GPU (NCCL between GPUs needs two)"; exit 0; }
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; tail -20 "$dir/out" 2>/dev/null; rm -rf "$dir"; exit 1; }
python3 -c "
import sys, numpy as np; sys.path.insert(0, 'data')
from data_common import write_token_shard
write_token_shard('$dir/tokens.bin', np.random.default_rng(0).integers(0, 50257, 1 << 22))" || fail "cannot write a token shard"
B=8
RUN=(-e d12 -b $B -t 1024 -d $((B * 1024 * gpus)) -x 10 -v 0 -s 0 -o "" --seed 7 -i "$dir/tokens.bin" -j "$dir/tokens.bin")
losses() { sed -n 's/^step *[0-9]*\/10 | loss \([0-9.]*\) .*/\1/p' "$1"; }

"$TRAIN_GPT" "${RUN[@]}" >"$dir/out" 2>&1 || fail "one GPU exited $?"
losses "$dir/out" >"$dir/one"
[ "$(wc -l <"$dir/one")" -eq 10 ] || fail "one GPU: expected 10 step lines"
cases=("-z 1" "-z 3")
[ "$gpus" -ge 4 ] && cases+=("-z 3 --shard-group 2")
for flags in "${cases[@]}"; do
    # shellcheck disable=SC2086
    timeout -k 10 600 mpirun -np "$gpus" --oversubscribe "$TRAIN_GPT" "${RUN[@]}" $flags >"$dir/out" 2>&1 || fail "$gpus GPUs $flags exited $?"
    grep -q "^communicator: NCCL" "$dir/out" || fail "$gpus GPUs $flags: not over NCCL"
    losses "$dir/out" >"$dir/many"
    [ "$(wc -l <"$dir/many")" -eq 10 ] || fail "$gpus GPUs $flags: expected 10 step lines"
    paste "$dir/one" "$dir/many" | awk -v what="$gpus GPUs $flags" '{ d = $1 - $2; if (d < 0) d = -d; if (d > 0.02 * $1) { print "FAIL: " what ": step " NR " loss " $2 ", one GPU " $1; bad = 1 } } END { exit bad }' ||
        fail "$gpus GPUs $flags: losses part from one GPU's"
    echo "$gpus GPUs $flags: losses within 2% of one GPU's; $(grep -m1 '^step   10/10' "$dir/out" | cut -d'|' -f5-6)"
done
rm -rf "$dir"
echo "ok: d12 over NCCL on $gpus GPUs (${#cases[@]} ways) trains as one GPU does"
