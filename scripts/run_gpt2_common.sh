# The part the scripts/run_gpt2_<size>.sh share, sourced after they set the size's settings:
# the data, the build, and llm.c's loop (scripts/resume_loop.sh) around the trainer, which
# restarts it with -y 1 until the DONE file of the last step exists. Flags as in llm.c's scripts.
set -eu
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ranks=${1:-8}  # one GPU each; fewer ranks keep the tokens per step (more accumulation)
data_dir=data/${data_prefix}${data_version}

# what the flags below use, made once: the FineWeb sample tokenized with GPT-2's tokenizer (-i,
# -j), HellaSwag (-h 1), and for the text samples (-s) the GPT-2 tokenizer at train_gpt's
# default --tokenizer path, which `make data` writes with Tiny Shakespeare
[ -n "$(ls "$data_dir/${data_prefix}"_train_*.bin 2>/dev/null)" ] && [ -n "$(ls "$data_dir/${data_prefix}"_val_*.bin 2>/dev/null)" ] ||
    python3 data/fineweb.py --type "$data_type" --version "$data_version"
[ -f data/hellaswag/hellaswag_val.bin ] || python3 data/hellaswag.py
[ "$sample_every" -le 0 ] || [ -f data/tinyshakespeare/gpt2_tokenizer.bin ] || make data
make train_gpt

# -h 1: HellaSwag with every validation; -t 1024: GPT-2's context; -r 0: no recompute;
# -z 1: ZeRO-1 (optimizer state sharded); -y 1: continue from the last complete checkpoint
scripts/resume_loop.sh "$out_dir" "$steps" \
    mpirun -np "$ranks" ./train_gpt \
        -i "$data_dir/${data_prefix}_train_*.bin" \
        -j "$data_dir/${data_prefix}_val_*.bin" \
        -o "$out_dir" \
        -v "$val_every" -s "$sample_every" -g "$gen_len" \
        -h 1 \
        -b "$micro_batch" -t 1024 \
        -d "$tokens_per_step" \
        -r 0 \
        -z 1 \
        -c "$weight_decay" \
        -k "$schedule" \
        -l "$lr" \
        -q "$final_lr_frac" \
        -u "$warmup" \
        -n "$checkpoint_every" \
        -x "$steps" \
        -y 1 \
        -e "$model"
