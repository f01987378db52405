"""llm.c's checkpoint file, read and written with numpy (train_gpt.cu load_checkpoint/write_checkpoint).

int32 header[256]: magic 20240326, version (3: fp32, 5: bf16), maxT, V, L, NH, C, Vp; then the
parameters as one flat array, 16 tensors in llm.c's order (param_shapes), wte padded to Vp rows.
"""
import math
import os

import numpy as np

MAGIC = 20240326
HEADER_INTS = 256
VERSION_FOR_DTYPE = {"float32": 3, "bfloat16": 5}


class CheckpointError(Exception):
    """A bad checkpoint file or config; the message names the file and what was expected."""


def pad_vocab(V):
    return (V + 127) // 128 * 128


def param_shapes(L, C, Vp, maxT):
    # llm.c's 16-tensor order; do not reorder, the file layout depends on it.
    return [
        ("wte", (Vp, C)), ("wpe", (maxT, C)),
        ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
        ("lnfw", (C,)), ("lnfb", (C,)),
    ]


def num_params(cfg):
    return sum(math.prod(s) for _, s in param_shapes(cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]))


def split(flat, cfg):
    """Name -> view into the flat array (numpy or torch; torch views keep autograd flowing to it)."""
    out, off = {}, 0
    for name, shape in param_shapes(cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]):
        n = math.prod(shape)
        out[name] = flat[off:off + n].reshape(shape)
        off += n
    return out


def bf16_bits(x):
    """fp32 array -> uint16 bfloat16 bits, rounded to nearest even (as torch's .bfloat16())."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def read_checkpoint(path):
    """Returns (cfg dict with maxT V L NH C Vp version, flat fp32 numpy array)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(4 * HEADER_INTS)
            if len(raw) < 4 * HEADER_INTS:
                raise CheckpointError(f"{path}: truncated header ({len(raw)} of {4 * HEADER_INTS} bytes)")
            h = np.frombuffer(raw, dtype="<i4")
            if h[0] != MAGIC:
                raise CheckpointError(f"{path}: bad magic {h[0]} in checkpoint (expected {MAGIC})")
            if h[1] not in (3, 5):
                raise CheckpointError(f"{path}: unsupported checkpoint version {h[1]} (expected 3 for fp32 or 5 for bf16)")
            cfg = dict(maxT=int(h[2]), V=int(h[3]), L=int(h[4]), NH=int(h[5]), C=int(h[6]), Vp=int(h[7]),
                       version=int(h[1]))
            if min(h[2:8]) <= 0 or cfg["C"] % cfg["NH"] or cfg["Vp"] < cfg["V"]:
                raise CheckpointError(f"{path}: inconsistent checkpoint header (maxT={h[2]} V={h[3]} L={h[4]} "
                                      f"NH={h[5]} C={h[6]} Vp={h[7]})")
            n, elem = num_params(cfg), 4 if h[1] == 3 else 2
            expected = 4 * HEADER_INTS + n * elem
            if size != expected:
                raise CheckpointError(f"{path}: checkpoint is {size} bytes, expected {expected} for this header")
            body = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}")
    if elem == 4:
        return cfg, np.frombuffer(body, dtype="<f4").copy()
    # bf16 is the upper half of an fp32
    return cfg, (np.frombuffer(body, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def write_checkpoint(path, cfg, flat, dtype="float32"):
    """Writes to path.tmp and renames it into place, so a failure never leaves a partial file."""
    flat = np.asarray(flat, dtype=np.float32)
    if flat.size != num_params(cfg):
        raise CheckpointError(f"{path}: {flat.size} parameters for a config that needs {num_params(cfg)}")
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:8] = [MAGIC, VERSION_FOR_DTYPE[dtype], cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    body = flat.astype("<f4") if dtype == "float32" else bf16_bits(flat)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(h.tobytes())
            f.write(body.tobytes())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise CheckpointError(f"cannot write {path}: {e.strerror}")
