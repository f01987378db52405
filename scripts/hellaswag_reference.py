#!/usr/bin/env python3
"""Independent HellaSwag scoring of an llm.c checkpoint, the reference for `train_gpt -h 1`.

Independent of the trainer and of data/hellaswag.py: the jsonl is tokenized
with transformers' GPT-2 tokenizer (not tiktoken) and the checkpoint runs in
transformers' GPT2LMHeadModel, in float64. The scoring is llm.c's
completion style (dev/data/hellaswag.py): for each ending, the mean
cross-entropy of its tokens (tokenized with a leading space) after the
context; acc_norm counts the examples whose lowest mean is the label's.

  /usr/bin/python3 scripts/hellaswag_reference.py --model model.bin \\
      --input hellaswag_val.jsonl --vocab-bpe vocab.bpe --encoder-json encoder.json \\
      [--out scores.json]

Prints "HellaSwag: k/n = acc"; --out writes {"correct", "total", "acc_norm",
"labels", "ending_losses": [[4 means] per example]} as JSON.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_gpt2 import BUFFERS, ConversionError, flat_to_hf, run  # noqa: E402
from llmc_checkpoint import read_checkpoint  # noqa: E402


def transformers_model(path):
    """The llm.c checkpoint as transformers' GPT2LMHeadModel, in float64 (lm_head tied to wte)."""
    cfg, flat = read_checkpoint(path)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=cfg["V"], n_positions=cfg["maxT"], n_embd=cfg["C"],
                                       n_layer=cfg["L"], n_head=cfg["NH"])).double().eval()
    tensors = {"transformer." + k: torch.from_numpy(v).double() for k, v in flat_to_hf(flat, cfg).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or any(k != "lm_head.weight" and not k.endswith(BUFFERS) for k in missing):  # lm_head is wte
        raise ConversionError(f"{path}: tensors do not map onto GPT2LMHeadModel (missing {missing}, unexpected {unexpected})")
    return model


@torch.no_grad()
def ending_losses(model, tok, example):
    """Mean loss of each ending's tokens after the context."""
    ctx = tok.encode(example["ctx"])
    means = []
    for ending in example["endings"]:
        end = tok.encode(" " + ending)
        row = torch.tensor([ctx + end])
        logits = model(row).logits[0]
        # the logits at position i predict token i+1: the ending's tokens are predicted from len(ctx)-1 on
        means.append(F.cross_entropy(logits[len(ctx) - 1:-1], row[0, len(ctx):]).item())
    return means


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="llm.c checkpoint (version 3 or 5)")
    ap.add_argument("--input", required=True, help="HellaSwag jsonl (ctx, endings, label per line)")
    ap.add_argument("--vocab-bpe", required=True)
    ap.add_argument("--encoder-json", required=True)
    ap.add_argument("--out", help="JSON file for the per-ending losses")
    a = ap.parse_args()
    model = transformers_model(a.model)
    tok = GPT2Tokenizer(vocab_file=a.encoder_json, merges_file=a.vocab_bpe)
    with open(a.input, encoding="utf-8") as f:
        examples = [json.loads(line) for line in f if line.strip()]
    losses = [ending_losses(model, tok, ex) for ex in examples]
    labels = [ex["label"] for ex in examples]
    correct = sum(min(range(4), key=lambda c: (m[c], c)) == label for m, label in zip(losses, labels))
    print(f"HellaSwag: {correct}/{len(examples)} = {correct / len(examples):f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"correct": correct, "total": len(examples), "acc_norm": correct / len(examples),
                       "labels": labels, "ending_losses": losses}, f)
    return 0


if __name__ == "__main__":
    run("hellaswag_reference", main)
