#!/usr/bin/env bash
# Regenerate the tiny GPT-2 test fixtures (deterministic: same bytes every run
# on the same machine). Usage: scripts/make_fixtures.sh [OUTDIR]
set -euo pipefail
OUT="${1:-test/fixtures}"
PY="${PYTHON:-/usr/bin/python3}"
REF="$(dirname "$0")/gpt2_reference.py"
mkdir -p "$OUT"
"$PY" "$REF" --write-model "$OUT/tiny_model.bin" \
    --config L=2,NH=4,C=64,V=101,maxT=32 --seed 42
# Hyperparameters are spelled out (not left to defaults) so the fixture does
# not silently change if the script's defaults do.
"$PY" "$REF" --model "$OUT/tiny_model.bin" --out "$OUT/tiny_debug_state.bin" \
    --B 2 --T 16 --steps 10 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 \
    --weight-decay 0.1 --grad-clip 2.0 --seed 1337
