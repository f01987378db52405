"""The peer that scripts/bench_gpu.sh times beside train_gpt in the same call: GPT-2 trained by
PyTorch's nanoGPT recipe (bf16 autocast, causal F.scaled_dot_product_attention, fused AdamW,
torch.compile), on the same llm.c token file. Prints each step's loss and time, then one line:

  bench peer PyTorch d12 B=64 T=1024 (torch VERSION, cuda, compile 1): MS ms/step (median of steps 4-30),
      TOKENS tok/s; peak A MiB allocated, R MiB reserved, U MiB in use on the GPU

    python3 scripts/bench_nanogpt.py -e d12 -b 64 -t 1024 -x 30 -i /tmp/bench_tokens.bin --compile 1 --device cuda

"in use on the GPU" is what train_gpt reports as its peak (total less free memory after a step,
every process and the CUDA context included); allocated and reserved are PyTorch's allocator's.
The model is GPT-2 as transformers' GPT2LMHeadModel computes it (learned positions, layernorm before
attention and MLP, tanh GELU, the head tied to the token embedding), with nanoGPT's init (N(0, 0.02),
the two residual projections N(0, 0.02/sqrt(2L))), the vocabulary padded to a multiple of 128 as
train_gpt pads it and the loss over every padded logit as nanoGPT takes it. AdamW: betas 0.9/0.95,
weight decay 0.1 on the matrices, gradients clipped to norm 1. Batches as llm.c's loader takes them:
B*T+1 tokens from the start of the file, the next B*T on, back to the start at its end.
A torch without torch.compile, scaled_dot_product_attention or fused AdamW (1.13 on a CPU) runs
without, saying so in one line each. The last step runs between cudaProfilerStart and Stop, the
window scripts/kernel_trace.so and Nsight Compute (--profile-from-start off) read.
"""
import argparse
import inspect
import math
import re
import statistics
import sys
import time
from collections import namedtuple

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"bench_nanogpt: {e} (it runs with the Python that has PyTorch: on the H200 python3, /opt/torch/.venv's)")

Config = namedtuple("Config", "layers heads channels vocab max_seq")
# GPT-2 of each depth llm.c names (dX): heads and channels
GPT2_DEPTHS = {6: (6, 384), 12: (12, 768), 24: (16, 1024), 36: (20, 1280), 48: (25, 1600), 60: (30, 1920), 72: (30, 2880), 84: (36, 3456)}
SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256  # llm.c's token file (data/data_common.py)
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def fail(message):
    print(f"bench_nanogpt: {message}", file=sys.stderr)
    sys.exit(2)


def parse_model(desc):
    """'d12' (GPT-2 of depth 12) or 'L=2,NH=4,C=64[,V=1000,maxT=64]', as train_gpt's -e takes them."""
    m = re.fullmatch(r"d([0-9]+)", desc)
    if m:
        depth = int(m.group(1))
        if depth not in GPT2_DEPTHS:
            fail(f"-e {desc}: no GPT-2 of that depth (expected d6, d12, d24, d36, d48, d60, d72 or d84)")
        return Config(depth, *GPT2_DEPTHS[depth], 50257, 1024)
    values = {"V": 50257, "maxT": 1024}
    for item in desc.split(","):
        key, _, value = item.partition("=")
        if key not in ("L", "NH", "C", "V", "maxT") or not value.isdigit() or int(value) == 0:
            fail(f"-e {desc}: bad item '{item}' (expected dX, or L=, NH=, C= and optionally V=, maxT= as positive integers)")
        values[key] = int(value)
    if not {"L", "NH", "C"} <= values.keys() or values["C"] % values["NH"]:
        fail(f"-e {desc}: needs L, NH and C, with C a multiple of NH")
    return Config(values["L"], values["NH"], values["C"], values["V"], values["maxT"])


def padded_vocab(vocab):
    return (vocab + 127) // 128 * 128


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.c_attn = nn.Linear(c.channels, 3 * c.channels)
        self.c_proj = nn.Linear(c.channels, c.channels)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.channels, 4 * c.channels)
        self.c_proj = nn.Linear(4 * c.channels, c.channels)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c.channels), CausalSelfAttention(c)
        self.ln_2, self.mlp = nn.LayerNorm(c.channels), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(padded_vocab(c.vocab), c.channels)
        self.wpe = nn.Embedding(c.max_seq, c.channels)
        self.h = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.channels)

    def forward(self, tokens, targets=None):
        """The logits over the padded vocabulary; with targets, their mean cross-entropy instead
        (inside the module, so that torch.compile fuses it with the head)."""
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return logits if targets is None else F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build_model(c, seed):
    """GPT-2 of config c with nanoGPT's init, from torch's generator seeded with seed (fp32, CPU)."""
    torch.manual_seed(seed)
    model = GPT(c)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):  # the two projections into the residual stream of each layer
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.layers))
        elif p.dim() == 2:
            nn.init.normal_(p, 0.0, 0.02)
        elif name.startswith("ln") or ".ln_" in name:
            nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
        else:
            nn.init.zeros_(p)  # linear biases
    return model


def read_tokens(path, needed, vocab):
    try:
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    except OSError as e:
        fail(f"-i {path}: {e.strerror}")
    if header.size < HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        fail(f"-i {path}: not an llm.c token file (expected a 256-int32 header with magic {SHARD_MAGIC} and version {SHARD_VERSION})")
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_INTS * 4, shape=(int(header[2]),))
    if tokens.size < needed:
        fail(f"-i {path}: {tokens.size} tokens, fewer than the {needed} (B*T+1) of one batch")
    if int(tokens.max()) >= vocab:
        fail(f"-i {path}: token {int(tokens.max())} is outside the model's vocabulary of {vocab}")
    return tokens


def batches(tokens, B, T):
    """llm.c's order: B*T+1 tokens from the start, then B*T further on each time, back to the start at the end."""
    position = 0
    while True:
        if position + B * T + 1 > tokens.size:
            position = 0
        chunk = torch.from_numpy(tokens[position:position + B * T + 1].astype(np.int64))
        yield chunk[:-1].view(B, T), chunk[1:].view(B, T)
        position += B * T


def make_optimizer(model, lr, device):
    """AdamW, weight decay on the matrices only; fused where this torch and device have it."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}]
    fused = device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    if not fused:
        print(f"optimizer: AdamW, not fused (fused AdamW wants a CUDA device and torch 2; here torch {torch.__version__} on {device.type})")
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if fused else {}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-e", "--model", default="d12", help="d6 ... d84, or L=,NH=,C=[,V=,maxT=] (d12)")
    parser.add_argument("-b", "--batch", type=int, default=4, help="sequences a step (4)")
    parser.add_argument("-t", "--seq-len", type=int, default=1024, help="tokens a sequence (1024)")
    parser.add_argument("-x", "--steps", type=int, default=20, help="steps (20)")
    parser.add_argument("-i", "--data", required=True, help="llm.c token file (the one train_gpt's -i reads)")
    parser.add_argument("--compile", type=int, choices=(0, 1), default=1, help="1: torch.compile the model (1)")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (cuda)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="bf16: autocast to bfloat16 (bf16)")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the median (3: compiling, allocating)")
    parser.add_argument("-l", "--lr", type=float, default=3e-4, help="learning rate (3e-4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the init (0)")
    args = parser.parse_args()
    c = parse_model(args.model)
    B, T = args.batch, args.seq_len
    if B < 1 or not 1 <= T <= c.max_seq:
        fail(f"-b {B} -t {T}: wants B >= 1 and 1 <= T <= the model's maxT {c.max_seq}")
    if args.steps <= args.warmup:
        fail(f"-x {args.steps}: wants more steps than --warmup {args.warmup}, whose times are left out")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device cuda: torch {torch.__version__} sees no CUDA GPU")
    tokens = read_tokens(args.data, B * T + 1, c.vocab)

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = build_model(c, args.seed).to(device)
    optimizer = make_optimizer(model, args.lr, device)
    if not HAS_SDPA:
        print(f"attention: torch {torch.__version__} has no F.scaled_dot_product_attention: causal softmax in plain ops")
    compiled = bool(args.compile) and hasattr(torch, "compile")
    if args.compile and not compiled:
        print(f"compile: torch {torch.__version__} has no torch.compile: running eager")
    step_model = torch.compile(model) if compiled else model
    on_gpu = device.type == "cuda"
    gpu = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    print(f"peer: nanoGPT recipe, torch {torch.__version__} on {gpu}: L={c.layers} NH={c.heads} C={c.channels} V={c.vocab} "
          f"(padded {padded_vocab(c.vocab)}), {sum(p.numel() for p in model.parameters())} parameters, B={B} T={T}, {args.precision}")

    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    data = batches(tokens, B, T)
    times, in_use = [], 0
    for step in range(1, args.steps + 1):
        x, y = next(data)
        last = step == args.steps
        if on_gpu:
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
            torch.cuda.synchronize(device)
            if last:
                torch.cuda.profiler.start()
        start = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if on_gpu:
            torch.cuda.synchronize(device)
            if last:
                torch.cuda.profiler.stop()
        times.append(1000 * (time.perf_counter() - start))
        if on_gpu:
            free, total = torch.cuda.mem_get_info(device)
            in_use = max(in_use, total - free)
        print(f"step {step:4d}/{args.steps} | loss {loss.item():.6f} | {times[-1]:.2f} ms", flush=True)

    ms = statistics.median(times[args.warmup:])
    if on_gpu:
        mib = 1 << 20
        memory = (f"peak {torch.cuda.max_memory_allocated(device) / mib:.1f} MiB allocated, "
                  f"{torch.cuda.max_memory_reserved(device) / mib:.1f} MiB reserved, {in_use / mib:.1f} MiB in use on the GPU")
    else:
        memory = "peak memory not measured on a CPU"
    print(f"bench peer PyTorch {args.model} B={B} T={T} (torch {torch.__version__}, {device.type}, compile {int(compiled)}): "
          f"{ms:.1f} ms/step (median of steps {args.warmup + 1}-{args.steps}), {B * T / (ms / 1000):.0f} tok/s; {memory}")


if __name__ == "__main__":
    main()
