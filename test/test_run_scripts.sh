#!/usr/bin/env bash
# scripts/run_gpt2_<size>.sh on a fresh checkout prepare everything their trainer's flags use
# before starting it: the train and val shards (-i, -j), HellaSwag (-h 1) and, for the text
# samples (-s), the tokenizer; a second start prepares nothing again. The expensive steps are
# stand-ins on the PATH that write the files the real ones write: python3 (the data scripts),
# make (train_gpt, data) and mpirun; the stand-in trainer checks what its flags name, as
# train_gpt does, and writes the DONE file of the last step.
set -u
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; cat "$dir/out" 2>/dev/null; rm -rf "$dir"; exit 1; }
mkdir -p "$dir/bin" "$dir/fresh"
cp -r scripts "$dir/fresh/"
export CALLS=$dir/calls MAX_STARTS=1

cat >"$dir/bin/python3" <<'EOF'
#!/usr/bin/env bash
echo "python3 $*" >>"$CALLS"
shard() { mkdir -p "$(dirname "$1")" && echo x >"$1"; }
case "$1" in
    data/fineweb.py)  # --type edu|classic --version 10B|100B
        prefix=$([ "$3" = edu ] && echo edu_fineweb || echo fineweb)
        shard "data/$prefix$5/${prefix}_val_000000.bin" && shard "data/$prefix$5/${prefix}_train_000001.bin" ;;
    data/hellaswag.py) shard data/hellaswag/hellaswag_val.bin ;;
    data/tinyshakespeare.py)
        for f in tiny_shakespeare_train.bin tiny_shakespeare_val.bin gpt2_tokenizer.bin; do shard "data/tinyshakespeare/$f"; done ;;
    *) echo "stand-in python3: unexpected $*"; exit 1 ;;
esac
EOF
cat >"$dir/bin/make" <<'EOF'
#!/usr/bin/env bash
echo "make $*" >>"$CALLS"
case "$*" in
    train_gpt) cp "$(dirname "$0")/trainer" train_gpt ;;
    data) python3 data/tinyshakespeare.py ;;  # the Makefile's rule
    *) echo "stand-in make: unexpected $*"; exit 1 ;;
esac
EOF
cat >"$dir/bin/mpirun" <<'EOF'
#!/usr/bin/env bash
shift 2  # -np N
exec "$@"
EOF
cat >"$dir/bin/trainer" <<'EOF'
#!/usr/bin/env bash
tokenizer=data/tinyshakespeare/gpt2_tokenizer.bin hellaswag_file=data/hellaswag/hellaswag_val.bin samples=0 hellaswag=0
while [ $# -gt 1 ]; do
    case "$1" in
        -i | -j) ls $2 >/dev/null 2>&1 || { echo "trainer: no file matches $1 $2"; exit 1; } ;;
        -s) samples=$2 ;;
        -h) hellaswag=$2 ;;
        --tokenizer) tokenizer=$2 ;;
        --hellaswag-file) hellaswag_file=$2 ;;
        -o) out=$2 ;;
        -x) steps=$2 ;;
    esac
    shift 2
done
[ "$samples" -le 0 ] || [ -f "$tokenizer" ] || { echo "trainer: no tokenizer at $tokenizer: no text samples"; exit 1; }
[ "$hellaswag" -eq 0 ] || [ -f "$hellaswag_file" ] || { echo "trainer: no HellaSwag file $hellaswag_file"; exit 1; }
mkdir -p "$out" && touch "$(printf "%s/DONE_%08d" "$out" "$steps")"
EOF
chmod +x "$dir/bin/"*
export PATH=$dir/bin:$PATH

for size in 124M 350M 774M 1558M; do
    rm -rf "$dir/fresh/data" "$dir/fresh/log_gpt2_$size" "$dir/fresh/train_gpt" "$CALLS"
    bash "$dir/fresh/scripts/run_gpt2_$size.sh" 1 >"$dir/out" 2>&1 || fail "run_gpt2_$size.sh exited $? on a fresh checkout"
    ls "$dir/fresh/log_gpt2_$size"/DONE_* >/dev/null 2>&1 || fail "run_gpt2_$size.sh: the trainer did not run to its end"
    for script in fineweb hellaswag tinyshakespeare; do
        [ "$(grep -c "^python3 data/$script.py" "$CALLS")" -eq 1 ] || fail "run_gpt2_$size.sh: data/$script.py not run once: $(cat "$CALLS")"
    done
done
# everything there: a second start only builds and trains
rm -rf "$dir/fresh/log_gpt2_1558M" "$CALLS"
bash "$dir/fresh/scripts/run_gpt2_1558M.sh" 1 >"$dir/out" 2>&1 || fail "second start exited $?"
[ "$(cat "$CALLS")" = "make train_gpt" ] || fail "second start prepared again: $(cat "$CALLS")"
rm -rf "$dir"
echo "ok"
