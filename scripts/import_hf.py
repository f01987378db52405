#!/usr/bin/env python3
"""Hugging Face GPT-2 -> llm.c checkpoint (what train_gpt -e loads), plus its tokenizer.

  /usr/bin/python3 scripts/import_hf.py SOURCE OUT.bin [--dtype float32|bfloat16] [--tokenizer-out PATH]

SOURCE is a directory as OpenAI's GPT-2s are published (config.json and model.safetensors or
pytorch_model.bin, sharded or not), or a Hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl), which
is downloaded first. OUT.bin is version 3 (fp32) or, with --dtype bfloat16, version 5; the
vocabulary is padded to a multiple of 128 with zero rows. When SOURCE has GPT-2's tokenizer
(vocab.json or encoder.json) it is written too, in llm.c's format, to --tokenizer-out (default
gpt2_tokenizer.bin beside OUT.bin).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
import data_common  # noqa: E402
from hf_gpt2 import (BUFFERS, CONFIG_KEYS, MERGES_FILES, VOCAB_FILES, ConversionError, find_file, hf_tensor_shapes,  # noqa: E402
                     hf_to_flat, parser, run)
from llmc_checkpoint import VERSION_FOR_DTYPE, pad_vocab, write_checkpoint  # noqa: E402

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def download(name):
    """A Hub model's files, fetched into Hugging Face's cache; returns the directory."""
    try:
        from huggingface_hub import snapshot_download
        wanted = ["config.json", "model.safetensors*", "model-*.safetensors", *VOCAB_FILES, *MERGES_FILES]
        d = snapshot_download(name, allow_patterns=wanted)
        if not any(f.endswith(".safetensors") for f in os.listdir(d)):  # older repositories: torch files only
            d = snapshot_download(name, allow_patterns=wanted + ["pytorch_model*.bin*"])
        return d
    except Exception as e:  # no network, no such repository, ...: the library's message says which
        raise ConversionError(f"{name}: not a directory, and downloading it from the Hugging Face Hub failed "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


def llmc_config(directory):
    """config.json -> llm.c's config; anything train_gpt's model does not compute is an error."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            c = json.load(f)
    except (OSError, ValueError) as e:
        raise ConversionError(f"{path}: cannot read a JSON config ({e})")
    if c.get("model_type") != "gpt2":
        raise ConversionError(f"{path}: model_type is {c.get('model_type')!r}, expected 'gpt2'")
    cfg = {}
    for key, hf_key in CONFIG_KEYS:
        v = c.get(hf_key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConversionError(f"{path}: {hf_key} is {v!r}, expected a positive integer")
        cfg[key] = v
    if cfg["C"] % cfg["NH"]:
        raise ConversionError(f"{path}: n_embd {cfg['C']} is not a multiple of n_head {cfg['NH']}")
    # what transformers' GPT-2 may be configured to do differently from GPT-2 (and train_gpt)
    same_as_gpt2 = [("activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new"),
                    ("layer_norm_epsilon", (1e-5,), 1e-5), ("n_inner", (None, 4 * cfg["C"]), None),
                    ("scale_attn_weights", (True,), True), ("scale_attn_by_inverse_layer_idx", (False,), False),
                    ("tie_word_embeddings", (True,), True)]
    for key, allowed, default in same_as_gpt2:
        if c.get(key, default) not in allowed:
            raise ConversionError(f"{path}: {key} is {c[key]!r}, expected {' or '.join(map(repr, allowed))} "
                                  "(train_gpt computes GPT-2 as published)")
    cfg["Vp"] = pad_vocab(cfg["V"])
    return cfg


def safetensors_dtypes(path):
    """The dtypes a .safetensors file holds, from its header: a little-endian uint64 length, then
    that many bytes of JSON naming each tensor's dtype, shape and place."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if size > os.path.getsize(path) - 8:
            raise ValueError(f"header of {size} bytes, longer than the file")
        header = json.loads(f.read(size))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def read_tensors(path):
    """name -> fp32 numpy array of one weight file. safetensors reads into numpy, except a file with
    bfloat16, which numpy lacks (safetensors' numpy reader fails on it, with a TypeError or, in
    0.3.x, an AttributeError): that one and torch's own files are read with torch."""
    if path.endswith(".safetensors") and "BF16" not in safetensors_dtypes(path):
        from safetensors import safe_open
        with safe_open(path, framework="np") as f:
            return {k: f.get_tensor(k).astype(np.float32) for k in f.keys()}
    import torch
    from safetensors.torch import load_file
    loaded = load_file(path) if path.endswith(".safetensors") else torch.load(path, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in loaded.items()}


def read_weights(directory):
    """All tensors of the model's weight files (one file or an index of shards)."""
    for name in WEIGHT_FILES:
        index = os.path.join(directory, name + ".index.json")
        if os.path.isfile(os.path.join(directory, name)):
            files = [name]
        elif os.path.isfile(index):
            try:
                with open(index) as f:
                    files = sorted(set(json.load(f)["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as e:
                raise ConversionError(f"{index}: expected a JSON index with a weight_map ({type(e).__name__}: {e})")
        else:
            continue
        tensors = {}
        for file in files:
            path = os.path.join(directory, file)
            try:
                tensors.update(read_tensors(path))
            except Exception as e:  # the libraries raise their own types for truncated or foreign files
                raise ConversionError(f"{path}: cannot read tensors ({type(e).__name__}: {e})")
        return tensors
    raise ConversionError(f"{directory}: no {' or '.join(WEIGHT_FILES)} (or their .index.json), expected GPT-2's weights")


def gpt2_tensors(tensors, cfg, directory):
    """Checks names and shapes against GPT-2's and returns the parameters by unprefixed HF name."""
    found = {}
    for name, t in tensors.items():
        name = name.removeprefix("transformer.")
        if not name.endswith(BUFFERS):
            found[name] = t
    lm_head = found.pop("lm_head.weight", None)
    expected = hf_tensor_shapes(cfg)
    missing = [n for n in expected if n not in found]
    if missing:
        raise ConversionError(f"{directory}: missing tensor(s) {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
                              f"of a GPT-2 with n_layer={cfg['L']}")
    unexpected = [n for n in found if n not in expected]
    if unexpected:
        raise ConversionError(f"{directory}: unexpected tensor(s) {', '.join(unexpected[:4])}, not part of GPT-2")
    for name, shape in expected.items():
        if found[name].shape != shape:
            raise ConversionError(f"{directory}: tensor {name} has shape {tuple(found[name].shape)}, expected {shape} "
                                  f"for n_embd={cfg['C']} vocab_size={cfg['V']} n_positions={cfg['maxT']}")
    if lm_head is not None and not np.array_equal(lm_head, found["wte.weight"]):
        raise ConversionError(f"{directory}: lm_head.weight differs from wte.weight; train_gpt's GPT-2 ties them")
    return found


def tokenizer_bytes(directory):
    """(each token id's bytes, end-of-text id) from GPT-2's vocab.json, or None without one."""
    path = find_file(directory, VOCAB_FILES)
    if path is None:
        return None
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}  # vocab.json spells each byte as one character
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)
    if sorted(vocab.values()) != list(range(len(vocab))) or "<|endoftext|>" not in vocab:
        raise ConversionError(f"{path}: expected GPT-2's vocabulary (ids 0..n-1 and <|endoftext|>)")
    tokens = [b""] * len(vocab)
    for text, i in vocab.items():
        if not all(ch in byte_of for ch in text):
            raise ConversionError(f"{path}: token {i} {text!r} is not spelled in GPT-2's byte alphabet")
        tokens[i] = bytes(byte_of[ch] for ch in text)
    return tokens, vocab["<|endoftext|>"]


def main():
    ap = parser(__doc__)
    ap.add_argument("source", help="Hugging Face GPT-2 directory, or a Hub name such as gpt2")
    ap.add_argument("out", help="llm.c checkpoint to write")
    ap.add_argument("--tokenizer-out", help="where the tokenizer goes (default: gpt2_tokenizer.bin beside OUT)")
    a = ap.parse_args()

    directory = a.source
    if not os.path.isdir(directory):
        if os.path.exists(directory) or directory.startswith((".", "/", "~")):
            raise ConversionError(f"{directory}: not a directory (expected a Hugging Face GPT-2 directory or Hub name)")
        directory = download(directory)
    cfg = llmc_config(directory)
    flat = hf_to_flat(gpt2_tensors(read_weights(directory), cfg, directory), cfg)
    tokenizer = tokenizer_bytes(directory)  # read before anything is written, so a bad one writes nothing

    write_checkpoint(a.out, cfg, flat, a.dtype)
    print(f"wrote {a.out}: version {VERSION_FOR_DTYPE[a.dtype]}, L={cfg['L']} NH={cfg['NH']} C={cfg['C']} "
          f"V={cfg['V']} (padded {cfg['Vp']}) maxT={cfg['maxT']}, {flat.size} parameters")
    if tokenizer is not None:
        path = a.tokenizer_out or os.path.join(os.path.dirname(a.out), "gpt2_tokenizer.bin")
        data_common.write_tokenizer_bytes(path, *tokenizer)
        print(f"wrote {path}: {len(tokenizer[0])} tokens, end-of-text {tokenizer[1]}")
    return 0


if __name__ == "__main__":
    run("import_hf", main)
