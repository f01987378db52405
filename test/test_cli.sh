#!/usr/bin/env bash
# The binary as a user runs it: `mpirun -np 1 ./train_gpt` with the defaults (two steps only),
# --help, and flag errors.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
out=$(mktemp)
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; cat "$out"; rm -rf "$out" "$dir"; exit 1; }

timeout 600 mpirun -np 1 ./train_gpt -x 2 -o "$dir" >"$out" 2>&1 || fail "default run exited $?"
grep -q "backend cpu, 1 rank(s), ZeRO stage 0 | B=4 T=64" "$out" || fail "defaults are not d12, B=4, T=64 on cpu"
grep -qE "^step    1/2 \| loss 1[01]\.[0-9]+ \(\+nanz\) \| norm [0-9.]+ \(\+nanz\) \| lr [0-9.e+-]+ \| [0-9.]+ ms \| [0-9]+ tok/s \| elapsed [0-9hms]+ \| ETA [0-9hms]+$" "$out" || fail "no step line"
grep -q "^val loss " "$out" || fail "no validation loss"
grep -q "^generating:" "$out" || fail "no text sample"
grep -q "rank 0 memory MiB: parameters 474.84" "$out" || fail "no memory report for d12"
[ "$(grep -c trl: "$dir/main.log")" -eq 2 ] || fail "log file lacks the step lines"
[ -f "$dir/model_00000002.bin" ] && [ -f "$dir/DONE_00000002" ] || fail "no final checkpoint with its DONE file"

# two processes, same seed: the same losses to the last printed digit
tiny=(-e L=2,NH=2,C=32 -b 2 -t 32 -x 4 -v 0 -s 0 -o "" --seed 7)
./train_gpt "${tiny[@]}" | grep -E "^step" | cut -d'|' -f1-3 >"$dir/a" || fail "tiny run exited $?"
./train_gpt "${tiny[@]}" | grep -E "^step" | cut -d'|' -f1-3 >"$dir/b"
[ "$(wc -l <"$dir/a")" -eq 4 ] && cmp -s "$dir/a" "$dir/b" || fail "two runs with the same seed differ"

# llm.c flags this backend cannot act on: one note each, not silence
./train_gpt "${tiny[@]}" -x 1 -w 0 -f 1 -ge 2 -pg 8 -ps 10.0.0.1 >"$out" 2>&1 || fail "llm.c flags run exited $?"
[ "$(grep -c '^note: -w: the cpu backend' "$out")" -eq 1 ] && [ "$(grep -c '^note: -f: ' "$out")" -eq 1 ] &&
    [ "$(grep -c '^note: -ge: ' "$out")" -eq 1 ] && [ "$(grep -c '^note: -pg: ' "$out")" -eq 1 ] &&
    [ "$(grep -c '^note: -ps/-pf: ' "$out")" -eq 1 ] || fail "a note line per inapplicable flag"
./train_gpt "${tiny[@]}" -x 1 -pn 4 >"$out" 2>&1; [ $? -eq 2 ] && grep -q "^error: -pn 4: mpirun started 1 rank(s)" "$out" || fail "-pn against mpirun"
# as llm.c's run_gpt2_350M.sh starts ranks: each its own -pr, which the ranks' flag check allows
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 --oversubscribe bash -c "./train_gpt -e L=2,NH=2,C=32 -b 2 -t 32 -x 1 -v 0 -s 0 -o '' -pn 2 -pr \$OMPI_COMM_WORLD_RANK" >"$out" 2>&1 ||
    fail "-pn 2 -pr <rank> exited $?"
grep -q "^step    1/1" "$out" || fail "-pn 2 -pr <rank> did not train"

# --shard-group (hybrid sharding): one line and exit 2 where it does not divide the ranks, said
# once under mpirun; `node` on one node is every rank; N ranks per group shown in the setup line
# and the bytes line, inside the group and across groups
./train_gpt "${tiny[@]}" --device cpu -x 1 -z 1 --shard-group 2 >"$out" 2>&1; [ $? -eq 2 ] && [ "$(wc -l <"$out")" -eq 1 ] &&
    grep -q "^error: --shard-group 2: expected a divisor of the 1 rank(s), each group a replica$" "$out" || fail "--shard-group 2 on one rank: exit 2, one line"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 3 --oversubscribe ./train_gpt "${tiny[@]}" --device cpu -x 1 -z 1 --shard-group 2 >"$out" 2>&1; rc=$?
[ $rc -eq 2 ] && [ "$(grep -c "^error:" "$out")" -eq 1 ] && grep -q "^error: --shard-group 2: expected a divisor of the 3 rank(s)" "$out" ||
    fail "--shard-group 2 on 3 ranks: exit $rc, expected 2 and the error said once"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 --oversubscribe ./train_gpt "${tiny[@]}" -x 1 -z 2 --shard-group node >"$out" 2>&1 || fail "--shard-group node exited $?"
grep -q "^backend cpu, 2 rank(s), ZeRO stage 2 | " "$out" && ! grep -q "across" "$out" || fail "--shard-group node on one node is not one group of every rank"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 --oversubscribe ./train_gpt "${tiny[@]}" -x 1 -z 3 --shard-group 1 >"$out" 2>&1 || fail "--shard-group 1 exited $?"
grep -q "^backend cpu, 2 rank(s), ZeRO stage 3 in 2 groups of 1 rank(s), one replica each | " "$out" &&
    [ "$(grep -c "^rank [01] bytes moved per step: inside its group of 1: .* || across the 2 groups: all-reduce [1-9][0-9]* |" "$out")" -eq 2 ] ||
    fail "--shard-group 1 on 2 ranks: setup line and bytes inside and across groups"

# --quantize-weights below stage 3: one line and exit 2
./train_gpt "${tiny[@]}" --device cpu -x 1 -z 2 --quantize-weights int8 >"$out" 2>&1; [ $? -eq 2 ] && [ "$(wc -l <"$out")" -eq 1 ] &&
    grep -q "^error: --quantize-weights int8: only stage 3 gathers parameters (-z 3); this run is -z 2$" "$out" || fail "--quantize-weights at stage 2: exit 2, one line"
# --quantize-grads at stage 0: one line and exit 2
./train_gpt "${tiny[@]}" --device cpu -x 1 -z 0 --quantize-grads int8 >"$out" 2>&1; [ $? -eq 2 ] && [ "$(wc -l <"$out")" -eq 1 ] &&
    grep -q "^error: --quantize-grads int8: stage 0 all-reduces gradients, it has no reduce-scatter to quantize; use -z 1, 2 or 3$" "$out" ||
    fail "--quantize-grads at stage 0: exit 2, one line"

# --gemm-algos (a table of cuBLASLt algorithms): a missing file, and any table on the CPU backend,
# one line and exit 2; its contents, not only its path, are in what the ranks must agree on
./train_gpt "${tiny[@]}" --device cpu -x 1 --gemm-algos "$dir/none.txt" >"$out" 2>&1; [ $? -eq 2 ] && [ "$(wc -l <"$out")" -eq 1 ] &&
    grep -q "^error: --gemm-algos $dir/none.txt: cannot open: No such file or directory (scripts/bench_gemm --write makes one)$" "$out" ||
    fail "--gemm-algos with a missing file: exit 2, one line"
mkdir -p "$dir/r0" "$dir/r1"
for r in 0 1; do printf 'gpu NVIDIA H200\nsms 132\ncublaslt 130100\nworkspace 33554432\nprecision bf16\ngemm 8 8 8 8 8 8 1 0 BIAS 16 %d:1:1:1:0:0:0:0:0\n' "$r" >"$dir/r$r/t.txt"; done
./train_gpt "${tiny[@]}" --device cpu -x 1 --gemm-algos "$dir/r0/t.txt" >"$out" 2>&1; [ $? -eq 2 ] && [ "$(wc -l <"$out")" -eq 1 ] &&
    grep -q "^error: --gemm-algos $dir/r0/t.txt: a table of cuBLASLt's algorithms, for --device cuda; this run is on the CPU backend$" "$out" ||
    fail "--gemm-algos on the CPU backend: exit 2, one line"
OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 --oversubscribe bash -c "cd $dir/r\$OMPI_COMM_WORLD_RANK && $PWD/train_gpt -e L=2,NH=2,C=32 -b 2 -t 32 -x 1 -v 0 -s 0 -o '' --device cpu -i $PWD/data/tinyshakespeare/tiny_shakespeare_train.bin --gemm-algos t.txt" >"$out" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "^error: rank 1: flags, model or data differ from rank 0's" "$out" ||
    fail "--gemm-algos tables that differ between ranks at one path: exit $rc, expected the ranks' disagreement"

# --fp8 e4m3: the CPU backend runs it (emulated), its copies in the memory line; at a B*T that
# fp8 GEMMs cannot take, a note says the matmuls run without it; a CUDA build without the fp8 path
# (this default build: the path is a KERNELS=candidate one) says so in one line, exit 2, also for
# --plan, which needs no GPU
./train_gpt "${tiny[@]}" --device cpu -x 2 --fp8 e4m3 >"$out" 2>&1 || fail "--fp8 e4m3 on the CPU exited $?"
[ "$(grep -c '^step' "$out")" -eq 2 ] && grep -q "^rank 0 memory MiB: .* | fp8 copies [0-9.]* | " "$out" || fail "--fp8 e4m3 on the CPU: two steps and fp8 copies in the memory line"
./train_gpt "${tiny[@]}" --device cpu -x 1 -b 1 -t 30 --fp8 e4m3 >"$out" 2>&1 || fail "--fp8 e4m3 at B*T=30 exited $?"
grep -q "^note: --fp8: fp8 GEMMs need B\*T and C multiples of 16 (B\*T=30, C=32): the matmuls run as without --fp8$" "$out" || fail "--fp8 at B*T=30: no note"
./train_gpt --plan --device cuda --device-memory 80GiB --fp8 e4m3 >"$out" 2>&1; rc=$?
if ! grep -q "built without CUDA" "$out"; then
    [ $rc -eq 2 ] && [ "$(wc -l <"$out")" -eq 1 ] && grep -q "^error: --fp8 e4m3: the CUDA fp8 path is a candidate no GPU has run yet, built only with KERNELS=candidate" "$out" ||
        fail "--fp8 e4m3 in the default CUDA build: exit $rc, expected 2 and one line"
fi

./train_gpt --help >"$out" 2>&1 || fail "--help exited $?"
grep -q "^  -z  --zero" "$out" || fail "--help lacks -z"
./train_gpt -b 0 >"$out" 2>&1; [ $? -eq 2 ] || fail "-b 0 did not exit 2"
[ "$(wc -l <"$out")" -eq 1 ] || fail "-b 0 printed more than one line"
./train_gpt --device cuda -x 1 >"$out" 2>&1; [ $? -eq 2 ] || fail "--device cuda without CUDA did not exit 2"
# --offload cpu where this rank's host state cannot fit (GPT-3 175B on one rank: 12 bytes of
# optimizer state and 4 of staging per parameter): one line with the bytes, before any training
./train_gpt --device cpu -e gpt3:c12288 --offload cpu -x 1 -o "" >"$out" 2>&1; [ $? -eq 1 ] || fail "--offload cpu for 175B did not exit 1"
psi=$(( 50304 * 12288 + 2048 * 12288 + 96 * (12 * 12288 * 12288 + 13 * 12288) + 2 * 12288 ))
need=$(awk "BEGIN { printf \"%.2f GiB\", 16 * $psi / 2^30 }")
[ "$(wc -l <"$out")" -eq 1 ] && grep -qE "^error: host memory: 1 rank\(s\) on this node need $need \(rank 0: optimizer .*, staging .*\), [0-9.]+ GiB available on this machine: does not fit; use more ranks at -z 1 or above .* or --offload none$" "$out" ||
    fail "--offload cpu without the host memory: one line with the bytes needed and available"
./train_gpt -e /nonexistent.bin -x 1 >"$out" 2>&1; [ $? -eq 1 ] || fail "missing checkpoint did not exit 1"
grep -q "error: cannot open /nonexistent.bin" "$out" || fail "missing checkpoint message"
rm -rf "$out" "$dir"
echo "ok"
