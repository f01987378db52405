#!/usr/bin/env bash
# Regenerate the tiny GPT-2 test fixtures (computed in float64, so other machines
# reproduce them to fp32 rounding: see compare_fixtures.py).
# Usage: scripts/make_fixtures.sh [OUTDIR]
set -euo pipefail
OUT="${1:-test/fixtures}"
PY="${PYTHON:-/usr/bin/python3}"
REF="$(dirname "$0")/gpt2_reference.py"
mkdir -p "$OUT"
"$PY" "$REF" --write-model "$OUT/tiny_model.bin" \
    --config L=2,NH=4,C=64,V=101,maxT=32 --seed 42
# Hyperparameters are spelled out (not left to defaults) so the fixture does
# not silently change if the script's defaults do. eps is 1e-4, not llm.c's 1e-8:
# AdamW's step m/(sqrt(v)+eps) moves by at most ~2*dg/eps when a gradient moves by
# dg, so the ~1e-7 by which an fp32 backend's gradients differ from these fp64 ones
# (any BLAS kernel) moves a parameter by at most 2*lr*steps*1e-7/eps = 2e-5 over the
# 10 steps, the tolerance test/test_model.cpp allows. With eps = 1e-8 a gradient
# below that noise (the key biases' is exactly 0, some weights' ~5e-8) would become
# steps of up to lr, and the parameters after training would be rounding noise.
"$PY" "$REF" --model "$OUT/tiny_model.bin" --out "$OUT/tiny_debug_state.bin" \
    --B 2 --T 16 --steps 10 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-4 \
    --weight-decay 0.1 --grad-clip 2.0 --seed 1337
# The same with gradient accumulation: 3 micro-batches of 2 per step, cut from one stream of
# 3*2*16+1 tokens as the trainer's data loader cuts a shard (test/test_model.cpp trains on it).
# Its norms, of a mean over 3x the tokens, fall from ~1.8 to ~1.1: clipping at 1.4 makes the
# first steps clip and the later ones not.
"$PY" "$REF" --model "$OUT/tiny_model.bin" --out "$OUT/tiny_debug_state_accum3.bin" \
    --B 2 --T 16 --accum 3 --steps 10 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-4 \
    --weight-decay 0.1 --grad-clip 1.4 --seed 1337
