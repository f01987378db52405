#!/usr/bin/env bash
# Checkpoints survive a crash of the machine, and a full disk says why and keeps the last one.
# 1. The order of the calls (test/sync_trace.c, preloaded, logs them): both files of a checkpoint
#    are made as NAME.TOKEN.tmp, synced holding all their bytes (none left in a buffer), renamed, and
#    the directory synced; DONE_N comes after both files of step N are durable, and is made
#    durable the same way.
# 2. A disk that fills up (a small tmpfs; mounting one needs root, which CI has) at the second
#    checkpoint: exit 1 with one line saying what the system said and which checkpoint is intact;
#    that checkpoint and its DONE file stay as written, the failed one has no DONE and no .tmp.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
dir=$(mktemp -d)
mnt=""
fail() {
    echo "FAIL: $*"
    cat "$dir/out" 2>/dev/null
    [ -n "$mnt" ] && umount "$mnt"
    rm -rf "$dir"
    exit 1
}
TINY=(-e L=1,NH=1,C=8 -b 2 -t 16 -v 0 -s 0 --seed 5)

# 1. the order of the calls for the checkpoints at steps 2 and 4
cc -shared -fPIC -O2 -o "$dir/sync_trace.so" test/sync_trace.c -ldl || fail "cannot build the tracing shim"
SYNC_TRACE_DIR=$dir/run SYNC_TRACE_LOG=$dir/trace LD_PRELOAD=$dir/sync_trace.so \
    ./train_gpt "${TINY[@]}" -x 4 -n 2 -o "$dir/run" >"$dir/out" 2>&1 || fail "traced run exited $?"
expected=""
for step in 00000002 00000004; do
    model=$dir/run/model_$step.bin state=$dir/run/state_$step.bin done=$dir/run/DONE_$step
    # the size a file has at its fsync is its final size: every byte was written before it
    expected+="create $model.tmp"$'\n'"create $state.tmp"$'\n'
    expected+="fsync $model.tmp $(stat -c %s "$model")"$'\n'"fsync $state.tmp $(stat -c %s "$state")"$'\n'
    expected+="rename $model.tmp $model"$'\n'"rename $state.tmp $state"$'\n'"fsync $dir/run"$'\n'
    expected+="fopen $done.tmp wb"$'\n'"fsync $done.tmp 0"$'\n'"rename $done.tmp $done"$'\n'"fsync $dir/run"$'\n'
done
# each save's files are NAME.TOKEN.tmp, a new token each time
[ "$(grep -oE '\.bin\.[0-9a-f]{16}\.tmp' "$dir/trace" | sort -u | wc -l)" -eq 2 ] || fail "the saves' files are not named by a token of their own each"
actual=$(grep -v "^fopen $dir/run/main.log " "$dir/trace" | sed -E 's/\.bin\.[0-9a-f]{16}\.tmp/.bin.tmp/g')
[ "$actual" = "${expected%$'\n'}" ] || fail "calls in this order expected:
$expected
got:
$actual"

# 2. a full disk at the second checkpoint: about 1.6 MB of model and 3.2 MB of state each
[ "$(id -u)" -eq 0 ] || fail "needs root to mount a tmpfs (CI runs as root)"
./train_gpt "${TINY[@]}" -x 2 -o "$dir/reference" >"$dir/out" 2>&1 || fail "reference run exited $?"
mnt=$dir/small
mkdir -p "$mnt" && mount -t tmpfs -o size=6m tmpfs "$mnt" || fail "cannot mount a tmpfs at $mnt"
./train_gpt "${TINY[@]}" -x 4 -n 2 -o "$mnt/run" >"$dir/stdout" 2>"$dir/out"
code=$?
[ $code -eq 1 ] || fail "a full disk: exit code $code, expected 1"
[ "$(wc -l <"$dir/out")" -eq 1 ] || fail "a full disk: $(wc -l <"$dir/out") lines on stderr, expected 1"
grep -qE "^error: rank 0: $mnt/run/(model|state)_00000004\.bin\.[0-9a-f]{16}\.tmp: write failed: No space left on device; the checkpoint of step 2 is intact$" "$dir/out" ||
    fail "a full disk: the line must say what the system said and what was kept"
for f in model_00000002.bin state_00000002.bin; do
    cmp -s "$dir/reference/$f" "$mnt/run/$f" || fail "a full disk: $f is not what the run wrote at step 2"
done
[ -f "$mnt/run/DONE_00000002" ] || fail "a full disk: DONE_00000002 is gone"
[ -e "$mnt/run/DONE_00000004" ] && fail "a full disk: DONE_00000004 written for a checkpoint that failed"
ls "$mnt/run" | grep -q '\.tmp$' && fail "a full disk: a .tmp file was left: $(ls "$mnt/run")"
umount "$mnt"
rm -rf "$dir"
echo "ok: every checkpoint file synced before its rename, the directory after, DONE last; a full disk keeps step 2 and says why"
