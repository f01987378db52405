#!/usr/bin/env bash
# Every rank saves and loads its own part of a checkpoint (train/sharded_checkpoint.h), seen from
# outside the trainer (test/rank_probe.c, preloaded):
# 1. d12 on 4 ranks at -z 3: at a save each rank, rank 0 included, holds no more than the staging
#    buffer beyond what it held before (and 8 MiB for the rest: MPI's, the probe's); at a load no
#    more than that and its own shard as it fills (parameters, m and v: 12 bytes per element of
#    its shard S in the fp32 build), and it reads at most its share of both files (12 S) plus the
#    headers, the state's tail, a read-ahead block per file and 64 KiB for the window's other
#    reads (the probe's own of /proc, MPI's). A rank holding a whole fp32 copy of the model (16 S
#    on 4 ranks) fails both.
# 2. Who writes: at stage 0 rank 0 alone, in shard groups the first group alone, at stage 3 each
#    rank its half; every byte of both files once.
# 3. --async-checkpoint writes the very files a staged save writes, and the same log.
# 4. A rank killed during a save, at several calls: no DONE for that checkpoint, and -y 1 resumes
#    the one before to the same final checkpoint as a run never killed.
# 5. A rank whose write or sync fails (staged and async): exit 1 with one line naming the rank, the
#    file and what the system said, no DONE for that checkpoint.
# 6. A damaged checkpoint at a resume on 2 ranks: one line, not one per rank.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dir=$(mktemp -d)
LIMIT="timeout -k 5 300"  # a hang fails the test, not the suite
case=0
fail() { echo "FAIL: $*"; cat "$dir/out" 2>/dev/null | tail -20; rm -rf "$dir"; exit 1; }
cc -shared -fPIC -O2 -o "$dir/probe.so" test/rank_probe.c -ldl || fail "cannot build the probe"
probe_run() {  # NP PROBE_DIR FLAGS...: train_gpt on NP ranks, each rank's costs by phase in PROBE_DIR
    local np=$1 probe=$2
    shift 2
    mkdir -p "$probe"
    $LIMIT mpirun -np "$np" --oversubscribe -x RANK_PROBE_DIR="$probe" -x RANK_PROBE_PHASES=1 -x LD_PRELOAD="$dir/probe.so" \
        ./train_gpt --device cpu "$@" >"$dir/out" 2>&1
}

# 1. d12, 4 ranks, -z 3: a save, then a load
D12=(-e d12 -b 1 -t 64 -z 3 -v 0 -s 0 --seed 3)
probe_run 4 "$dir/save" "${D12[@]}" -x 1 -o "$dir/d12" || fail "d12 run exited $?"
probe_run 4 "$dir/load" "${D12[@]}" -x 2 -y 1 -o "$dir/d12" || fail "d12 resume exited $?"
grep -q "resuming from step 1" "$dir/out" || fail "the d12 run did not resume"
python3 - "$dir" <<'EOF' || fail "a rank's save or load took more than its share"
import os, sys
d = sys.argv[1]
P = (os.path.getsize(d + "/d12/model_00000001.bin") - 1024) // 4
state = os.path.getsize(d + "/d12/state_00000001.bin")
tail = state - 1024 - 2 * 4 * P
S = -(-P // 4) + 12 * 12 + 4  # elements in a rank's shard, at most (every tensor's chunk rounded up)
staging, slack = 32 << 20, 8 << 20
for phase in ("save", "load"):
    for r in range(4):
        lines = open(f"{d}/{phase}/rank_{r}").read().split("\n")
        got = [l.split() for l in lines if l.startswith(phase + " ")]
        assert len(got) == 1, f"rank {r}: no {phase} line"
        extra, bound = int(got[0][1]) * 1024, staging + slack + (12 * S if phase == "load" else 0)
        assert extra <= bound, f"rank {r} {phase}: {extra} bytes beyond what it held, more than {bound}"
        if phase == "load":
            read, share = int(got[0][2]), 12 * S + 2 * 1024 + tail + 2 * 4096 + 65536
            assert read <= share, f"rank {r} read {read} bytes at the load, more than its share {share}"
            print(f"rank {r}: load {extra / 2**20:.1f} MiB beyond what it held, {read / 2**20:.1f} MiB read (share {share / 2**20:.1f})")
        else:
            print(f"rank {r}: save {extra / 2**20:.1f} MiB beyond what it held")
EOF

# 2. who writes what: every byte of both files written once, by the ranks that own it
TINY=(-e L=2,NH=2,C=32 -b 2 -t 16 -v 0 -s 0 --seed 5 -z 3 -n 2)
for layout in "-z 0" "-z 1 --shard-group 1" "-z 3"; do
    probe_run 2 "$dir/who_${layout// /_}" "${TINY[@]}" $layout -x 1 -o "$dir/who_run_${layout// /_}" || fail "$layout: run exited $?"
    python3 - "$dir/who_${layout// /_}" "$dir/who_run_${layout// /_}" "$layout" <<'EOF' || fail "$layout: the ranks wrote other bytes than their parts"
import os, sys
probe, run, layout = sys.argv[1:]
files = os.path.getsize(run + "/model_00000001.bin") + os.path.getsize(run + "/state_00000001.bin")
wrote = [int(next(l for l in open(f"{probe}/rank_{r}") if l.startswith("wrote ")).split()[1]) for r in range(2)]
assert sum(wrote) == files, f"{layout}: the ranks wrote {wrote}, {sum(wrote)} bytes in all, the files hold {files}"
if layout != "-z 3":
    assert wrote[1] == 0, f"{layout}: rank 1 wrote {wrote[1]} bytes; it holds a replica of rank 0's part"
else:  # rank 1's half of every tensor: 12 bytes per element, about half the parameters
    P = (os.path.getsize(run + "/model_00000001.bin") - 1024) // 4
    assert abs(wrote[1] - 12 * P / 2) <= 0.01 * 12 * P / 2, f"{layout}: rank 1 wrote {wrote[1]} bytes, not its half of {12 * P}"
EOF
done

# 3. async and staged saves: the same files and log
$LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 6 -o "$dir/staged" >"$dir/out" 2>&1 || fail "staged run exited $?"
$LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 6 --async-checkpoint 1 -o "$dir/async" >"$dir/out" 2>&1 ||
    fail "async run exited $?"
for f in model_00000002.bin state_00000002.bin model_00000004.bin state_00000004.bin model_00000006.bin state_00000006.bin DONE_00000006; do
    cmp -s "$dir/staged/$f" "$dir/async/$f" || fail "--async-checkpoint: $f differs from the staged save's"
done
# the log without its timings
strip() { sed -E 's/ ms:[^ ]+ tok\/s:[^ ]+//' "$1"; }
[ "$(strip "$dir/staged/main.log")" = "$(strip "$dir/async/main.log")" ] || fail "--async-checkpoint: the log differs"

# 4. a rank killed during the save at step 4: rank 0 making the files, the parts' writes (by the
#    main thread, or by the save's own with --async-checkpoint), their sync, rank 0's renames
for kill in "0 pwrite model_00000004 1" "2 pwrite model_00000004 2" "1 pwrite state_00000004 2 async" "1 fsync state_00000004 1" \
    "0 rename state_00000004 1" "0 rename DONE_00000004 1"; do
    read -r rank call text n async <<<"$kill"
    flags=(); [ -n "$async" ] && flags=(--async-checkpoint 1)
    said="rank $rank killed at its call $n of $call on $text${async:+ (async)}"
    run=$dir/killed_$((++case))  # a name without TEXT, which must match one file alone
    $LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 4 -o "$run" >"$dir/out" 2>&1 || fail "run before the kill exited $?"
    rm "$run"/DONE_00000004 "$run"/model_00000004.bin "$run"/state_00000004.bin
    $LIMIT mpirun -np 3 --oversubscribe -x KILL_AT="$call $text $n" -x KILL_RANK="$rank" -x LD_PRELOAD="$dir/probe.so" \
        ./train_gpt --device cpu "${TINY[@]}" "${flags[@]}" -x 4 -y 1 -o "$run" >"$dir/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$said: exit $rc (124: it hung)"
    grep -q "exited on signal 9" "$dir/out" || fail "$said: the rank was not killed there (exit $rc)"
    [ -e "$run/DONE_00000004" ] && fail "$said: DONE_00000004 written"
    if [ "$call" = rename ]; then  # killed at that rename: what was renamed before it is in place, the rest not
        [ -e "$run/model_00000004.bin" ] || fail "$said: killed before model_00000004.bin was renamed"
        state_renamed=no want=no
        [ -e "$run/state_00000004.bin" ] && state_renamed=yes
        [ "$text" = DONE_00000004 ] && want=yes
        [ $state_renamed = $want ] || fail "$said: killed at another rename"
    fi
    $LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 6 -y 1 -o "$run" >"$dir/out" 2>&1 || fail "resume after the kill exited $?"
    grep -q "resuming from step 2" "$dir/out" || fail "$said: the resume did not take step 2"
    for f in model_00000006.bin state_00000006.bin; do
        cmp -s "$dir/staged/$f" "$run/$f" || fail "$said: $f differs from the run never killed"
    done
done
# 5. a rank whose write or sync fails, staged and async: one line, exit 1, no DONE
for failing in "1 fsync state_00000004 1" "1 fsync state_00000004 1 async" "1 pwrite model_00000004 1 async"; do
    read -r rank call text n async <<<"$failing"
    flags=(); [ -n "$async" ] && flags=(--async-checkpoint 1)
    said="rank $rank's call $n of $call on $text failing${async:+ (async)}"
    run=$dir/failed_$((++case))
    $LIMIT mpirun -np 3 --oversubscribe -x FAIL_AT="$call $text $n" -x FAIL_RANK="$rank" -x LD_PRELOAD="$dir/probe.so" \
        ./train_gpt --device cpu "${TINY[@]}" "${flags[@]}" -x 4 -o "$run" >"$dir/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "$said: exit $rc, expected 1"
    what=$([ "$call" = fsync ] && echo "fsync failed" || echo "write failed")
    [ "$(grep -c "^error: " "$dir/out")" -eq 1 ] &&
        grep -qE "^error: rank $rank: $run/${text}\.bin\.[0-9a-f]{16}\.tmp: $what: Input/output error; the checkpoint of step 2 is intact$" "$dir/out" ||
        fail "$said: not one line naming the rank, the file and the system's error"
    [ -e "$run/DONE_00000004" ] && fail "$said: DONE_00000004 written"
    [ -e "$run/DONE_00000002" ] || fail "$said: the checkpoint of step 2 is gone"
done

# 6. a damaged checkpoint at a resume: said once, by rank 0, not by every rank
for damaged in model state; do
    cp -r "$dir/staged" "$dir/damaged_$damaged"
    truncate -s -1 "$dir/damaged_$damaged/${damaged}_00000006.bin"
    $LIMIT mpirun -np 2 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 8 -y 1 -o "$dir/damaged_$damaged" >"$dir/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "a resume from a truncated ${damaged}_00000006.bin: exit $rc, expected 1"
    [ "$(grep -c "^error: " "$dir/out")" -eq 1 ] && grep -q "^error: .*${damaged}_00000006.bin: .* bytes" "$dir/out" ||
        fail "a resume from a truncated ${damaged}_00000006.bin: not one line naming the file and its size"
done

rm -rf "$dir"
echo "ok: d12 on 4 ranks saves within its staging and loads within its shard and staging per rank, reading its share; each byte written once by its owner; async saves the same files; a rank killed mid-save leaves no DONE and resumes bit-exact; a failed write or sync says so once, without DONE; a damaged checkpoint is said once"
