#!/usr/bin/env bash
# llm.c's run-script loop in small: a tiny GPT-2 on Tiny Shakespeare on the CPU backend, about
# a minute on two cores. Whenever the trainer stops before the end (crash, kill, lost node), the
# loop (scripts/resume_loop.sh) starts it again with -y 1, which continues from the last complete
# checkpoint; the DONE file of the last step ends the loop.
#
#   scripts/run_tiny.sh [ranks]      (default 1; the tokens per step stay the same)
#
# Environment, for shorter runs (the test suite's kill test): OUT_DIR, STEPS, CKPT_EVERY, MODEL,
# B, T, VAL_EVERY, SAMPLE_EVERY; MAX_STARTS (see scripts/resume_loop.sh).
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ranks=${1:-1}
out_dir=${OUT_DIR:-log_tiny}
steps=${STEPS:-200}
ckpt_every=${CKPT_EVERY:-50}
model=${MODEL:-L=2,NH=4,C=64}
B=${B:-4}
T=${T:-64}
val_every=${VAL_EVERY:-50}
sample_every=${SAMPLE_EVERY:-100}

# data: Tiny Shakespeare shards and the GPT-2 tokenizer (make data; from ../shared/data when present)
[ -f data/tinyshakespeare/tiny_shakespeare_train.bin ] || make data || exit 1
[ -x ./train_gpt ] || make train_gpt || exit 1

# 4 sequences of T tokens per rank and micro-step, 1024 tokens per step in all (ranks x
# accumulation: 1, 2 or 4 ranks); lr warmup then cosine decay to a tenth; a checkpoint every
# CKPT_EVERY steps, the last two kept (and those at multiples of 100); one thread per rank
# when there are several
OMP_NUM_THREADS=$((ranks > 1 ? 1 : $(nproc))) scripts/resume_loop.sh "$out_dir" "$steps" \
    mpirun -np "$ranks" --oversubscribe ./train_gpt \
        -i data/tinyshakespeare/tiny_shakespeare_train.bin \
        -j data/tinyshakespeare/tiny_shakespeare_val.bin \
        -o "$out_dir" \
        -e "$model" -b "$B" -t "$T" -d $((B * T * 4)) \
        -x "$steps" -l 0.003 -u 10 -q 0.1 -c 0.1 \
        -v "$val_every" -m 4 -s "$sample_every" -g 32 \
        -n "$ckpt_every" -nk 2 -nm 100 \
        -y 1 --device cpu
