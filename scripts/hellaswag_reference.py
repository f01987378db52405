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
from gpt2_reference import FixtureError, load_model, split_params  # noqa: E402


def transformers_model(path):
    """The llm.c checkpoint as a transformers GPT-2 (its Conv1D weights are our matrices transposed)."""
    cfg, flat = load_model(path)
    p = split_params(flat.double(), cfg)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=cfg["V"], n_positions=cfg["maxT"], n_embd=cfg["C"],
                                       n_layer=cfg["L"], n_head=cfg["NH"], resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                       activation_function="gelu_new")).double().eval()
    sd = {"transformer.wte.weight": p["wte"][:cfg["V"]], "transformer.wpe.weight": p["wpe"],
          "transformer.ln_f.weight": p["lnfw"], "transformer.ln_f.bias": p["lnfb"]}
    for l in range(cfg["L"]):
        h = f"transformer.h.{l}."
        sd.update({h + "ln_1.weight": p["ln1w"][l], h + "ln_1.bias": p["ln1b"][l],
                   h + "attn.c_attn.weight": p["qkvw"][l].T, h + "attn.c_attn.bias": p["qkvb"][l],
                   h + "attn.c_proj.weight": p["attprojw"][l].T, h + "attn.c_proj.bias": p["attprojb"][l],
                   h + "ln_2.weight": p["ln2w"][l], h + "ln_2.bias": p["ln2b"][l],
                   h + "mlp.c_fc.weight": p["fcw"][l].T, h + "mlp.c_fc.bias": p["fcb"][l],
                   h + "mlp.c_proj.weight": p["fcprojw"][l].T, h + "mlp.c_proj.bias": p["fcprojb"][l]})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied, as in GPT-2
    missing, unexpected = model.load_state_dict({k: v.contiguous() for k, v in sd.items()}, strict=False)
    if unexpected or any(not k.endswith(("attn.bias", "attn.masked_bias")) for k in missing):
        raise FixtureError(f"{path}: weights do not map onto GPT2LMHeadModel ({missing}, {unexpected})")
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
    try:
        sys.exit(main())
    except (FixtureError, OSError) as e:
        print(f"hellaswag_reference: error: {e}", file=sys.stderr)
        sys.exit(2)
