#!/usr/bin/env bash
# GPT-2 (774M) on FineWeb (100B sample), as llm.c's run_gpt2_774M.sh:
# 286,102 steps of 524,288 tokens (~150B tokens); llm.c reports ~1.7 s/step on 8x A100 80GB.
#
#   scripts/run_gpt2_774M.sh [ranks]     (default 8, one GPU each; the tokens per step stay
#                                      524,288, accumulation makes up for fewer ranks)
#
# The loop (scripts/resume_loop.sh) restarts the trainer with -y 1 until DONE_00286102 exists.
set -eu
cd "$(dirname "$0")/.."
ranks=${1:-8}
out_dir=log_gpt2_774M

# data, once: FineWeb 100B tokenized with GPT-2's tokenizer into data/fineweb100B/
[ -n "$(ls data/fineweb100B/fineweb_train_*.bin 2>/dev/null)" ] || python3 data/fineweb.py --type classic --version 100B
# HellaSwag for -h 1 (llm.c's eval file)
[ -f data/hellaswag/hellaswag_val.bin ] || python3 data/hellaswag.py
make train_gpt

# -b 32 sequences of -t 1024 per GPU and micro-step, -d 524288 tokens per step
# -l 0.00025 peak lr, -u 700 warmup steps, decay to -q 0.0 of the peak, -c 0.1 weight decay
# -x 286102 steps; -v 250: validation loss and HellaSwag every 250 steps; -s 300000 -g 144: a text sample
# -n 4000: checkpoint every 4000 steps; -z 1: ZeRO-1 (optimizer state sharded); -r 0: no recompute
# -y 1: resume from the last complete checkpoint, if any
scripts/resume_loop.sh "$out_dir" 286102 \
    mpirun -np "$ranks" ./train_gpt \
        -i "data/fineweb100B/fineweb_train_*.bin" \
        -j "data/fineweb100B/fineweb_val_*.bin" \
        -o "$out_dir" \
        -v 250 -s 300000 -g 144 \
        -h 1 \
        -b 32 -t 1024 \
        -d 524288 \
        -r 0 \
        -z 1 \
        -c 0.1 \
        -l 0.00025 \
        -q 0.0 \
        -u 700 \
        -n 4000 \
        -x 286102 \
        -y 1 \
        -e d36
