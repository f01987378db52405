#!/usr/bin/env bash
# Every rank saves and loads its own part of a checkpoint (train/sharded_checkpoint.h), seen from
# outside the trainer (test/rank_probe.c, preloaded):
# 1. d12 on 4 ranks at -z 3: at a save and at a load each rank, rank 0 included, holds at most
#    16 bytes per element of its shard S plus the staging buffer beyond what it held before, and
#    a load reads at most its share of both files (12 bytes per shard element, fp32 build) plus
#    the headers, the state's tail, a read-ahead block per file and 64 KiB for the window's other
#    reads (the probe's own of /proc, MPI's).
# 2. --async-checkpoint writes the very files a staged save writes, and the same log.
# 3. A rank killed during a save, at several calls: no DONE for that checkpoint, and -y 1 resumes
#    the one before to the same final checkpoint as a run never killed.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dir=$(mktemp -d)
LIMIT="timeout -k 5 300"  # a hang fails the test, not the suite
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
staging = 32 << 20
for phase in ("save", "load"):
    for r in range(4):
        lines = open(f"{d}/{phase}/rank_{r}").read().split("\n")
        got = [l.split() for l in lines if l.startswith(phase + " ")]
        assert len(got) == 1, f"rank {r}: no {phase} line"
        extra = int(got[0][1]) * 1024
        assert extra <= 16 * S + staging, f"rank {r} {phase}: {extra} bytes beyond what it held, more than 16 S + staging = {16 * S + staging}"
        if phase == "load":
            read, share = int(got[0][2]), 12 * S + 2 * 1024 + tail + 2 * 4096 + 65536
            assert read <= share, f"rank {r} read {read} bytes at the load, more than its share {share}"
            print(f"rank {r}: load {extra / 2**20:.1f} MiB beyond what it held, {read / 2**20:.1f} MiB read (share {share / 2**20:.1f})")
        else:
            print(f"rank {r}: save {extra / 2**20:.1f} MiB beyond what it held")
EOF

# 2. async and staged saves: the same files and log
TINY=(-e L=2,NH=2,C=32 -b 2 -t 16 -v 0 -s 0 --seed 5 -z 3 -n 2)
$LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 6 -o "$dir/staged" >"$dir/out" 2>&1 || fail "staged run exited $?"
$LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 6 --async-checkpoint 1 -o "$dir/async" >"$dir/out" 2>&1 ||
    fail "async run exited $?"
for f in model_00000002.bin state_00000002.bin model_00000004.bin state_00000004.bin model_00000006.bin state_00000006.bin DONE_00000006; do
    cmp -s "$dir/staged/$f" "$dir/async/$f" || fail "--async-checkpoint: $f differs from the staged save's"
done
# the log without its timings
strip() { sed -E 's/ ms:[^ ]+ tok\/s:[^ ]+//' "$1"; }
[ "$(strip "$dir/staged/main.log")" = "$(strip "$dir/async/main.log")" ] || fail "--async-checkpoint: the log differs"

# 3. a rank killed during the save at step 4: rank 0 making the files, the parts' writes (by the
#    main thread, or by the save's own with --async-checkpoint), their sync, rank 0's renames
for kill in "0 pwrite model_00000004 1" "2 pwrite model_00000004 2" "1 pwrite state_00000004 2 async" "1 fsync state_00000004 1" \
    "0 rename state_00000004 1" "0 rename DONE_00000004 1"; do
    read -r rank call text n async <<<"$kill"
    flags=(); [ -n "$async" ] && flags=(--async-checkpoint 1)
    said="rank $rank killed at its call $n of $call on $text${async:+ (async)}"
    run=$dir/killed_${rank}_${call}_${text}_$n$async
    $LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 4 -o "$run" >"$dir/out" 2>&1 || fail "run before the kill exited $?"
    rm "$run"/DONE_00000004 "$run"/model_00000004.bin "$run"/state_00000004.bin
    $LIMIT mpirun -np 3 --oversubscribe -x KILL_AT="$call $text $n" -x KILL_RANK="$rank" -x LD_PRELOAD="$dir/probe.so" \
        ./train_gpt --device cpu "${TINY[@]}" "${flags[@]}" -x 4 -y 1 -o "$run" >"$dir/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$said: exit $rc (124: it hung)"
    grep -q "exited on signal 9" "$dir/out" || fail "$said: the rank was not killed there (exit $rc)"
    [ -e "$run/DONE_00000004" ] && fail "$said: DONE_00000004 written"
    $LIMIT mpirun -np 3 --oversubscribe ./train_gpt --device cpu "${TINY[@]}" -x 6 -y 1 -o "$run" >"$dir/out" 2>&1 || fail "resume after the kill exited $?"
    grep -q "resuming from step 2" "$dir/out" || fail "$said: the resume did not take step 2"
    for f in model_00000006.bin state_00000006.bin; do
        cmp -s "$dir/staged/$f" "$run/$f" || fail "$said: $f differs from the run never killed"
    done
done
rm -rf "$dir"
echo "ok: d12 on 4 ranks saves and loads within 16 S + staging per rank, reading its share; async saves the same files; a rank killed mid-save leaves no DONE and resumes bit-exact"
