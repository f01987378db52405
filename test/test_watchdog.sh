#!/usr/bin/env bash
# A rank that stops or dies mid-run ends the job: the others see no progress for
# --collective-timeout seconds and stop every rank with one line (which rank, host, what it waited
# for, where the run was), a non-zero exit, and no process left behind. test/fault_job is
# train_gpt with a rank that stalls or exits on purpose at a chosen point of the run: a training
# step, the checkpoint (rank 0 is the one that writes it), the evaluations.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
TIMEOUT=4
dir=$(mktemp -d)
out=$dir/out
# this script's ranks, and no one else's on a shared machine: their command lines name $dir
fail() { echo "FAIL: $*"; cat "$out"; pkill -9 -f "test/fault_job .*$dir" 2>/dev/null; rm -rf "$dir"; exit 1; }
ARGS=(-e L=1,NH=2,C=32 -b 2 -t 16 -s 0 -x 20 --collective-timeout $TIMEOUT --tokenizer "$dir/unused")

# NP RANK DURING FAULT [FLAGS...]: the job must end, non-zero, and leave no rank running. The
# bound is generous (a loaded machine starts ranks slowly); the job without the fault takes about
# two seconds, a hang takes the outer timeout.
faulty_run() {
    local np=$1 rank=$2 during=$3 fault=$4
    shift 4
    timeout -k 5 120 mpirun -np "$np" --oversubscribe test/fault_job --fault-rank "$rank" --fault-during "$during" --fault "$fault" \
        "${ARGS[@]}" "$@" >"$out" 2>&1
    local rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$fault of rank $rank during '$during': the job hung (exit $rc)"
    [ $rc -ne 0 ] || fail "$fault of rank $rank during '$during': exit 0"
    sleep 1
    ! pgrep -f "test/fault_job .*$dir" >/dev/null || fail "$fault of rank $rank during '$during': a rank is still running"
}
# the watchdog's line from rank WAITER (a number, or a pattern such as [01]), during ACTIVITY
said() {
    grep -qE "^error: rank $1 on [^ ]+: waited [0-9.]+ s for .* during $2, more than --collective-timeout $TIMEOUT allows; a rank stopped or hangs, so the job ends$" "$out" ||
        fail "rank $1 did not say it waited during '$2' (the watchdog's line)"
}

# the unfaulted job runs to its end with these flags (else the faults prove nothing)
timeout 120 mpirun -np 2 --oversubscribe test/fault_job --fault-rank 5 --fault-during "step 1" --fault stall "${ARGS[@]}" -v 4 -n 4 -o "$dir/clean" >"$out" 2>&1 ||
    fail "the job without a fault exited $?"
grep -q "^step   20/20" "$out" || fail "the job without a fault did not train 20 steps"

# a rank stopped in a training step: the other says so
faulty_run 2 1 "step 3" stall -v 0 -o ""
said 0 "step 3"
grep -qE "waited [0-9.]+ s for an? (all-reduce|reduce-scatter|all-gather)[^;]* among all ranks \(2 rank\(s\)\)" "$out" ||
    fail "the line does not name the collective, its bytes and its ranks"

# the same at stage 3, three ranks, the last one stopped: both others wait, and the first to reach
# the timeout ends the job, perhaps before the other can say so; the stopped rank says nothing
faulty_run 3 2 "step 2" stall -v 0 -o "" -z 3
said "[01]" "step 2"
! grep -q "^error: rank 2 " "$out" || fail "the stopped rank 2 said it waited"

# a rank that dies: the job ends too (mpirun sees it go)
faulty_run 3 1 "step 2" exit -v 0 -o ""

# rank 0 stops while it writes the checkpoint: rank 1 waits for it, past the write's allowance
faulty_run 2 0 "the checkpoint" stall -v 0 -n 4 -o "$dir/ckpt" -z 1
said 1 "the checkpoint after step 4"
[ -f "$dir/ckpt/DONE_00000004" ] && fail "rank 0 stopped before writing, yet DONE_00000004 exists"

# The wait at a checkpoint's end, for every rank's part, is allowed the largest part's bytes at
# the slowest disk's rate beyond the timeout: here ALLOWANCE seconds (rank 0's and rank 1's parts
# at -z 1, 12 bytes per element of half the P parameters, at the rate given). Rank 1 slower than
# the timeout, but 2 s short of timeout + allowance, is waited for and the run ends well; slower
# than both, rank 0 ends the job once it has waited them out, and no DONE is written.
P=$(( ($(stat -c %s "$dir/clean/model_00000004.bin") - 1024) / 4 ))
ALLOWANCE=6
SLOW_DISK=(--disk-bytes-per-second $(( 12 * (P / 2) / ALLOWANCE )))
AT_END="the checkpoint after step 4 (every rank's part written)"
timeout 120 mpirun -np 2 --oversubscribe test/fault_job --fault-rank 1 --fault-during "$AT_END" --fault delay --fault-seconds $((TIMEOUT + ALLOWANCE - 2)) \
    "${SLOW_DISK[@]}" "${ARGS[@]}" -v 0 -n 4 -x 4 -z 1 -o "$dir/slow" >"$out" 2>&1 || fail "rank 1 slow by less than timeout + allowance: exit $?"
[ -f "$dir/slow/DONE_00000004" ] || fail "rank 1 slow by less than timeout + allowance: no DONE_00000004"
faulty_run 2 1 "$AT_END" delay --fault-seconds $((TIMEOUT + ALLOWANCE + 20)) "${SLOW_DISK[@]}" -v 0 -n 4 -x 4 -z 1 -o "$dir/late"
said 0 "the checkpoint after step 4 \(every rank's part written\)"
waited=$(grep -oE "^error: rank 0 on [^ ]+: waited [0-9.]+ s" "$out" | grep -oE "[0-9.]+ s$" | grep -oE "^[0-9.]+")
python3 -c "import sys; sys.exit(0 if float('$waited') >= $TIMEOUT + $ALLOWANCE - 0.5 else 1)" ||
    fail "rank 0 waited $waited s at the checkpoint's end, less than timeout + allowance ($TIMEOUT + $ALLOWANCE s)"
[ -f "$dir/late/DONE_00000004" ] && fail "rank 1 slow past the allowance, yet DONE_00000004 exists"

# a rank stops in the evaluations
faulty_run 2 1 "the evaluations" stall -v 4 -o ""
said 0 "the evaluations after step 0"

rm -rf "$dir"
echo "ok: a rank stopped in a step, at stage 3, in the checkpoint or in the evaluations, or one that died, ends the job with one line within the timeout; one slow with its part of a checkpoint is waited for within the allowance, and not past it"
