#!/usr/bin/env bash
# GPT-2 (1558M) on FineWeb-Edu (100B sample), as llm.c's run_gpt2_1558M.sh:
# 32,000 steps of 1,048,576 tokens (~32B tokens); llm.c reports ~2.8 s/step on 8x H100 80GB.
#
#   scripts/run_gpt2_1558M.sh [ranks]     (default 8, one GPU each; the tokens per step stay
#                                      1,048,576, accumulation makes up for fewer ranks)
#
# The loop (scripts/resume_loop.sh) restarts the trainer with -y 1 until DONE_00032000 exists.
set -eu
cd "$(dirname "$0")/.."
ranks=${1:-8}
out_dir=log_gpt2_1558M

# data, once: FineWeb-Edu 100B tokenized with GPT-2's tokenizer into data/edu_fineweb100B/
[ -n "$(ls data/edu_fineweb100B/edu_fineweb_train_*.bin 2>/dev/null)" ] || python3 data/fineweb.py --type edu --version 100B
# HellaSwag for -h 1 (llm.c's eval file)
[ -f data/hellaswag/hellaswag_val.bin ] || python3 data/hellaswag.py
make train_gpt

# -b 16 sequences of -t 1024 per GPU and micro-step, -d 1048576 tokens per step
# -l 0.0006 peak lr, -u 700 warmup steps, -k cosine decay to -q 0.1 of the peak, -c 0.1 weight decay
# -x 32000 steps; -v 250: validation loss and HellaSwag every 250 steps; -s 300000 -g 384: a text sample
# -n 2000: checkpoint every 2000 steps; -z 1: ZeRO-1 (optimizer state sharded); -r 0: no recompute
# -y 1: resume from the last complete checkpoint, if any
scripts/resume_loop.sh "$out_dir" 32000 \
    mpirun -np "$ranks" ./train_gpt \
        -i "data/edu_fineweb100B/edu_fineweb_train_*.bin" \
        -j "data/edu_fineweb100B/edu_fineweb_val_*.bin" \
        -o "$out_dir" \
        -v 250 -s 300000 -g 384 \
        -h 1 \
        -b 16 -t 1024 \
        -d 1048576 \
        -r 0 \
        -z 1 \
        -c 0.1 \
        -k cosine \
        -l 0.0006 \
        -q 0.1 \
        -u 700 \
        -n 2000 \
        -x 32000 \
        -y 1 \
        -e d48
