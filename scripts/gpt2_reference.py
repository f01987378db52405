#!/usr/bin/env python3
"""Reference GPT-2 (fp32, CPU PyTorch) used to generate test fixtures.

Two modes:
  --write-model PATH --config L=2,NH=4,C=64,V=101,maxT=32 --seed S
      random GPT-2 init, written as an llm.c checkpoint (version 3, fp32).
  --model PATH --out PATH [--B --T --accum --steps --lr --beta1 --beta2 --eps
      --weight-decay --grad-clip --seed] [--check]
      loads a checkpoint, draws a random batch, runs `steps` AdamW steps on
      that same batch and writes a debug-state file (format in write_debug_state).
      With --accum A > 1 the batch is A micro-batches of B sequences, cut from one
      stream of A*B*T+1 tokens the way the trainer's data loader cuts a shard, and
      each step sums their gradients (each micro-batch's mean loss scaled by 1/A).

All parameters live in ONE flat fp32 tensor laid out exactly like llm.c's
buffer, and the model reads views into it, so autograd directly yields the
flat gradient the C++/CUDA code must match.
"""
import argparse
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

from llmc_checkpoint import (CheckpointError, num_params, pad_vocab, param_shapes, read_checkpoint,
                             split as split_params, write_checkpoint)

DEBUG_MAGIC = 20240327
HEADER_INTS = 256
# The tiny fixture's grad norms fall from ~3.0 to ~1.6 over 10 steps, so 2.0
# makes the first steps clip and the later ones not: both code paths get tested.
GRAD_CLIP_DEFAULT = 2.0


class FixtureError(Exception):
    """Bad input file; reported as one line on stderr with exit code 2."""


# Matrices get weight decay; biases and layernorm params do not (GPT-2 / llm.c convention).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


# ---------------------------------------------------------------- model

def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(flat, cfg, x, y=None):
    """Returns (logits[B,T,V], loss or None). Written out explicitly so each op
    maps one-to-one onto a kernel in the C++/CUDA trainer."""
    p = split_params(flat, cfg)
    L, NH, C, V = cfg["L"], cfg["NH"], cfg["C"], cfg["V"]
    B, T = x.shape
    hs = C // NH
    h = p["wte"][x] + p["wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        a = F.layer_norm(h, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = a @ p["qkvw"][l].T + p["qkvb"][l]
        # columns are [q | k | v]; each is split into NH heads of width hs
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + o @ p["attprojw"][l].T + p["attprojb"][l]
        m = F.layer_norm(h, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        m = gelu_tanh(m @ p["fcw"][l].T + p["fcb"][l])
        h = h + m @ p["fcprojw"][l].T + p["fcprojb"][l]
    h = F.layer_norm(h, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    # Only the real V rows of wte are used, so padded rows get exactly zero grad.
    logits = h @ p["wte"][:V].T
    loss = None if y is None else F.cross_entropy(logits.view(-1, V), y.view(-1))
    return logits, loss


def init_model(cfg, seed):
    """GPT-2 init: N(0,0.02) weights, residual projections scaled by 1/sqrt(2L)
    (keeps the residual stream variance independent of depth), zero biases,
    unit LN gains, zero padded vocab rows."""
    g = torch.Generator().manual_seed(seed)
    flat = torch.zeros(num_params(cfg), dtype=torch.float32)
    p = split_params(flat, cfg)
    for name, t in p.items():
        if name in ("ln1w", "ln2w", "lnfw"):
            t.fill_(1.0)
        elif name in DECAYED:
            std = 0.02 / math.sqrt(2 * cfg["L"]) if name in ("attprojw", "fcprojw") else 0.02
            t.normal_(0.0, std, generator=g)
    p["wte"][cfg["V"]:].zero_()
    return flat


# ---------------------------------------------------------------- training

def grad_of(flat, cfg, x, y, accum):
    """Logits, mean loss and gradient over the batch's `accum` micro-batches (rows of x, y
    in order), the gradients of each micro-batch's mean loss / accum summed."""
    w = flat.detach().double().requires_grad_(True)
    B = x.shape[0] // accum
    logits, loss = [], 0.0
    for k in range(accum):
        lk, loss_k = forward(w, cfg, x[k * B:(k + 1) * B], y[k * B:(k + 1) * B])
        (loss_k / accum).backward()
        logits.append(lk.detach())
        loss = loss + loss_k.detach() / accum
    return torch.cat(logits), loss, w.grad.detach()


def decay_mask(cfg):
    mask = torch.zeros(num_params(cfg), dtype=torch.float32)
    for name, t in split_params(mask, cfg).items():
        if name in DECAYED:
            t.fill_(1.0)
    return mask


def train(flat, cfg, x, y, a):
    """`a.steps` AdamW steps on the fixed batch; returns (losses, norms, params).
    AdamW is written out (not torch.optim) so it mirrors the C++ kernel exactly."""
    p = flat.double()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    lr, beta1, beta2, eps, weight_decay, grad_clip = (
        float(np.float32(h)) for h in (a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_clip))
    wd = decay_mask(cfg).double() * weight_decay
    losses, norms = [], []
    for t in range(1, a.steps + 1):
        _, loss, g = grad_of(p, cfg, x, y, a.accum)
        norm = float(torch.sqrt((g ** 2).sum()))
        clipped = grad_clip > 0 and norm > grad_clip
        if clipped:  # plain ratio, no +1e-6 (unlike torch's clip_grad_norm_)
            g = g * (grad_clip / norm)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        mhat = m / (1.0 - beta1 ** t)
        vhat = v / (1.0 - beta2 ** t)
        p = p - lr * (mhat / (vhat.sqrt() + eps) + wd * p)
        losses.append(float(loss))
        norms.append(norm)
        print(f"step {t:3d}  loss {float(loss):.6f}  grad_norm {norm:.6f}{'  (clipped)' if clipped else ''}")
    return losses, norms, p


def finite_diff_check(flat, cfg, x, y, grads, n_per_tensor=2, seed=0):
    """Central differences in float64 on a few entries of every tensor, against
    the float64 autograd gradient. Returns True if all agree."""
    f64 = flat.double()
    g = torch.Generator().manual_seed(seed)
    ok, off, h = True, 0, 1e-5
    used_rows = {"wte": cfg["V"], "wpe": x.shape[1]}
    for name, shape in param_shapes(cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]):
        n = math.prod(shape)
        # sample only rows the batch touches, plus one padded/unused row (grad must be 0)
        n_used = used_rows.get(name, shape[0]) * n // shape[0]
        idx = [off + int(i) for i in torch.randint(0, n_used, (n_per_tensor,), generator=g)]
        if n_used < n:
            idx.append(off + n_used)
        for i in idx:
            plus, minus = f64.clone(), f64.clone()
            plus[i] += h
            minus[i] -= h
            fd = (float(forward(plus, cfg, x, y)[1]) - float(forward(minus, cfg, x, y)[1])) / (2 * h)
            ag = float(grads[i])
            good = abs(fd - ag) <= 1e-4 * max(abs(fd), abs(ag)) + 1e-6
            ok &= good
            print(f"check {name:9s} [{i - off:6d}]  autograd {ag: .6e}  fd {fd: .6e}  {'ok' if good else 'MISMATCH'}")
        off += n
    return ok


def write_debug_state(path, cfg, a, x, y, logits, loss, grads, losses, norms, params_after):
    """int32 header[256]: magic, version 3, B (rows of x: accum micro-batches), T, steps, V, Vp,
    parameter count, accum; fp32 hyperparameters[8]: lr, beta1, beta2, eps, weight decay, grad
    clip, 0, 0; then int32 x and y (B, T), fp32 logits (B, T, V), loss, gradients, the steps'
    losses and gradient norms, and the parameters after the steps."""
    B, T = x.shape
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:9] = [DEBUG_MAGIC, 3, B, T, a.steps, cfg["V"], cfg["Vp"], grads.numel(), a.accum]
    hyper = np.array([a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_clip, 0, 0], dtype="<f4")
    f32 = lambda t: np.asarray(t, dtype="<f4").tobytes()
    with open(path, "wb") as f:
        for chunk in (hdr.tobytes(), hyper.tobytes(),
                      x.numpy().astype("<i4").tobytes(), y.numpy().astype("<i4").tobytes(),
                      f32(logits.numpy()), f32([float(loss)]), f32(grads.numpy()),
                      f32(losses), f32(norms), f32(params_after.numpy())):
            f.write(chunk)


# ---------------------------------------------------------------- CLI

def parse_config(s):
    cfg = {}
    for kv in s.split(","):
        k, _, val = kv.partition("=")
        if k not in ("L", "NH", "C", "V", "maxT") or not val.isdigit():
            raise FixtureError(f"bad --config entry '{kv}' (want L=,NH=,C=,V=,maxT=)")
        cfg[k] = int(val)
    if len(cfg) != 5 or cfg["C"] % cfg["NH"]:
        raise FixtureError(f"--config needs L,NH,C,V,maxT with C divisible by NH, got '{s}'")
    cfg["Vp"] = pad_vocab(cfg["V"])
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-model", metavar="PATH")
    ap.add_argument("--config", default="L=2,NH=4,C=64,V=101,maxT=32")
    ap.add_argument("--model", metavar="PATH")
    ap.add_argument("--out", metavar="PATH")
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=16)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=GRAD_CLIP_DEFAULT)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--check", action="store_true", help="finite-difference check of the initial gradient")
    a = ap.parse_args()
    torch.manual_seed(0)  # nothing should use the global RNG; pin it anyway

    if a.write_model:
        cfg = parse_config(a.config)
        write_checkpoint(a.write_model, cfg, init_model(cfg, a.seed).numpy())
        print(f"wrote {a.write_model}: {cfg}, {num_params(cfg)} params")
        return 0
    if not (a.model and a.out):
        raise FixtureError("need either --write-model PATH or both --model PATH and --out PATH")

    cfg, flat = read_checkpoint(a.model)
    flat = torch.from_numpy(flat)
    if not (0 < a.T <= cfg["maxT"] and a.B > 0 and a.steps > 0 and a.accum > 0):
        raise FixtureError(f"need B>0, accum>0, steps>0 and 0<T<=maxT={cfg['maxT']}")
    g = torch.Generator().manual_seed(a.seed)
    if a.accum == 1:
        x = torch.randint(0, cfg["V"], (a.B, a.T), generator=g)
        y = torch.randint(0, cfg["V"], (a.B, a.T), generator=g)
    else:  # window k of the stream is micro-batch k: inputs its first B*T tokens, targets shifted by one
        stream = torch.randint(0, cfg["V"], (a.accum * a.B * a.T + 1,), generator=g)
        x, y = stream[:-1].view(a.accum * a.B, a.T), stream[1:].view(a.accum * a.B, a.T)
    logits, loss, grads = grad_of(flat, cfg, x, y, a.accum)
    losses, norms, params_after = train(flat, cfg, x, y, a)
    assert losses[0] == float(loss)
    write_debug_state(a.out, cfg, a, x, y, logits, loss, grads, losses, norms, params_after)
    print(f"wrote {a.out}")
    if a.check and not finite_diff_check(flat, cfg, x, y, grads):
        print("gradient check FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (FixtureError, CheckpointError, OSError) as e:  # OSError: e.g. output directory missing
        print(f"gpt2_reference: error: {e}", file=sys.stderr)
        sys.exit(2)
