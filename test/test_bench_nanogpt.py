#!/usr/bin/python3
"""scripts/bench_nanogpt.py (the PyTorch peer of scripts/bench_gpu.sh) on a CPU, at a tiny GPT-2, against
transformers' GPT2LMHeadModel given the same weights, run in float64:
  - the forward's logits, in process
  - the script's first three losses, run as bench_gpu.sh runs it (fp32 here), against the same batches
    through the reference model trained by torch's own AdamW (decay 0.1 on the matrices, betas
    0.9/0.95, gradients clipped to norm 1), and the first near ln(padded V) as a random init gives it
  - its summary line: tok/s from its ms/step; a torch without torch.compile said so in one line
  - a file that is not a token file, and a bad model, refused in one line
Run from the project root with Debian's Python (torch 1.13, transformers 4.30.2): /usr/bin/python3 test/test_bench_nanogpt.py
"""
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "bench_nanogpt.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "data"))
import bench_nanogpt  # noqa: E402
from data_common import write_token_shard  # noqa: E402

MODEL = "L=2,NH=4,C=64,V=1000,maxT=64"
L, NH, C, V, VP = 2, 4, 64, 1000, 1024  # V pads to 1024
B, T, STEPS, LR, SEED = 2, 32, 3, 1e-3, 5


def reference_gpt2(model):
    """transformers' GPT-2 in float64 holding model's weights (its Conv1D stores a Linear's weight transposed)."""
    config = transformers.GPT2Config(vocab_size=VP, n_positions=64, n_embd=C, n_layer=L, n_head=NH, activation_function="gelu_new",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    hf = transformers.GPT2LMHeadModel(config).double().eval()
    state = {}
    for name, tensor in model.state_dict().items():
        is_linear_weight = re.search(r"\.(c_attn|c_proj|c_fc)\.weight$", name)
        state["transformer." + name] = (tensor.t() if is_linear_weight else tensor).double()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith(("attn.bias", "attn.masked_bias")) or k == "lm_head.weight" for k in missing), (missing, unexpected)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied
    return hf


def loss_of(hf, x, y):
    logits = hf(torch.from_numpy(x)).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VP), torch.from_numpy(y).reshape(-1))


class BenchNanoGPTTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.tokens = np.random.default_rng(3).integers(0, V, B * T * STEPS + 1)
        cls.data = os.path.join(cls.dir.name, "tokens.bin")
        write_token_shard(cls.data, cls.tokens)
        cls.trained = cls.bench("--precision", "fp32", "--compile", "1")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    @classmethod
    def bench(cls, *more, model=MODEL, data=None):
        cmd = [sys.executable, SCRIPT, "-e", model, "-b", str(B), "-t", str(T), "-x", str(STEPS), "-i", data or cls.data,
               "--device", "cpu", "-l", str(LR), "--seed", str(SEED), "--warmup", "1", *more]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="2"))

    def batch(self, step):
        chunk = self.tokens[(step - 1) * B * T:(step - 1) * B * T + B * T + 1].astype(np.int64)
        return chunk[:-1].reshape(B, T), chunk[1:].reshape(B, T)

    def test_forward_equals_transformers_gpt2(self):
        model = bench_nanogpt.build_model(bench_nanogpt.parse_model(MODEL), SEED)
        with torch.no_grad():  # every weight moved by N(0, 0.1): logits of order 1, no two tensors alike
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        hf = reference_gpt2(model)
        x, _ = self.batch(1)
        with torch.no_grad():
            ours = model(torch.from_numpy(x)).double()
            want = hf(torch.from_numpy(x)).logits
        self.assertEqual(tuple(ours.shape), (B, T, VP))
        # fp32 against fp64, logits up to about 3: 2e-6 here; the exact GELU in place of tanh's gives 1e-3
        self.assertLess((ours - want).abs().max().item(), 1e-5)

    def test_losses_of_a_run_follow_the_reference_training(self):
        self.assertEqual(self.trained.returncode, 0, self.trained.stderr)
        losses = [float(v) for v in re.findall(r"^step +\d+/3 \| loss ([0-9.]+) \|", self.trained.stdout, re.M)]
        self.assertEqual(len(losses), STEPS, self.trained.stdout)
        hf = reference_gpt2(bench_nanogpt.build_model(bench_nanogpt.parse_model(MODEL), SEED))
        params = list(hf.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8)
        for step in range(1, STEPS + 1):
            loss = loss_of(hf, *self.batch(step))
            # fp32 (printed to 6 decimals) against fp64: within 1e-6 on this machine; without the weight
            # decay step 3 moves by 1.3e-5, without the clipping by 1.2e-4
            self.assertAlmostEqual(losses[step - 1], loss.item(), delta=3e-6, msg=f"step {step}")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad()
        # a random init's logits are near 0: the loss near that of the uniform distribution over the padded vocabulary
        self.assertLess(abs(losses[0] - math.log(VP)), 0.05)

    def test_summary_line_and_what_this_torch_lacks(self):
        out = self.trained.stdout
        self.assertIn(f"compile: torch {torch.__version__} has no torch.compile: running eager", out.splitlines())
        m = re.search(r"^bench peer PyTorch (\S+) B=2 T=32 \(torch \S+, cpu, compile 0\): ([0-9.]+) ms/step "
                      r"\(median of steps 2-3\), ([0-9]+) tok/s; peak memory not measured on a CPU$", out, re.M)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(1), MODEL)
        step_ms = sorted(float(v) for v in re.findall(r"^step +[23]/3 \| loss [0-9.]+ \| ([0-9.]+) ms$", out, re.M))
        self.assertAlmostEqual(float(m.group(2)), (step_ms[0] + step_ms[1]) / 2, delta=0.0551)  # the median of two, steps printed to 0.01, it to 0.1
        # tok/s comes from the unrounded median, ms/step is printed to 0.1: tok/s lies between what the
        # ends of that rounding interval give, whatever the machine's speed
        printed_ms, tokens_per_s = float(m.group(2)), int(m.group(3))
        self.assertGreaterEqual(tokens_per_s, round(B * T / ((printed_ms + 0.05) / 1000)) - 1)
        self.assertLessEqual(tokens_per_s, round(B * T / (max(printed_ms - 0.05, 1e-9) / 1000)) + 1)

    def test_bad_inputs_are_refused_in_one_line(self):
        not_tokens = os.path.join(self.dir.name, "text.bin")
        with open(not_tokens, "wb") as f:
            f.write(b"First Citizen: Before we proceed any further, hear me speak." * 40)
        for run, said in [(self.bench(data=not_tokens), "not an llm.c token file"),
                          (self.bench(model="d13"), "no GPT-2 of that depth"),
                          (self.bench(model="L=2,NH=3,C=64"), "C a multiple of NH"),
                          (self.bench(data=os.path.join(self.dir.name, "missing.bin")), "No such file")]:
            self.assertEqual(run.returncode, 2, run.stdout)
            self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
            self.assertIn(said, run.stderr)
        vocab_too_small = self.bench(model="L=2,NH=4,C=64,V=500,maxT=64")
        self.assertIn("outside the model's vocabulary of 500", vocab_too_small.stderr)


if __name__ == "__main__":
    unittest.main()
