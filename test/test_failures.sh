#!/usr/bin/env bash
# A rank that disagrees, errors or dies must end the whole job with a clear message, in bounded
# time, never a hang.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
ARGS=(-e L=1,NH=2,C=32 -b 2 -t 16 -v 0 -s 0 -o "" -x 3)
out=$(mktemp)
fail() { echo "FAIL: $*"; cat "$out"; rm -f "$out"; exit 1; }

# RANK0_FLAGS RANK1_FLAGS WHAT: rank 0 and rank 1 given different flags (split at spaces): the job
# exits non-zero, without hanging, and rank 1 says its flags differ
mismatch() {
    timeout 60 mpirun -np 1 ./train_gpt "${ARGS[@]}" $1 : -np 1 ./train_gpt "${ARGS[@]}" $2 >"$out" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$3: exit code $rc (124 means it hung)"
    grep -q "rank 1: flags, model or data differ from rank 0's" "$out" || fail "rank 1 did not report the $3"
}

# 1. ranks given different flags: every rank says so and the job exits non-zero
mismatch "-b 2" "-b 4" "config mismatch"
grep -q "rank 0: another rank's flags, model or data differ" "$out" || fail "rank 0 did not report the mismatch"
# ... also when a float flag differs past its 6th digit (every bit of it counts)
mismatch "-l 0.0003" "-l 0.0003000001" "-l mismatch past the 6th digit"
# ... also when a flag decides a collective of its own (-b auto's agreement on B): compared before it
mismatch "-b auto" "-b 2" "-b auto on one rank only"
# ... also when they differ in how they shard (hybrid sharding): caught before any group is made
mismatch "-z 1 --shard-group 1" "-z 1" "--shard-group mismatch"
mismatch "-z 3 --quantize-weights int8" "-z 3" "--quantize-weights mismatch"
mismatch "-z 2 --quantize-grads int8" "-z 2" "--quantize-grads mismatch"

# 2. one rank fails to start (the same flags, but its data is missing: a relative -i, each rank in
# a directory of its own, rank 1's empty): the others do not wait for it
work=$(mktemp -d)
mkdir "$work/r0" "$work/r1"
ln -s "$PWD/data/tinyshakespeare/tiny_shakespeare_train.bin" "$work/r0/shard_0.bin"
timeout 60 mpirun -np 2 --oversubscribe bash -c "cd $work/r\$OMPI_COMM_WORLD_RANK && $PWD/train_gpt $(printf '%q ' "${ARGS[@]}") -i 'shard_*.bin'" >"$out" 2>&1
rc=$?
rm -rf "$work"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "missing data on rank 1: exit code $rc (124 means it hung)"
grep -q "error: no token shard matches shard_\*.bin" "$out" || fail "no clear message for the missing data"

# 3. one rank is killed mid-run: the job ends within 30 s
timeout 120 mpirun -np 2 ./train_gpt -e L=1,NH=2,C=32 -b 2 -t 16 -v 0 -s 0 -o "" -x 100000 >"$out" 2>&1 &
job=$!
for _ in $(seq 100); do grep -q "step    2/" "$out" && break; sleep 0.3; done
grep -q "step    2/" "$out" || fail "the 2-rank job did not start training"
victim=$(pgrep -f "^./train_gpt -e L=1,NH=2,C=32" | tail -1)  # a rank, not mpirun
kill -9 "$victim"
start=$SECONDS
wait $job
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "killed rank: exit code $rc (124 means it hung)"
[ $((SECONDS - start)) -le 30 ] || fail "killed rank: the job took $((SECONDS - start)) s to end"
# 4. -y 1 where the ranks' output directories differ (-o on each node's own disk; here each rank
#    runs in a directory of its own and -o is relative): rank 0's latest checkpoint is the one
#    resumed, by every rank or by none; a rank that cannot read it stops the job, before training,
#    with one line naming the rank, its host and the file
dir=$(mktemp -d)
tg=$PWD/train_gpt
DATA=(-i "$PWD/data/tinyshakespeare/tiny_shakespeare_train.bin" -j "$PWD/data/tinyshakespeare/tiny_shakespeare_val.bin")
RESUME=(-e L=1,NH=2,C=32 -b 2 -t 16 -v 0 -s 0 "${DATA[@]}" -o out -n 3)
mkdir -p "$dir/a" "$dir/b" "$dir/c" "$dir/d" "$dir/shared"
(cd "$dir/a" && timeout 60 mpirun -np 2 --oversubscribe "$tg" "${RESUME[@]}" -x 6 >"$out" 2>&1) || fail "the 2-rank run to resume from exited $?"
(cd "$dir/c" && timeout 60 mpirun -np 2 --oversubscribe "$tg" "${RESUME[@]}" -x 3 >"$out" 2>&1) || fail "the older 2-rank run exited $?"
cp -r "$dir/a/out" "$dir/shared/out"
cp -r "$dir/a/out" "$dir/d/out"
rm "$dir/d/out/state_00000006.bin"
for other in b c d; do  # rank 1's -o: empty, holding an older checkpoint (step 3), or step 6's model without its state
    file=model
    [ $other = d ] && file=state
    timeout 60 mpirun -np 1 --wdir "$dir/shared" "$tg" "${RESUME[@]}" -x 8 -y 1 : -np 1 --wdir "$dir/$other" "$tg" "${RESUME[@]}" -x 8 -y 1 >"$out" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "-y 1, rank 1's -o in $other: exit code $rc (124 means it hung)"
    grep -q "^error: -y 1: rank 1 on [^ ]* cannot read out/${file}_00000006.bin (No such file or directory), the checkpoint of step 6 that rank 0 resumes from; -y 1 needs the output directory (-o) on a file system every rank reads$" "$out" ||
        fail "-y 1, rank 1's -o in $other: no line naming rank 1 and the ${file} file it cannot read"
    grep -q "^step " "$out" && fail "-y 1, rank 1's -o in $other: trained before stopping"
done
# the same directory seen by both (a shared file system): both resume at step 6, as one run would
ln -s "$dir/shared/out" "$dir/b/out"
timeout 60 mpirun -np 1 --wdir "$dir/shared" "$tg" "${RESUME[@]}" -x 8 -y 1 : -np 1 --wdir "$dir/b" "$tg" "${RESUME[@]}" -x 8 -y 1 >"$out" 2>&1 ||
    fail "-y 1 from a shared -o exited $?"
grep -q "^resuming from step 6 of out" "$out" && grep -q "^step    8/8" "$out" || fail "-y 1 from a shared -o: did not resume at step 6"
(cd "$dir/a" && timeout 60 mpirun -np 2 --oversubscribe "$tg" "${RESUME[@]}" -x 8 -y 1 >"$out" 2>&1) || fail "-y 1 in one directory exited $?"
cmp -s "$dir/a/out/model_00000008.bin" "$dir/shared/out/model_00000008.bin" || fail "-y 1 from a shared -o: a model other than one directory's resume"
# a checkpoint past the run's last step (-x): one line, exit 2, no step taken (llm.c's loop would run on for good)
(cd "$dir/a" && timeout 60 mpirun -np 2 --oversubscribe "$tg" "${RESUME[@]}" -x 5 -y 1 >"$out" 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "-y 1 from step 8 with -x 5: exit code $rc, expected 2 (124 means it hung)"
grep -q "^error: -y 1: the latest checkpoint in out is of step 8, past this run's 5 steps; give -x 8 or more, or another -o$" "$out" ||
    fail "-y 1 from step 8 with -x 5: no line saying the checkpoint is past the run's steps"
grep -q "^step " "$out" && fail "-y 1 from step 8 with -x 5: trained"
rm -rf "$dir"

rm -f "$out"
echo "ok: mismatch, missing data, a killed rank, ranks that cannot read rank 0's checkpoint and a checkpoint past -x all end the job"
