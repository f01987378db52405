#!/usr/bin/env bash
# GPT-2 (1558M) on FineWeb-Edu's 100B-token sample, as llm.c's run_gpt2_1558M.sh: 32,000
# steps of 1,048,576 tokens (~32B tokens); llm.c reports ~2.8 s/step on 8x H100 80GB.
#
#   scripts/run_gpt2_1558M.sh [ranks]    (default 8, one GPU each)
#
# The settings; scripts/run_gpt2_common.sh fetches the data and runs the resume loop.
out_dir=log_gpt2_1558M        # -o: main.log, checkpoints, DONE_00032000 at the end
model=d48                     # -e: GPT-2 of depth 48: 25 heads, 1600 channels
data_type=edu data_version=100B data_prefix=edu_fineweb # data/fineweb.py's
micro_batch=16                # -b: sequences of 1024 tokens per GPU and micro-step
tokens_per_step=1048576       # -d: 1024 sequences per step
lr=0.0006                     # -l: peak learning rate
warmup=700                    # -u: linear warmup steps
schedule=cosine               # -k: then cosine decay ...
final_lr_frac=0.1             # -q: ... to this fraction of the peak
weight_decay=0.1              # -c: on the 2-D weights
steps=32000                   # -x
val_every=250                 # -v: validation loss and HellaSwag every N steps
sample_every=300000 gen_len=384  # -s, -g: a text sample of 384 tokens
checkpoint_every=2000         # -n
source "$(dirname "$0")/run_gpt2_common.sh"
