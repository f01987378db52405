#!/usr/bin/env bash
# GPT-2 (124M) on FineWeb's 10B-token sample, as llm.c's run_gpt2_124M.sh: 18,865 steps of
# 524,288 tokens (one epoch, ~10B tokens); llm.c reports ~300 ms/step on 8x A100 80GB.
#
#   scripts/run_gpt2_124M.sh [ranks]    (default 8, one GPU each)
#
# The settings; scripts/run_gpt2_common.sh fetches the data and runs the resume loop.
out_dir=log_gpt2_124M         # -o: main.log, checkpoints, DONE_00018865 at the end
model=d12                     # -e: GPT-2 of depth 12: 12 heads, 768 channels
data_type=classic data_version=10B data_prefix=fineweb  # data/fineweb.py's
micro_batch=64                # -b: sequences of 1024 tokens per GPU and micro-step
tokens_per_step=524288        # -d: 512 sequences per step
lr=0.0006                     # -l: peak learning rate
warmup=700                    # -u: linear warmup steps
schedule=cosine               # -k: then cosine decay ...
final_lr_frac=0.0             # -q: ... to this fraction of the peak
weight_decay=0.1              # -c: on the 2-D weights
steps=18865                   # -x
val_every=250                 # -v: validation loss and HellaSwag every N steps
sample_every=20000 gen_len=144  # -s, -g: a text sample of 144 tokens
checkpoint_every=5000         # -n
source "$(dirname "$0")/run_gpt2_common.sh"
