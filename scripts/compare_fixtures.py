#!/usr/bin/env python3
"""Compare two debug-state files written by gpt2_reference.py.

usage: compare_fixtures.py A B
Header, hyperparameters, x and y must match exactly; float sections must agree
within rtol 2.4e-7, atol 1e-12. Prints one line; exit 0 if they match, 1 otherwise
(including unreadable files).

Why those numbers hold on any machine: gpt2_reference.py computes in float64, where
another BLAS kernel or thread count changes a result by ~1e-15 relative, and rounds to
fp32 only when writing. Two machines' files therefore differ by at most one fp32 ulp
(2^-23 = 1.2e-7 relative) where a value lies next to a rounding boundary; rtol allows
two. The one exception is a quantity whose exact value is 0 and which fp64 leaves as
rounding noise: the key biases' gradients (~1e-19; the softmax cancels them) and what
AdamW makes of them, at most 2 * lr * steps * |g| / eps ~ 1e-17 for the fixture's
hyperparameters. atol 1e-12 covers those and is far below every value that is not noise.
So a hand-edited value, or a change in the reference's maths (a constant, an op, a
hyperparameter), fails the comparison; test/test_fixtures.sh checks both.
"""
import sys

import numpy as np

DEBUG_MAGIC, RTOL, ATOL = 20240327, 2.4e-7, 1e-12


def read_sections(path):
    """Split the file into named arrays using the sizes its header declares."""
    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw[:1024], dtype="<i4")
    if len(hdr) != 256 or hdr[0] != DEBUG_MAGIC or hdr[1] != 3:
        raise ValueError(f"{path}: not a version-3 debug state file")
    B, T, steps, V, _, n = (int(v) for v in hdr[2:8])
    layout = [("header", "<i4", 256), ("hyper", "<f4", 8), ("x", "<i4", B * T), ("y", "<i4", B * T),
              ("logits", "<f4", B * T * V), ("loss", "<f4", 1), ("grads", "<f4", n),
              ("losses", "<f4", steps), ("grad_norms", "<f4", steps), ("params_after", "<f4", n)]
    out, off = {}, 0
    for name, dt, count in layout:
        end = off + 4 * count
        if end > len(raw):
            raise ValueError(f"{path}: truncated in section '{name}'")
        out[name] = np.frombuffer(raw[off:end], dtype=dt)
        off = end
    if off != len(raw):
        raise ValueError(f"{path}: {len(raw) - off} trailing bytes")
    return out


def main(argv):
    if len(argv) != 3:
        print("usage: compare_fixtures.py A B", file=sys.stderr)
        return 1
    try:
        a, b = read_sections(argv[1]), read_sections(argv[2])
    except (OSError, ValueError) as e:
        print(f"FAIL: {e}")
        return 1
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            print(f"FAIL: section '{name}' has {x.size} vs {y.size} values")
            return 1
        exact = x.dtype.kind == "i" or name == "hyper"
        bad = (x != y) if exact else ~np.isclose(x, y, rtol=RTOL, atol=ATOL)
        if bad.any():
            i = int(np.argmax(bad))
            print(f"FAIL: section '{name}': {int(bad.sum())} mismatches, first at [{i}]: {x[i]!r} vs {y[i]!r}")
            return 1
    print(f"OK: {argv[1]} and {argv[2]} match (rtol {RTOL}, atol {ATOL})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
