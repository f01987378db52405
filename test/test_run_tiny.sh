#!/usr/bin/env bash
# scripts/run_tiny.sh survives a kill: its trainer is SIGKILLed once, mid-run, after a checkpoint
# (at step 10, or a later one on a slow machine) and after logging steps past it; the loop
# restarts it with -y 1 and still ends with the DONE file of the last step, main.log has every
# step exactly once, and the final checkpoint (model and state) equals an uninterrupted run's
# byte for byte.
set -u
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
run_pid=""
fail() {
    echo "FAIL: $*"
    [ -n "$run_pid" ] && kill "$run_pid" 2>/dev/null
    tail -20 "$dir/b.out" 2>/dev/null
    rm -rf "$dir"
    exit 1
}
export STEPS=40 CKPT_EVERY=10 MODEL=L=2,NH=2,C=32 B=4 T=32 VAL_EVERY=5 SAMPLE_EVERY=10 MAX_STARTS=3
export OMP_NUM_THREADS=2

OUT_DIR=$dir/a timeout 300 bash scripts/run_tiny.sh >"$dir/a.out" 2>&1 || fail "uninterrupted loop exited $?"

OUT_DIR=$dir/b timeout 300 bash scripts/run_tiny.sh >"$dir/b.out" 2>&1 &
run_pid=$!
# wait for the checkpoint at step 10 and a step logged after it, then kill the trainer itself
for _ in $(seq 3000); do
    [ -f "$dir/b/DONE_00000010" ] && grep -q "^s:11 trl" "$dir/b/main.log" 2>/dev/null && break
    sleep 0.05
done
grep -q "^s:11 trl" "$dir/b/main.log" || fail "the run never got past its checkpoint at step 10"
victim=$(pgrep -f "^./train_gpt .*-o $dir/b ")
[ -n "$victim" ] || fail "no trainer process to kill"
[ -f "$dir/b/DONE_00000040" ] && fail "the run finished before the kill"
kill -9 $victim
wait $run_pid || fail "interrupted loop exited $?"
run_pid=""

[ "$(grep -cE "^resuming from step (10|20|30) of $dir/b" "$dir/b.out")" -eq 1 ] || fail "the loop did not resume once, from a checkpoint"
[ "$(grep -c '^File .*DONE_00000040 exists' "$dir/b.out")" -eq 1 ] || fail "the loop did not end on DONE_00000040"
steps=$(grep -oE '^s:[0-9]+ trl' "$dir/b/main.log" | grep -oE '[0-9]+' | paste -sd' ')
[ "$steps" = "$(seq -s' ' 0 39)" ] || fail "main.log steps: $steps"
[ "$(grep -c ' tel:' "$dir/b/main.log")" -eq "$(grep -c ' tel:' "$dir/a/main.log")" ] || fail "validation lines differ in number"
for f in model_00000040.bin state_00000040.bin; do
    cmp "$dir/a/$f" "$dir/b/$f" || fail "$f differs from the uninterrupted run's"
done
ls "$dir/b" | grep -q '\.tmp$' && fail "a .tmp file was left"
echo "ok: killed, then $(grep -oE '^resuming from step [0-9]+' "$dir/b.out"), same final checkpoint"
rm -rf "$dir"
