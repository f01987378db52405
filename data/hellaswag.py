#!/usr/bin/env python3
"""Tokenize HellaSwag's validation set into llm.c's eval file.

Writes <out-dir>/hellaswag_val.bin (default <project>/data/hellaswag/), the file
`train_gpt -h 1` scores. Layout: data_common.py's docstring (llm.c's
write_evalfile). Each example is rendered as llm.c renders it for
completion-style scoring: the context `ctx` tokenized on its own, each ending
tokenized with a space put in front (GPT-2's tokens carry their leading space).

Input: the official hellaswag_val.jsonl (one JSON object per line with at
least "ctx", "endings" (4 strings) and "label" (0..3)), downloaded when no
--input is given.

Offline use:
  python3 data/hellaswag.py --input hellaswag_val.jsonl \\
      --vocab-bpe vocab.bpe --encoder-json encoder.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_common as dc  # noqa: E402

VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"


def read_examples(path):
    """The jsonl's examples; a bad line stops with one message naming it."""
    examples = []
    with open(path, "r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                ex = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"error: {where}: not JSON ({e})")
            if not isinstance(ex, dict):
                raise SystemExit(f"error: {where}: expected a JSON object")
            for key, kind, what in (("ctx", str, "a string"), ("endings", list, "a list"), ("label", int, "an integer")):
                if not isinstance(ex.get(key), kind):
                    raise SystemExit(f"error: {where}: field '{key}' missing or not {what}")
            if len(ex["endings"]) != dc.EVAL_ENDINGS or not all(isinstance(e, str) for e in ex["endings"]):
                raise SystemExit(f"error: {where}: expected {dc.EVAL_ENDINGS} endings as strings, "
                                 f"got {len(ex['endings'])}")
            if not 0 <= ex["label"] < dc.EVAL_ENDINGS:
                raise SystemExit(f"error: {where}: label {ex['label']}, expected 0..{dc.EVAL_ENDINGS - 1}")
            examples.append(ex)
    if not examples:
        raise SystemExit(f"error: {path}: no examples")
    return examples


def render(example, enc):
    return {
        "label": example["label"],
        "ctx_tokens": enc.encode_ordinary(example["ctx"]),
        "ending_tokens": [enc.encode_ordinary(" " + e) for e in example["endings"]],
    }


def main(argv=None):
    args = dc.single_file_args(__doc__, "hellaswag_val.jsonl", "hellaswag", argv)

    path = args.input
    if path is None:
        path = dc.download(VAL_URL, os.path.join(args.out_dir, "hellaswag_val.jsonl"),
                           "offline, pass a local copy with --input hellaswag_val.jsonl")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path}: no such file")
    examples = read_examples(path)
    enc = dc.gpt2_encoding(args.vocab_bpe, args.encoder_json)
    out = os.path.join(args.out_dir, "hellaswag_val.bin")
    try:
        dc.write_evalfile(out, [render(ex, enc) for ex in examples])
    except ValueError as e:
        raise SystemExit(f"error: {path}: {e}")
    print(f"wrote {len(examples)} examples to {out}")


if __name__ == "__main__":
    main()
