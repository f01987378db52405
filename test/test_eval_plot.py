#!/usr/bin/env python3
"""HellaSwag end to end, and the plot of a real run.

A small jsonl in the official schema goes through data/hellaswag.py (its
tokens checked against transformers' GPT-2 tokenizer, an independent one);
train_gpt trains a small checkpoint on Tiny Shakespeare with -h 1, then
scores that checkpoint on 1 rank and on 2 ranks at ZeRO stage 3, and must
agree with scripts/hellaswag_reference.py (transformers' GPT-2 in float64):
the same k/n and each ending's mean loss within LOSS_TOL. scripts/plot_log.py
draws the training run's main.log, also with its last line cut short, and
without matplotlib says in one line how to install it.

Run from the project root with the Python that has torch and transformers:
  /usr/bin/python3 test/test_eval_plot.py
data/hellaswag.py runs under $DATA_PYTHON (default: python3 on the PATH, which
needs tiktoken).
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from transformers import GPT2Tokenizer

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plot_log  # noqa: E402
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "data"))
BPE = ["--vocab-bpe", os.path.join(SHARED, "gpt2", "vocab.bpe"),
       "--encoder-json", os.path.join(SHARED, "gpt2", "encoder.json")]
DATA_PYTHON = os.environ.get("DATA_PYTHON", shutil.which("python3"))
MPIRUN = ["mpirun", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS"]
# fp32 forward (CPU backend) against a float64 one: the mean losses (about 6 to 10) differ by
# about 1e-6 here; 1e-4 leaves room for other BLAS kernels
LOSS_TOL = 1e-4
TINY = ["-e", "L=2,NH=2,C=32", "-b", "4", "-t", "32", "-s", "0", "--device", "cpu"]

# Official schema (ind, activity_label, ctx_a, ctx_b, ctx, split, split_type, label, endings,
# source_id); contexts from Tiny Shakespeare, so the trained model has something to go on.
EXAMPLES = [
    ("First Citizen:", "Before we proceed any further, hear me", 0,
     ["speak.", "install the driver from the vendor's site.", "buy two tickets online today.", "reboot the server at noon."]),
    ("All:", "Speak,", 1,
     ["the quarterly report is due on Monday.", "speak.", "click the blue button twice.", "the bus leaves at seven."]),
    ("First Citizen:", "You are all resolved rather to die than to", 2,
     ["update the spreadsheet.", "charge the phone overnight.", "famish?", "email the support team."]),
    ("MENENIUS:", "What work's, my countrymen, in hand? where go you", 3,
     ["to the gym after lunch.", "online to order pizza.", "to the airport by taxi.", "With bats and clubs? speak."]),
    ("CORIOLANUS:", "He that will give good words to thee will flatter Beneath", 0,
     ["abhorring. What would you have, you curs,", "the new software release notes.", "a spreadsheet of sales figures.", "the parking garage downtown."]),
    ("KING RICHARD II:", "Now, my lord, what say you", 1,
     ["to the weather app?", "to this, my gracious lord?", "about the stock price?", "of the football score?"]),
    ("ROMEO:", "But, soft! what light through yonder window", 2,
     ["runs the dishwasher?", "loads the web page?", "breaks? It is the east, and Juliet is the sun.", "prints the receipt?"]),
]


def write_jsonl(path, examples):
    with open(path, "w") as f:
        for i, (a, b, label, endings) in enumerate(examples):
            f.write(json.dumps({"ind": 100 + i, "activity_label": "Shakespeare", "ctx_a": a, "ctx_b": b,
                                "ctx": a + " " + b, "split": "val", "split_type": "indomain", "label": label,
                                "endings": endings, "source_id": f"tinyshakespeare~{i}"}) + "\n")


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def run(cmd, env=(), **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **dict(env))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, **kw)


def check_run(testcase, cmd):
    r = run(cmd)
    testcase.assertEqual(r.returncode, 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_eval_file(path):
    """llm.c's eval file, parsed here from its description: [(label, context, [endings])], longest."""
    data = read(path, "rb")
    header = np.frombuffer(data[:1024], dtype="<i4")
    stream = np.frombuffer(data[1024:], dtype="<u2").tolist()
    examples, at = [], 0
    while at < len(stream):
        marker, nbytes, index, label, n_endings = stream[at:at + 5]
        assert (marker, index, n_endings) == (65535, len(examples), 4), (marker, index, n_endings)
        body, at = stream[at + 5:at + nbytes // 2], at + nbytes // 2
        parts = []
        while body:
            parts.append(body[1:1 + body[0]])
            body = body[1 + body[0]:]
        examples.append((label, parts[0], parts[1:]))
    return header, examples


class Fixture:
    """The eval file and a short real run with -h 1, shared by all tests: its checkpoint is
    scored, its main.log plotted."""
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="hellaswag_test_")
        self.jsonl = os.path.join(self.dir, "hellaswag_val.jsonl")
        self.bin = os.path.join(self.dir, "hellaswag_val.bin")
        write_jsonl(self.jsonl, EXAMPLES)
        r = run([DATA_PYTHON, "data/hellaswag.py", "--input", self.jsonl, "--out-dir", self.dir, *BPE])
        assert r.returncode == 0, r.stdout + r.stderr
        self.train_out = os.path.join(self.dir, "train")
        r = run(["./train_gpt", *TINY, "-x", "30", "-l", "3e-3", "-v", "10", "-m", "2", "-h", "1",
                 "--hellaswag-file", self.bin, "-o", self.train_out])
        assert r.returncode == 0, r.stdout + r.stderr
        self.train_stdout = r.stdout
        self.model = os.path.join(self.train_out, "model_00000030.bin")


FIX = None


def setUpModule():
    global FIX
    FIX = Fixture()


def tearDownModule():
    shutil.rmtree(FIX.dir)


class HellaSwag(unittest.TestCase):

    def test_eval_file_holds_the_tokens_an_independent_tokenizer_gives(self):
        tok = GPT2Tokenizer(vocab_file=BPE[3], merges_file=BPE[1])
        header, examples = read_eval_file(FIX.bin)
        expected = [(label, tok.encode(a + " " + b), [tok.encode(" " + e) for e in endings])
                    for a, b, label, endings in EXAMPLES]
        self.assertEqual(examples, expected)
        stream_bytes = os.path.getsize(FIX.bin) - 1024
        self.assertEqual(header[:3].tolist(), [20240522, 1, len(EXAMPLES)])
        sizes = [2 * (5 + 1 + len(c) + sum(1 + len(e) for e in ends)) for _, c, ends in expected]
        self.assertEqual(header[3], max(sizes))
        self.assertTrue(np.all(header[4:] == 0))
        self.assertEqual(stream_bytes, sum(sizes))

    def test_bad_jsonl_is_one_line_and_no_file(self):
        good = json.loads(read(FIX.jsonl).splitlines()[0])
        cases = [
            (dict(good, endings=good["endings"][:3]), "expected 4 endings as strings, got 3"),
            (dict(good, label=4), "label 4, expected 0..3"),
            ({k: v for k, v in good.items() if k != "ctx"}, "field 'ctx' missing or not a string"),
            ("{not json", "not JSON"),
        ]
        for bad, message in cases:
            with self.subTest(message=message), tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "bad.jsonl")
                with open(path, "w") as f:
                    f.write(json.dumps(good) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n")
                r = run([DATA_PYTHON, "data/hellaswag.py", "--input", path, "--out-dir", d, *BPE])
                self.assertNotEqual(r.returncode, 0)
                lines = r.stderr.splitlines()
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertTrue(lines[0].startswith(f"error: {path}:2: {message}"), lines[0])
                self.assertEqual(os.listdir(d), ["bad.jsonl"])

    def test_matches_the_pytorch_reference_on_1_and_2_ranks(self):
        ref_path = os.path.join(FIX.dir, "reference.json")
        check_run(self, [sys.executable, "scripts/hellaswag_reference.py", "--model", FIX.model, "--input", FIX.jsonl,
                         *BPE, "--out", ref_path])
        ref = json.loads(read(ref_path))
        ref_losses = np.array(ref["ending_losses"])
        # acc_norm is only comparable where the best ending wins by more than the tolerance
        ordered = np.sort(ref_losses, axis=1)
        self.assertGreater((ordered[:, 1] - ordered[:, 0]).min(), 10 * LOSS_TOL)
        self.assertTrue(0 < ref["correct"] < ref["total"], "the test needs right and wrong answers")
        # 2 examples per forward on 1 rank; 4 + 3 examples, one per forward, on 2 ranks
        for name, launcher, extra in (("1 rank", [], ["-b", "8"]), ("2 ranks, ZeRO-3", MPIRUN, ["-z", "3"])):
            with self.subTest(name):
                out = os.path.join(FIX.dir, name.replace(" ", "_").replace(",", ""))
                dump = out + ".losses"
                # -l 0: the one training step leaves the checkpoint as it was
                stdout = check_run(self, [*launcher, "./train_gpt", *TINY, "-e", FIX.model, "-x", "1", "-l", "0", "-v", "0",
                                          "-h", "1", "--hellaswag-file", FIX.bin, "--hellaswag-dump", dump, "-o", out, *extra])
                self.assertIn(f"HellaSwag: {ref['correct']}/{ref['total']} = {ref['acc_norm']:f}\n", stdout)
                rows = np.loadtxt(dump)
                self.assertEqual(rows[:, :2].astype(int).tolist(), [[i, l] for i, l in enumerate(ref["labels"])])
                worst = np.abs(rows[:, 2:] - ref_losses).max()
                self.assertLess(worst, LOSS_TOL, f"largest difference from the reference: {worst:g}")
                self.assertEqual(np.argmin(rows[:, 2:], axis=1).tolist(), np.argmin(ref_losses, axis=1).tolist())
                log = read(os.path.join(out, "main.log"))
                self.assertIn(f"s:1 eval:{ref['acc_norm']:f}\n", log)  # at the end: after the update

    def test_training_run_logs_hellaswag_every_val_step_and_at_the_end(self):
        steps = [int(m) for m in re.findall(r"^s:(\d+) eval:[0-9.]+$", read(os.path.join(FIX.train_out, "main.log")), re.M)]
        self.assertEqual(steps, [10, 20, 30])  # the last after the 30th update, as llm.c
        self.assertEqual(len(re.findall(r"^HellaSwag: \d+/7 = [0-9.]+$", FIX.train_stdout, re.M)), 3)

    def test_missing_file_is_one_line(self):
        r = run(["./train_gpt", *TINY, "-x", "1", "-v", "0", "-o", "", "-h", "1", "--hellaswag-file", "/nonexistent/h.bin"])
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.splitlines(), ["error: cannot open HellaSwag file /nonexistent/h.bin (data/hellaswag.py writes it)"])
        self.assertNotIn("step", r.stdout)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


class PlotLog(unittest.TestCase):
    def plot(self, *args):
        return run([sys.executable, "scripts/plot_log.py", *args])

    def test_plots_a_real_main_log(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "plot.png")
            r = self.plot(os.path.join(FIX.train_out, "main.log"), "--size", "124M", "--tokens-per-step", "512", "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(png_size(out), (800, 320))  # 10 x 4 inches at 80 dpi
            self.assertGreater(os.path.getsize(out), 10000)

    def test_a_last_line_cut_short_is_left_out(self):  # a run still writing, or killed mid-line
        whole = read(os.path.join(FIX.train_out, "main.log"))
        last = whole.rindex("s:", 0, len(whole) - 1)
        with tempfile.TemporaryDirectory() as d:
            complete, log = os.path.join(d, "complete.log"), os.path.join(d, "main.log")
            with open(complete, "w") as f:
                f.write(whole[:last])
            for cut in range(last + 1, len(whole)):
                with open(log, "w") as f:
                    f.write(whole[:cut])
                self.assertEqual(plot_log.read_log(log), plot_log.read_log(complete), whole[last:cut])
            out = os.path.join(d, "plot.png")
            r = self.plot(log, "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(png_size(out), (800, 320))

    def test_without_matplotlib_one_line_names_the_install(self):
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "matplotlib"))  # a matplotlib whose import fails, as where none is installed
            with open(os.path.join(d, "matplotlib", "__init__.py"), "w") as f:
                f.write("raise ImportError('No module named matplotlib')\n")
            out = os.path.join(d, "plot.png")
            r = run([sys.executable, "scripts/plot_log.py", os.path.join(FIX.train_out, "main.log"), "-o", out],
                    env={"PYTHONPATH": d})
            self.assertNotEqual(r.returncode, 0)
            self.assertEqual(r.stderr.splitlines(), ["plot_log: error: matplotlib is not installed "
                                                     "(pip install matplotlib, or apt-get install python3-matplotlib)"])
            self.assertFalse(os.path.exists(out))

    def test_missing_or_empty_log_fails_cleanly(self):
        with tempfile.TemporaryDirectory() as d:
            empty, garbled = os.path.join(d, "empty.log"), os.path.join(d, "garbled.log")
            open(empty, "w").close()
            with open(garbled, "w") as f:
                f.write("s:0 trl:1.5\nnot a log line\n")
            out = os.path.join(d, "plot.png")
            for log, message in ((os.path.join(d, "none.log"), "cannot open"), (empty, "no s:<step> lines"),
                                 (garbled, "garbled.log:2: expected 's:<step> trl:|tel:|eval:<value>'")):
                with self.subTest(message):
                    r = self.plot(log, "-o", out)
                    self.assertEqual(r.returncode, 1)
                    self.assertEqual(len(r.stderr.splitlines()), 1)
                    self.assertIn(f"plot_log: error: {log}", r.stderr)
                    self.assertIn(message, r.stderr)
                    self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
