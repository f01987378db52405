#!/usr/bin/env bash
# The committed PyTorch fixtures are what scripts/make_fixtures.sh computes, on this machine as
# on the one that wrote them; and the comparison is sharp enough to fail when a fixture value is
# edited by hand or the reference's maths changes (here: GELU's cubic constant).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
committed=test/fixtures/tiny_debug_state.bin

bash scripts/make_fixtures.sh "$d/regen" >/dev/null
cmp test/fixtures/tiny_model.bin "$d/regen/tiny_model.bin"
"$PY" scripts/compare_fixtures.py "$committed" "$d/regen/tiny_debug_state.bin"
"$PY" scripts/compare_fixtures.py test/fixtures/tiny_debug_state_accum3.bin "$d/regen/tiny_debug_state_accum3.bin"

# one parameter after training, 1e-6 larger in relative terms (8 ulp)
"$PY" - "$committed" "$d/edited.bin" <<'PYEOF'
import sys, numpy as np
raw = bytearray(open(sys.argv[1], "rb").read())
last = np.frombuffer(raw, dtype="<f4", count=1, offset=len(raw) - 4)[0]
raw[-4:] = np.float32(last * (1 + 1e-6)).tobytes()
open(sys.argv[2], "wb").write(raw)
PYEOF
if "$PY" scripts/compare_fixtures.py "$committed" "$d/edited.bin"; then
    echo "FAIL: a hand-edited fixture value passed the comparison"; exit 1
fi

mkdir "$d/gelu"
sed 's/0\.044715/0.04472/' scripts/gpt2_reference.py >"$d/gelu/gpt2_reference.py"
cp scripts/llmc_checkpoint.py "$d/gelu/"
grep -q 0.04472 "$d/gelu/gpt2_reference.py"
sed "s|^REF=.*|REF=$d/gelu/gpt2_reference.py|" scripts/make_fixtures.sh >"$d/gelu/make_fixtures.sh"
bash "$d/gelu/make_fixtures.sh" "$d/gelu" >/dev/null
if "$PY" scripts/compare_fixtures.py "$committed" "$d/gelu/tiny_debug_state.bin"; then
    echo "FAIL: fixtures from a reference with another GELU constant passed the comparison"; exit 1
fi
echo "fixtures: regenerated ones match, edited ones do not"
