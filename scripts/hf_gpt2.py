"""Hugging Face GPT-2 <-> llm.c checkpoint: which HF tensor is which llm.c tensor, both ways.

HF keeps GPT-2's linear layers as Conv1D, whose weight is (in, out): the transpose of llm.c's
(out, in), which is nn.Linear's. A layer's tensors are h.{l}.NAME in HF and one stacked tensor
over l in llm.c. HF's wte has V rows, llm.c's Vp (padded with zero rows); lm_head is wte in both.
"""
import argparse
import os
import sys

import numpy as np

from llmc_checkpoint import VERSION_FOR_DTYPE, CheckpointError, param_shapes, split

# llm.c tensor -> HF name (a layer's names without the "h.{l}." in front)
HF_NAMES = {
    "wte": "wte.weight", "wpe": "wpe.weight",
    "ln1w": "ln_1.weight", "ln1b": "ln_1.bias",
    "qkvw": "attn.c_attn.weight", "qkvb": "attn.c_attn.bias",
    "attprojw": "attn.c_proj.weight", "attprojb": "attn.c_proj.bias",
    "ln2w": "ln_2.weight", "ln2b": "ln_2.bias",
    "fcw": "mlp.c_fc.weight", "fcb": "mlp.c_fc.bias",
    "fcprojw": "mlp.c_proj.weight", "fcprojb": "mlp.c_proj.bias",
    "lnfw": "ln_f.weight", "lnfb": "ln_f.bias",
}
CONV1D = {"qkvw", "attprojw", "fcw", "fcprojw"}
PER_LAYER = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"}
# buffers, not parameters (the causal mask and its fill value), which older files carry; the dot
# keeps c_attn.bias out
BUFFERS = (".attn.bias", ".attn.masked_bias")
# llm.c's header fields and the config.json keys that carry them
CONFIG_KEYS = (("L", "n_layer"), ("NH", "n_head"), ("C", "n_embd"), ("V", "vocab_size"), ("maxT", "n_positions"))

# GPT-2's tokenizer files: Hugging Face's names, then OpenAI's (the same contents)
VOCAB_FILES = ("vocab.json", "encoder.json")
MERGES_FILES = ("merges.txt", "vocab.bpe")


class ConversionError(Exception):
    """Input that is not a GPT-2 we can convert; the message says what was wrong and what was expected."""


def hf_tensor_shapes(cfg):
    """HF name -> shape, for the tensors a GPT-2 of this config must have (names without a prefix)."""
    shapes = {}
    for name, shape in param_shapes(cfg["L"], cfg["C"], cfg["V"], cfg["maxT"]):
        one = shape[1:] if name in PER_LAYER else shape
        one = tuple(reversed(one)) if name in CONV1D else tuple(one)
        if name in PER_LAYER:
            shapes.update({f"h.{l}.{HF_NAMES[name]}": one for l in range(cfg["L"])})
        else:
            shapes[HF_NAMES[name]] = one
    return shapes


def hf_to_flat(tensors, cfg):
    """HF name -> fp32 numpy array (checked by the caller against hf_tensor_shapes) -> llm.c's flat array."""
    parts = []
    for name, shape in param_shapes(cfg["L"], cfg["C"], cfg["Vp"], cfg["maxT"]):
        if name in PER_LAYER:
            t = np.stack([tensors[f"h.{l}.{HF_NAMES[name]}"] for l in range(cfg["L"])])
            t = t.transpose(0, 2, 1) if name in CONV1D else t
        else:
            t = tensors[HF_NAMES[name]]
        if name == "wte":
            t = np.concatenate([t, np.zeros((cfg["Vp"] - cfg["V"], cfg["C"]), dtype=np.float32)])
        assert t.shape == shape, (name, t.shape, shape)
        parts.append(np.ascontiguousarray(t, dtype=np.float32).ravel())
    return np.concatenate(parts)


def flat_to_hf(flat, cfg):
    """llm.c's flat array -> HF name -> fp32 numpy array (padded vocabulary rows dropped)."""
    tensors = {}
    for name, t in split(flat, cfg).items():
        if name in PER_LAYER:
            for l in range(cfg["L"]):
                tensors[f"h.{l}.{HF_NAMES[name]}"] = np.ascontiguousarray(t[l].T if name in CONV1D else t[l])
        else:
            tensors[HF_NAMES[name]] = np.ascontiguousarray(t[:cfg["V"]] if name == "wte" else t)
    return tensors


def find_file(directory, names):
    """The first of names present in directory, or None."""
    for n in names:
        if os.path.isfile(os.path.join(directory, n)):
            return os.path.join(directory, n)
    return None


def parser(doc):
    """Both scripts' command line: their docstring as help, and --dtype."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=list(VERSION_FOR_DTYPE), default="float32",
                    help="the weights written: float32 or bfloat16 (a checkpoint's version 3 or 5; default %(default)s)")
    return ap


def run(prog, main):
    """Runs main(); a bad input ends it with one line on stderr and exit code 1."""
    try:
        sys.exit(main())
    except (ConversionError, CheckpointError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)
