#!/usr/bin/env bash
# GPT-2 (774M) on FineWeb's 100B-token sample, as llm.c's run_gpt2_774M.sh: 286,102 steps of
# 524,288 tokens (~150B tokens); llm.c reports ~1.7 s/step on 8x A100 80GB.
#
#   scripts/run_gpt2_774M.sh [ranks]    (default 8, one GPU each)
#
# The settings; scripts/run_gpt2_common.sh fetches the data and runs the resume loop.
out_dir=log_gpt2_774M         # -o: main.log, checkpoints, DONE_00286102 at the end
model=d36                     # -e: GPT-2 of depth 36: 20 heads, 1280 channels
data_type=classic data_version=100B data_prefix=fineweb # data/fineweb.py's
micro_batch=32                # -b: sequences of 1024 tokens per GPU and micro-step
tokens_per_step=524288        # -d: 512 sequences per step
lr=0.00025                    # -l: peak learning rate
warmup=700                    # -u: linear warmup steps
schedule=cosine               # -k: then cosine decay ...
final_lr_frac=0.0             # -q: ... to this fraction of the peak
weight_decay=0.1              # -c: on the 2-D weights
steps=286102                  # -x
val_every=250                 # -v: validation loss and HellaSwag every N steps
sample_every=300000 gen_len=144  # -s, -g: a text sample of 144 tokens
checkpoint_every=4000         # -n
source "$(dirname "$0")/run_gpt2_common.sh"
