#!/usr/bin/python3
"""scripts/import_hf.py and scripts/export_hf.py against transformers' own GPT-2.

Run from the project root with Debian's Python (torch, transformers 4.30.2, safetensors):
  /usr/bin/python3 test/test_hf.py
Needs ./train_gpt, test/model_logits and data/tinyshakespeare/ (make test builds them).

The reference is transformers' GPT2LMHeadModel run in float64, so the tolerances bound train_gpt's
fp32 rounding alone:
  loss    1e-5 relative
  logits  1e-5 absolute + 1e-5 relative: fp32 rounding over these 3 layers moves logits of
          magnitude ~1 by ~2e-6; a transposed Conv1D weight or a bias in the wrong place moves
          them by 1e-1 or more
Weights themselves must convert exactly (fp32 both ways; bf16 is torch's round-to-nearest-even).
"""
import contextlib
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch
import transformers
from safetensors import safe_open as REAL_SAFE_OPEN
from safetensors.torch import load_file, save_file

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "data"))
import data_common  # noqa: E402
from llmc_checkpoint import read_checkpoint  # noqa: E402

PY = sys.executable
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
GPT2_FILES = os.path.join(SHARED, "gpt2")  # GPT-2's tokenizer files under OpenAI's names, encoder.json and vocab.bpe
TINY = os.path.join(ROOT, "data", "tinyshakespeare")
L, NH, C, V, MAXT = 3, 4, 64, 1000, 64  # V pads to 1024
B, T, BATCHES = 2, 64, 2


def run(*cmd, env=None):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def check_run(testcase, *cmd):
    r = run(*cmd)
    testcase.assertEqual(r.returncode, 0, f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def random_gpt2(seed, **config):
    """transformers' GPT-2 at its own init, then every parameter moved by N(0, 0.1): nonzero
    biases, layernorm weights away from 1, no two tensors alike."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def rounded_to_bf16(model):
    """A copy of the model with every weight rounded to bfloat16 (nearest even) and back."""
    rounded = copy.deepcopy(model)
    rounded.load_state_dict({k: v.float().bfloat16().to(v.dtype) for k, v in model.state_dict().items()})
    return rounded


def save_openai_style(model, directory):
    """model.safetensors as OpenAI's GPT-2s are published: no "transformer." prefix, no lm_head,
    the attention buffers included."""
    os.makedirs(directory)
    model.config.save_pretrained(directory)
    tensors = {k: v.contiguous() for k, v in model.transformer.state_dict().items()}
    for l in range(model.config.n_layer):
        n = model.config.n_positions
        tensors[f"h.{l}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.uint8)).view(1, 1, n, n)
        tensors[f"h.{l}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def windows(tokens, i):
    """train_gpt's i-th batch of a shard: inputs and targets, B x T each (data/dataloader.h)."""
    w = torch.from_numpy(tokens[i * B * T:(i + 1) * B * T + 1].astype(np.int64))
    return w[:-1].view(B, T), w[1:].view(B, T)


def hf_loss(model, tokens):
    """transformers' mean loss over the batches train_gpt validates on (model in float64)."""
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(x).logits.view(-1, V), y.view(-1)).item()
                  for x, y in (windows(tokens, i) for i in range(BATCHES))]
    return sum(losses) / len(losses)


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.from_numpy(tokens[:T].astype(np.int64)).view(1, T)).logits[0].numpy()


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def max_ratio(a, b, rtol, atol):
    return float(np.max(np.abs(a - b) / (atol + rtol * np.abs(b))))


class HuggingFaceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="test_hf_")
        cls.model = random_gpt2(1234, n_layer=L, n_head=NH, n_embd=C, vocab_size=V, n_positions=MAXT)
        cls.torch_dir = os.path.join(cls.tmp, "hf_torch")  # save_pretrained: pytorch_model.bin, prefixed, lm_head
        cls.model.save_pretrained(cls.torch_dir)
        cls.openai_dir = os.path.join(cls.tmp, "hf_openai")
        save_openai_style(cls.model, cls.openai_dir)
        cls.shard = os.path.join(cls.tmp, "tokens.bin")
        cls.tokens = np.random.default_rng(5).integers(0, V, size=BATCHES * B * T + 1)
        data_common.write_token_shard(cls.shard, cls.tokens)
        cls.model.double()  # the reference runs in float64 (fp32 weights are exact in it)
        cls.imported = cls.path("import_torch.bin")  # each layout imported once, for every test
        cls.imported_openai = cls.path("import_openai.bin")
        for source, out in ((cls.torch_dir, cls.imported), (cls.openai_dir, cls.imported_openai)):
            r = run(PY, "scripts/import_hf.py", source, out)
            assert r.returncode == 0, f"import_hf {source} failed:\n{r.stdout}\n{r.stderr}"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    @classmethod
    def path(cls, name):
        return os.path.join(cls.tmp, name)

    def import_hf(self, source, out, *flags):
        check_run(self, PY, "scripts/import_hf.py", source, out, *flags)
        return out

    def train_gpt_loss(self, checkpoint):
        """train_gpt's validation loss before its first step, on the test shard's first batches."""
        out = check_run(self, "./train_gpt", "-e", checkpoint, "-i", self.shard, "-j", self.shard, "-b", str(B),
                        "-t", str(T), "-x", "1", "-v", "1", "-m", str(BATCHES), "-s", "0", "-o", "", "--device", "cpu")
        return float(re.search(r"^val loss (\S+)$", out, re.M).group(1))

    def train_gpt_logits(self, checkpoint, vocab=V):
        out = self.path("logits.f32")
        check_run(self, "test/model_logits", checkpoint, self.shard, str(T), out)
        return np.fromfile(out, dtype=np.float32).reshape(T, vocab)

    def assert_same_model(self, checkpoint, model):
        """train_gpt on the checkpoint computes what transformers computes with the model."""
        ours, ref = self.train_gpt_loss(checkpoint), hf_loss(model, self.tokens)
        self.assertLessEqual(abs(ours - ref), 1e-5 * ref, f"loss: train_gpt {ours}, transformers {ref}")
        ratio = max_ratio(self.train_gpt_logits(checkpoint), hf_logits(model, self.tokens), 1e-5, 1e-5)
        self.assertLessEqual(ratio, 1.0, "logits differ from transformers' beyond fp32 tolerance")

    def load_exported(self, directory, **kwargs):
        model, info = transformers.GPT2LMHeadModel.from_pretrained(directory, output_loading_info=True, **kwargs)
        self.assertEqual((info["missing_keys"], info["unexpected_keys"]), ([], []))
        self.assertEqual(model.lm_head.weight.data_ptr(), model.transformer.wte.weight.data_ptr(), "lm_head not tied")
        return model.eval()

    def test_import_matches_transformers(self):
        ckpt = self.imported
        cfg, flat = read_checkpoint(ckpt)
        self.assertEqual([cfg[k] for k in ("version", "maxT", "V", "L", "NH", "C", "Vp")], [3, MAXT, V, L, NH, C, 1024])
        self.assertTrue(np.all(flat[V * C:1024 * C] == 0), "padded vocabulary rows must be zero")
        np.testing.assert_array_equal(flat[:V * C], self.model.transformer.wte.weight.detach().numpy().ravel())
        self.assert_same_model(ckpt, self.model)
        # OpenAI's layout (unprefixed safetensors with the attention buffers) gives the same file
        self.assertTrue(same_bytes(ckpt, self.imported_openai))

    def test_export_after_training(self):
        ckpt = self.imported_openai
        out = self.path("run")
        check_run(self, "./train_gpt", "-e", ckpt, "-i", self.shard, "-b", str(B), "-t", str(T), "-x", "3", "-l", "1e-3",
                  "-v", "0", "-s", "0", "-o", out, "--device", "cpu")
        trained = os.path.join(out, "model_00000003.bin")
        moved = np.abs(read_checkpoint(trained)[1] - read_checkpoint(ckpt)[1]).max()
        self.assertGreater(moved, 1e-4, "training moved nothing")
        check_run(self, PY, "scripts/export_hf.py", trained, self.path("exported"))
        self.assertEqual(sorted(os.listdir(self.path("exported"))), ["config.json", "model.safetensors"])
        model = self.load_exported(self.path("exported")).double()
        ratio = max_ratio(self.train_gpt_logits(trained), hf_logits(model, self.tokens), 1e-5, 1e-5)
        self.assertLessEqual(ratio, 1.0, "exported model's logits differ from train_gpt's beyond fp32 tolerance")
        # and back: the same bytes as the checkpoint that was exported
        self.assertTrue(same_bytes(trained, self.import_hf(self.path("exported"), self.path("reimported.bin"))))

    def test_bf16_round_trip(self):
        ckpt = self.import_hf(self.torch_dir, self.path("bf16.bin"), "--dtype", "bfloat16")
        cfg, flat = read_checkpoint(ckpt)
        self.assertEqual(cfg["version"], 5)
        self.assertEqual(os.path.getsize(ckpt), 1024 + 2 * flat.size)
        fp32 = read_checkpoint(self.imported)[1]
        np.testing.assert_array_equal(flat, torch.from_numpy(fp32).bfloat16().float().numpy())
        # train_gpt reads version 5 as transformers' model with those bf16-rounded weights
        rounded = rounded_to_bf16(self.model)
        self.assert_same_model(ckpt, rounded)
        # exported as bf16, it loads in bf16 with exactly those weights, and the fp32 checkpoint
        # exported as bf16 rounds the same way
        for source, name in ((ckpt, "exported_v5"), (self.imported, "exported_fp32_as_bf16")):
            check_run(self, PY, "scripts/export_hf.py", source, self.path(name), "--dtype", "bfloat16")
            stored = load_file(os.path.join(self.path(name), "model.safetensors"))
            self.assertEqual({v.dtype for v in stored.values()}, {torch.bfloat16})
            model = self.load_exported(self.path(name), torch_dtype="auto")
            exported = model.state_dict()
            for k, v in rounded.state_dict().items():
                self.assertTrue(torch.equal(exported[k].double(), v), k)
        # imported again (a bf16 safetensors file): the same version 5 checkpoint
        again = self.import_hf(self.path("exported_v5"), self.path("v5_again.bin"), "--dtype", "bfloat16")
        self.assertTrue(same_bytes(ckpt, again))
        # bf16 tolerance: rounding each weight by up to 2^-9 relative moves these logits (std 0.8,
        # largest 3.3) by 0.023 at most (mean 0.004); 5e-2 absolute + 2e-2 relative is twice that
        ratio = max_ratio(hf_logits(model.double(), self.tokens), hf_logits(self.model, self.tokens), 2e-2, 5e-2)
        self.assertLessEqual(ratio, 1.0, "bf16 round trip moved the logits beyond bf16 tolerance")

    def test_tokenizer_both_ways(self):
        """GPT-2's own tokenizer files (OpenAI's names) with a model of GPT-2's vocabulary."""
        source = self.path("hf_vocab")
        random_gpt2(7, n_layer=1, n_head=2, n_embd=16, vocab_size=50257, n_positions=T).save_pretrained(source)
        for name, hf_name in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
            os.symlink(os.path.join(GPT2_FILES, name), os.path.join(source, hf_name))
        os.makedirs(self.path("vocab"))
        ckpt = self.import_hf(source, os.path.join(self.path("vocab"), "model.bin"))
        # the tokenizer written from vocab.json is the one the data step builds with tiktoken
        written = os.path.join(self.path("vocab"), "gpt2_tokenizer.bin")
        self.assertTrue(same_bytes(written, os.path.join(TINY, "gpt2_tokenizer.bin")))
        check_run(self, PY, "scripts/export_hf.py", ckpt, self.path("vocab_hf"), "--tokenizer", GPT2_FILES)
        tokenizer = transformers.AutoTokenizer.from_pretrained(self.path("vocab_hf"))  # as lm-evaluation-harness loads it
        # Tiny Shakespeare's first 20 documents, each after an end-of-text (data/tinyshakespeare.py),
        # tokenize and detokenize as tiktoken made the validation shard
        with open(os.path.join(SHARED, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
            text = "".join("<|endoftext|>" + doc + "\n\n" for doc in f.read().split("\n\n")[:20])
        tokens = data_common.read_token_shard(os.path.join(TINY, "tiny_shakespeare_val.bin")).tolist()
        tokens = tokens[:[i for i, t in enumerate(tokens) if t == 50256][20]]
        self.assertEqual(tokenizer(text)["input_ids"], tokens)
        self.assertEqual(tokenizer.decode(tokens), text)


class SafetensorsVersionsTest(unittest.TestCase):
    """import_hf reads a bf16 safetensors file whatever the safetensors version (the pin in
    scripts/prerequisites.sh): such a file never goes to safetensors' numpy reader, which fails on
    bfloat16 (numpy has none), and which way it fails differs: 0.3.x raises AttributeError (from
    numpy), later versions TypeError. Here the numpy reader behaves as 0.3.x's does."""

    @staticmethod
    @contextlib.contextmanager
    def safe_open_0_3(path, framework, **kwargs):
        with REAL_SAFE_OPEN(path, framework="pt") as pt, REAL_SAFE_OPEN(path, framework=framework, **kwargs) as f:
            class Reader:
                keys = f.keys

                def get_tensor(self, name):
                    if framework == "np" and pt.get_tensor(name).dtype == torch.bfloat16:
                        raise AttributeError("module 'numpy' has no attribute 'bfloat16'")
                    return f.get_tensor(name)
            yield Reader()

    def test_bf16_and_fp32_files_read_as_stored(self):
        import import_hf
        with tempfile.TemporaryDirectory() as tmp:
            fp32_dir, bf16_dir = os.path.join(tmp, "fp32"), os.path.join(tmp, "bf16")
            save_openai_style(random_gpt2(11, n_layer=1, n_head=2, n_embd=16, vocab_size=100, n_positions=16), fp32_dir)
            fp32 = load_file(os.path.join(fp32_dir, "model.safetensors"))
            bf16 = {k: v.bfloat16() if v.is_floating_point() else v for k, v in fp32.items()}
            shutil.copytree(fp32_dir, bf16_dir)
            save_file(bf16, os.path.join(bf16_dir, "model.safetensors"), metadata={"format": "pt"})
            with mock.patch("safetensors.safe_open", self.safe_open_0_3):
                for directory, stored in ((bf16_dir, bf16), (fp32_dir, fp32)):
                    read = import_hf.read_weights(directory)
                    self.assertEqual(sorted(read), sorted(stored))
                    for k, v in stored.items():
                        np.testing.assert_array_equal(read[k], v.float().numpy(), err_msg=f"{directory}: {k}")


def expect_failure(testcase, cmd, out, *words):
    """cmd fails with exit code 1 and one line on stderr holding words; out and nothing beside it exists."""
    parent = os.path.dirname(out)
    before = sorted(os.listdir(parent))
    r = run(*cmd, env={"HF_HUB_OFFLINE": "1"})
    testcase.assertEqual(r.returncode, 1, f"{cmd}: {r.stdout}{r.stderr}")
    lines = r.stderr.strip().splitlines()
    testcase.assertEqual(len(lines), 1, r.stderr)
    for w in words:
        testcase.assertIn(w, lines[0])
    testcase.assertFalse(os.path.exists(out), f"{out} was written")
    testcase.assertEqual(sorted(os.listdir(parent)), before, "something was left beside the output")


class BadInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="test_hf_bad_")
        cls.good = os.path.join(cls.tmp, "good")
        save_openai_style(random_gpt2(3, n_layer=2, n_head=2, n_embd=32, vocab_size=200, n_positions=32), cls.good)
        cls.tensors = load_file(os.path.join(cls.good, "model.safetensors"))
        with open(os.path.join(cls.good, "config.json")) as f:
            cls.config = json.load(f)
        cls.outputs = os.path.join(cls.tmp, "outputs")
        os.makedirs(cls.outputs)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def variant(self, name, config=None, tensors=None):
        """A copy of the good directory with config keys or tensors replaced (None: removed)."""
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        c = dict(self.config, **(config or {}))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({k: v for k, v in c.items() if v is not None}, f)
        t = dict(self.tensors, **(tensors or {}))
        save_file({k: v for k, v in t.items() if v is not None}, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        return d

    def expect_import_failure(self, source, *words):
        out = os.path.join(self.outputs, "model.bin")
        expect_failure(self, [PY, "scripts/import_hf.py", source, out], out, "import_hf: error:", *words)

    def test_good_directory_imports(self):  # the variants below differ from it in one thing only
        check_run(self, PY, "scripts/import_hf.py", self.good, os.path.join(self.tmp, "good.bin"))

    def test_wrong_model_type(self):
        self.expect_import_failure(self.variant("neox", config={"model_type": "gpt_neox"}), "model_type", "'gpt2'")

    def test_other_activation(self):
        self.expect_import_failure(self.variant("relu", config={"activation_function": "relu"}), "activation_function")

    def test_missing_tensor(self):
        self.expect_import_failure(self.variant("missing", tensors={"h.1.mlp.c_fc.bias": None}),
                                   "h.1.mlp.c_fc.bias", "missing")

    def test_wrong_shape(self):
        # c_attn stored as nn.Linear would store it, (3C, C), instead of Conv1D's (C, 3C)
        w = self.tensors["h.0.attn.c_attn.weight"].t().contiguous()
        self.expect_import_failure(self.variant("shape", tensors={"h.0.attn.c_attn.weight": w}),
                                   "h.0.attn.c_attn.weight", "(96, 32)", "(32, 96)")

    def test_more_layers_than_config(self):
        self.expect_import_failure(self.variant("layers", config={"n_layer": 1}), "unexpected", "h.1.")

    def test_foreign_vocabulary(self):  # read before anything is written: no checkpoint without its tokenizer
        d = self.variant("vocab")
        with open(os.path.join(d, "vocab.json"), "w") as f:
            json.dump({"a": 0, "b": 2}, f)
        self.expect_import_failure(d, "vocab.json", "GPT-2's vocabulary")

    def test_untied_lm_head(self):
        lm_head = self.tensors["wte.weight"] + 1
        self.expect_import_failure(self.variant("untied", tensors={"lm_head.weight": lm_head}), "lm_head.weight")

    def test_no_weights(self):
        d = os.path.join(self.tmp, "no_weights")
        os.makedirs(d)
        shutil.copy(os.path.join(self.good, "config.json"), d)
        self.expect_import_failure(d, "model.safetensors")

    def test_truncated_weights(self):
        d = self.variant("truncated")
        path = os.path.join(d, "model.safetensors")
        os.truncate(path, os.path.getsize(path) // 2)
        self.expect_import_failure(d, "model.safetensors", "cannot read")

    def test_not_a_model(self):
        self.expect_import_failure(os.path.join(self.good, "config.json"), "not a directory")
        self.expect_import_failure("no-such-user/no-such-model", "Hugging Face Hub")

    def test_export_bad_checkpoint(self):
        good = os.path.join(self.tmp, "export_source.bin")
        check_run(self, PY, "scripts/import_hf.py", self.good, good)
        with open(good, "rb") as f:
            raw = f.read()
        out = os.path.join(self.outputs, "hf")
        for name, data, words in (("magic.bin", b"\0\0\0\0" + raw[4:], ("bad magic",)),
                                  ("version.bin", raw[:4] + b"\7\0\0\0" + raw[8:], ("version 7",)),
                                  ("short.bin", raw[:-6], ("bytes, expected",))):
            path = os.path.join(self.tmp, name)
            with open(path, "wb") as f:
                f.write(data)
            expect_failure(self, [PY, "scripts/export_hf.py", path, out], out, "export_hf: error:", *words)
        # a tokenizer that does not fit the model's vocabulary of 200
        expect_failure(self, [PY, "scripts/export_hf.py", good, out, "--tokenizer", GPT2_FILES], out,
                       "export_hf: error:", "50257 tokens", "200")


if __name__ == "__main__":
    unittest.main()
