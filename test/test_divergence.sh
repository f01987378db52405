#!/usr/bin/env bash
# A diverged run does not destroy the good checkpoints, as a user meets it (train/nonfinite.h):
# 1. a model file with a NaN parameter is refused on load: one line naming the tensor and index;
# 2. a model whose activations overflow (finite weights, one MLP matrix scaled by 2^100) under
#    mpirun, resumed from a good checkpoint: every step skipped and said so, then exit code 3
#    with one line, the good checkpoint and its DONE file untouched and no new one written;
# 3. scripts/resume_loop.sh starts a trainer that exits 3 (such a stop) or 2 (a usage error)
#    once, and ends with that code.
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; cat "$dir/out" 2>/dev/null; rm -rf "$dir"; exit 1; }
# tokens of its own (llm.c's shard format), so that it runs where make data has not (the GPU machine)
python3 -c "
import sys, numpy as np; sys.path.insert(0, 'data')
from data_common import write_token_shard
write_token_shard('$dir/tokens.bin', np.random.default_rng(0).integers(0, 50257, 1 << 16))" || fail "cannot write a token shard"
TINY=(-b 2 -t 16 -v 0 -s 0 --seed 5 -i "$dir/tokens.bin" -j "$dir/tokens.bin")

# a good checkpoint at step 2, and two damaged copies of its model file (numpy as the data scripts use)
./train_gpt -e L=2,NH=2,C=32 "${TINY[@]}" -x 2 -o "$dir/good" >"$dir/out" 2>&1 || fail "good run exited $?"
python3 - "$dir/good/model_00000002.bin" "$dir" <<'EOF' || fail "cannot write the damaged model files"
import sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
header = np.frombuffer(raw, np.int32, 256)
maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
# llm.c's versions: 3 fp32 parameters (CPU and fp32 builds), 5 bf16 (the bf16 CUDA build)
bf16 = int(header[1]) == 5
stored = np.frombuffer(raw, np.uint16 if bf16 else np.float32, offset=1024)
params = (stored.astype(np.uint32) << 16).view(np.float32) if bf16 else stored.copy()
def save(name, values):
    out = (values.view(np.uint32) >> 16).astype(np.uint16) if bf16 else values  # exact: only whole bf16 values change
    open(sys.argv[2] + name, "wb").write(raw[:1024] + out.tobytes())
sizes = [Vp * C, maxT * C] + [L * n for n in (C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C)] + [C, C]
fc = sum(sizes[:10])  # mlp.c_fc.weight, every layer's
nan = params.copy()
nan[fc + sizes[10] // L + 904] = np.nan  # layer 1, its value 904
save("/nan.bin", nan)
params[fc:fc + sizes[10]] *= np.float32(2.0 ** 100)  # about 1.3e30, a power of two: exact in bf16 too
save("/overflow.bin", params)
EOF

# 1. the NaN parameter
./train_gpt -e "$dir/nan.bin" "${TINY[@]}" -x 1 -o "" >"$dir/stdout" 2>"$dir/out"
code=$?
[ $code -eq 1 ] || fail "NaN parameter: exit code $code, expected 1"
[ "$(wc -l <"$dir/out")" -eq 1 ] &&
    grep -qE "^error: rank 0: $dir/nan.bin: parameter h\.1\.mlp\.c_fc\.weight\[904\] \(value [0-9]+ of [0-9]+\) is nan; " "$dir/out" ||
    fail "NaN parameter: one line naming the tensor and index expected"

# 2. overflowing activations, resumed from the good checkpoint (the state is the good run's)
cp -r "$dir/good" "$dir/run"
cp "$dir/overflow.bin" "$dir/run/model_00000002.bin"
timeout 120 mpirun -np 1 ./train_gpt -e L=2,NH=2,C=32 "${TINY[@]}" -x 20 -n 1 -nk 1 -y 1 --nonfinite-limit 3 -o "$dir/run" >"$dir/stdout" 2>"$dir/out"
code=$?
[ $code -eq 3 ] || fail "diverged run: exit code $code, expected 3"
[ "$(grep -c '^skipping update: loss .* not finite' "$dir/stdout")" -eq 3 ] || fail "diverged run: 3 skipped steps, each said, expected"
[ "$(grep -c '^error: ' "$dir/out")" -eq 1 ] &&
    grep -qE "^error: step 5: 3 step\(s\) in a row with a non-finite loss or gradient norm \(--nonfinite-limit 3\); stopping with exit code 3 and no checkpoint of this state: the checkpoint of step 2 is intact$" "$dir/out" ||
    fail "diverged run: its one line"
[ "$(ls "$dir/run" | grep -vx main.log | paste -sd' ')" = "DONE_00000002 model_00000002.bin state_00000002.bin" ] ||
    fail "diverged run: the directory holds $(ls "$dir/run" | paste -sd' ')"
cmp -s "$dir/run/model_00000002.bin" "$dir/overflow.bin" && cmp -s "$dir/run/state_00000002.bin" "$dir/good/state_00000002.bin" ||
    fail "diverged run: the checkpoint of step 2 changed"

# 3. resume_loop.sh: a stand-in trainer counts its starts and exits with the given code
printf '#!/usr/bin/env bash\necho start >>"%s/starts"\nexit "$1"\n' "$dir" >"$dir/trainer"
chmod +x "$dir/trainer"
for code in 3 2; do
    rm -f "$dir/starts"
    MAX_STARTS=3 timeout 60 bash scripts/resume_loop.sh "$dir/loop" 10 "$dir/trainer" "$code" >"$dir/out" 2>&1
    loop_code=$?
    [ "$(wc -l <"$dir/starts")" -eq 1 ] || fail "resume_loop.sh started a trainer that exited $code $(wc -l <"$dir/starts") times"
    [ $loop_code -eq "$code" ] || fail "resume_loop.sh exited $loop_code after a trainer's $code"
done
# and with train_gpt itself: a bad flag under mpirun, as the run scripts start it
MAX_STARTS=3 timeout 60 bash scripts/resume_loop.sh "$dir/loop" 10 mpirun -np 1 ./train_gpt -b 0 >"$dir/out" 2>&1
loop_code=$?
[ $loop_code -eq 2 ] && [ "$(grep -c '^error: -b 0' "$dir/out")" -eq 1 ] || fail "resume_loop.sh with -b 0: exit $loop_code, expected 2 after one start"
rm -rf "$dir"
echo "ok: a NaN parameter refused, a diverged run stopped with exit 3 keeping step 2, resume_loop.sh stops on 3 and 2"
