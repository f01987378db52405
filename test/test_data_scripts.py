#!/usr/bin/env python3
"""Tests for data/data_common.py, data/tinyshakespeare.py and data/fineweb.py.

Run from the project root:  python3 test/test_data_scripts.py

Uses the local GPT-2 BPE files at ../shared/data/gpt2/{vocab.bpe,encoder.json}
and ../shared/data/tinyshakespeare/input.txt (relative to the project root);
tests that need them are skipped when they are absent. No network is used.

Expected tokens come from an implementation independent of the scripts' tiktoken:
transformers' GPT2Tokenizer reading the same two files (scripts/gpt2_tokenizer_reference.py),
run by /usr/bin/python3 where transformers is installed (REFERENCE_PYTHON overrides it).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(ROOT, "data")
sys.path.insert(0, DATA_DIR)
import data_common as dc  # noqa: E402

SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
VOCAB_BPE = os.path.join(SHARED, "gpt2", "vocab.bpe")
ENCODER_JSON = os.path.join(SHARED, "gpt2", "encoder.json")
SHAKESPEARE = os.path.join(SHARED, "tinyshakespeare", "input.txt")
HAVE_BPE = os.path.isfile(VOCAB_BPE) and os.path.isfile(ENCODER_JSON)
HAVE_TEXT = os.path.isfile(SHAKESPEARE)
BPE_MSG = f"local GPT-2 BPE files not found ({VOCAB_BPE}, {ENCODER_JSON})"
TEXT_MSG = f"Tiny Shakespeare text not found ({SHAKESPEARE})"
EOT = 50256
REFERENCE_PYTHON = os.environ.get("REFERENCE_PYTHON", "/usr/bin/python3")
REFERENCE_SCRIPT = os.path.join(ROOT, "scripts", "gpt2_tokenizer_reference.py")


def run_reference(args, stdin=""):
    r = subprocess.run([REFERENCE_PYTHON, REFERENCE_SCRIPT, ENCODER_JSON, VOCAB_BPE, *args], input=stdin,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"the transformers reference failed under {REFERENCE_PYTHON} ({r.returncode}); "
                             f"it needs transformers (see .ci/run):\n{r.stderr}")
    return json.loads(r.stdout)


def reference_tokens(texts):
    """transformers' GPT-2 tokens of each text, <|endoftext|> as the end-of-text token."""
    return run_reference([], json.dumps(texts))


def reference_vocab():
    """every token's bytes by id, from transformers' GPT2Tokenizer"""
    return [bytes.fromhex(h) for h in run_reference(["--vocab"])]


def reference_documents(docs):
    """tokens of documents as the data scripts lay them out: end-of-text, then the document"""
    toks = []
    for ids in reference_tokens(docs):
        toks += [EOT] + ids
    return toks


def run_script(name, *args):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, os.path.join(DATA_DIR, name), *args,
           "--vocab-bpe", VOCAB_BPE, "--encoder-json", ENCODER_JSON]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"{name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_shard(testcase, path):
    """Check the header independently of data_common and return the tokens."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        toks = np.frombuffer(f.read(), dtype="<u2")
    testcase.assertEqual(header[0], 20240520, f"{path}: magic")
    testcase.assertEqual(header[1], 1, f"{path}: version")
    testcase.assertTrue(np.all(header[3:] == 0), f"{path}: header padding not zero")
    testcase.assertEqual(header[2], (size - 1024) // 2, f"{path}: count vs file size")
    testcase.assertEqual((size - 1024) % 2, 0)
    return toks.astype(np.int64).tolist()


def blank_line_documents(text):
    """Independent statement of the split rule: a document ends right after each "\\n\\n"."""
    docs, start = [], 0
    while True:
        i = text.find("\n\n", start)
        if i < 0:
            docs.append(text[start:])
            return docs
        docs.append(text[start:i + 2])
        start = i + 2


@unittest.skipUnless(HAVE_BPE, BPE_MSG)
class EncodingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.enc = dc.gpt2_encoding(VOCAB_BPE, ENCODER_JSON)

    def test_vocab(self):
        self.assertEqual(self.enc.n_vocab, 50257)
        self.assertEqual(self.enc.eot_token, EOT)

    # unicode (accents, CJK, emoji), digit runs, contractions, whitespace runs (spaces, tabs,
    # newlines, trailing), and end-of-text in the middle, at the start and twice in a row
    SAMPLES = ["Hello world! It's a test: 12345 tokens, 3.14159 and 1,000,000; 2024-05-20.",
               "\u00e9t\u00e9 \u2014 caf\u00e9 na\u00efve \u4f60\u597d\u4e16\u754c \U0001F600\U0001F44D \u0416\u0436 \u03c0\u2248",
               "  spaces   and\ttabs\t\tand\n\n\nnewlines  \n \n   ",
               "they'll we've I'm you're she'd it's DON'T",
               "before<|endoftext|>after", "<|endoftext|>first", "two<|endoftext|><|endoftext|> in a row",
               "", " ", "x"]

    def test_matches_transformers(self):
        want = reference_tokens(self.SAMPLES)
        for text, ids in zip(self.SAMPLES, want):
            self.assertEqual(self.enc.encode(text, allowed_special="all"), ids, repr(text))
            if "<|endoftext|>" not in text:
                self.assertEqual(self.enc.encode_ordinary(text), ids, repr(text))
            self.assertEqual(self.enc.decode(ids), text)

    def test_known_ids(self):  # GPT-2's ids, as published
        self.assertEqual(self.enc.encode_ordinary("Hello world"), [15496, 995])
        self.assertEqual(self.enc.encode("<|endoftext|>", allowed_special="all"), [EOT])


@unittest.skipUnless(HAVE_BPE, BPE_MSG)
class WriterTest(unittest.TestCase):
    def test_shard_roundtrip_and_range_check(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.bin")
            dc.write_token_shard(p, [0, 1, 65535, EOT])
            self.assertEqual(read_shard(self, p), [0, 1, 65535, EOT])
            dc.write_token_shard(p, [])
            self.assertEqual(read_shard(self, p), [])
            with self.assertRaises(AssertionError):
                dc.write_token_shard(p, [1, 65536])


@unittest.skipUnless(HAVE_BPE, BPE_MSG)
@unittest.skipUnless(HAVE_TEXT, TEXT_MSG)
class TinyShakespeareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.enc = dc.gpt2_encoding(VOCAB_BPE, ENCODER_JSON)
        cls.tmp = tempfile.TemporaryDirectory()
        with open(SHAKESPEARE, "r", encoding="utf-8") as f:
            cls.text = f.read()
        cls.input = os.path.join(cls.tmp.name, "input.txt")
        with open(cls.input, "w", encoding="utf-8") as f:
            f.write(cls.text)
        cls.out = os.path.join(cls.tmp.name, "out")
        cls.stdout = run_script("tinyshakespeare.py", "--input", cls.input, "--out-dir", cls.out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_files_present(self):
        self.assertEqual(sorted(os.listdir(self.out)),
                         ["gpt2_tokenizer.bin", "tiny_shakespeare_train.bin", "tiny_shakespeare_val.bin"])

    def test_shards(self):
        val = read_shard(self, os.path.join(self.out, "tiny_shakespeare_val.bin"))
        train = read_shard(self, os.path.join(self.out, "tiny_shakespeare_train.bin"))
        expected = reference_documents(blank_line_documents(self.text))
        self.assertGreater(len(expected), 32768, "text too short to exercise the split")
        self.assertEqual(val, expected[:32768])
        self.assertEqual(train, expected[32768:])
        self.assertEqual(val[0], EOT)
        self.assertEqual(expected.count(EOT), self.text.count("\n\n") + 1)
        self.assertEqual(self.enc.decode([t for t in val + train if t != EOT]), self.text)
        self.assertIn(str(len(expected)), self.stdout)

    def test_short_input_all_val(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "in.txt")
            text = self.text[:2000]
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
            run_script("tinyshakespeare.py", "--input", p, "--out-dir", d)
            val = read_shard(self, os.path.join(d, "tiny_shakespeare_val.bin"))
            train = read_shard(self, os.path.join(d, "tiny_shakespeare_train.bin"))
            self.assertEqual(val, reference_documents(blank_line_documents(text)))
            self.assertEqual(train, [])

    def test_tokenizer_file(self):
        path = os.path.join(self.out, "gpt2_tokenizer.bin")
        with open(path, "rb") as f:
            data = f.read()
        header = np.frombuffer(data[:1024], dtype="<u4")
        self.assertEqual(list(header[:4]), [20240328, 2, 50257, EOT])
        self.assertTrue(np.all(header[4:] == 0))
        entries, pos = [], 1024
        while pos < len(data):
            n = data[pos]
            self.assertGreater(n, 0)
            entries.append(data[pos + 1:pos + 1 + n])
            pos += 1 + n
        self.assertEqual(pos, len(data), "trailing partial entry")
        self.assertEqual(entries, reference_vocab())
        self.assertEqual(entries[EOT], b"<|endoftext|>")
        self.assertEqual(entries[15496], b"Hello")


@unittest.skipUnless(HAVE_BPE, BPE_MSG)
class FineWebTest(unittest.TestCase):
    SHARD = 1000

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        if HAVE_TEXT:
            with open(SHAKESPEARE, "r", encoding="utf-8") as f:
                text = f.read()[:16000]
            paras = text.split("\n\n")
            cls.docs = ["\n\n".join(paras[i:i + 7]) for i in range(0, len(paras), 7)]
        else:
            cls.docs = [f"Document {i}: " + "the quick brown fox jumps over the lazy dog. " * (20 + 13 * i)
                        for i in range(8)]
        cls.docs.append("unicode \u00e9\u4f60\u597d \U0001F600 and a \"quoted\" line\nnext")
        cls.jsonl = os.path.join(cls.tmp.name, "docs.jsonl")
        with open(cls.jsonl, "w", encoding="utf-8") as f:
            for d in cls.docs:
                f.write(json.dumps({"text": d, "id": "x"}) + "\n")
        cls.expected = reference_documents(cls.docs)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_output(self, out):
        n = len(self.expected)
        self.assertGreater(n, 2 * self.SHARD, "test documents too short")
        nshards = -(-n // self.SHARD)
        names = sorted(os.listdir(out))
        want = ["edu_fineweb_val_000000.bin"] + [f"edu_fineweb_train_{i:06d}.bin" for i in range(1, nshards)]
        self.assertEqual(names, sorted(want))
        allt = []
        for i, name in enumerate(want):
            toks = read_shard(self, os.path.join(out, name))
            if i < nshards - 1:
                self.assertEqual(len(toks), self.SHARD, name)
            else:
                self.assertEqual(len(toks), n - self.SHARD * (nshards - 1), name)
                self.assertGreater(len(toks), 0)
            allt += toks
        self.assertEqual(allt, self.expected)

    def test_single_worker(self):
        out = os.path.join(self.tmp.name, "out1")
        run_script("fineweb.py", "--input", self.jsonl, "--shard-size", str(self.SHARD), "--out-dir", out)
        self.check_output(out)

    def test_two_workers(self):
        out = os.path.join(self.tmp.name, "out2")
        run_script("fineweb.py", "--input", self.jsonl, "--shard-size", str(self.SHARD),
                   "--out-dir", out, "--workers", "2")
        self.check_output(out)

    def test_text_files_and_exact_multiple(self):
        # plain text files are one document each; a stream that ends exactly at a
        # shard boundary must not produce an empty trailing shard
        d = os.path.join(self.tmp.name, "txt")
        os.makedirs(d)
        paths = []
        for i, doc in enumerate(self.docs[:3]):
            paths.append(os.path.join(d, f"{i}.txt"))
            with open(paths[-1], "w", encoding="utf-8") as f:
                f.write(doc)
        expected = reference_documents(self.docs[:3])
        out = os.path.join(self.tmp.name, "out3")
        run_script("fineweb.py", "--input", *paths, "--shard-size", str(len(expected)), "--out-dir", out)
        self.assertEqual(os.listdir(out), ["edu_fineweb_val_000000.bin"])
        self.assertEqual(read_shard(self, os.path.join(out, "edu_fineweb_val_000000.bin")), expected)


if __name__ == "__main__":
    unittest.main(verbosity=2)
