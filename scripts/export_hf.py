#!/usr/bin/env python3
"""llm.c checkpoint (version 3 or 5) -> a Hugging Face GPT-2 directory, for lm-evaluation-harness.

  /usr/bin/python3 scripts/export_hf.py model_N.bin OUT_DIR [--dtype float32|bfloat16] [--tokenizer DIR]

OUT_DIR gets config.json and model.safetensors, which
transformers.GPT2LMHeadModel.from_pretrained(OUT_DIR) loads: the padded vocabulary rows are
dropped, and lm_head is not stored because GPT-2 ties it to wte (transformers ties it again on
load, as for OpenAI's files). With --tokenizer DIR (GPT-2's vocab.json and merges.txt, or
OpenAI's encoder.json and vocab.bpe) the tokenizer files go into OUT_DIR too. Everything is
written into a new directory beside OUT_DIR first, so a failure leaves OUT_DIR as it was.
"""
import os
import shutil
import tempfile

from hf_gpt2 import CONFIG_KEYS, MERGES_FILES, VOCAB_FILES, ConversionError, find_file, flat_to_hf, parser, run
from llmc_checkpoint import read_checkpoint

GPT2_EOT = 50256


def gpt2_tokenizer(directory, V):
    """transformers' GPT-2 tokenizer from DIR's files, checked against the model's vocabulary."""
    vocab, merges = find_file(directory, VOCAB_FILES), find_file(directory, MERGES_FILES)
    if vocab is None or merges is None:
        raise ConversionError(f"{directory}: expected GPT-2's tokenizer files ({' or '.join(VOCAB_FILES)} and "
                              f"{' or '.join(MERGES_FILES)})")
    from transformers import GPT2Tokenizer
    tokenizer = GPT2Tokenizer(vocab, merges)
    if len(tokenizer) != V:
        raise ConversionError(f"{directory}: the tokenizer has {len(tokenizer)} tokens, the model's vocabulary {V}")
    return tokenizer


def write_hf(out_dir, cfg, flat, dtype, tokenizer):
    import torch
    from safetensors.torch import save_file
    from transformers import GPT2Config
    torch_dtype = getattr(torch, dtype)
    tensors = {"transformer." + k: torch.from_numpy(v).to(torch_dtype) for k, v in flat_to_hf(flat, cfg).items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    eot = min(GPT2_EOT, cfg["V"] - 1)  # GPT-2's end-of-text, or the last token of a smaller vocabulary
    GPT2Config(**{hf_key: cfg[key] for key, hf_key in CONFIG_KEYS},
               bos_token_id=eot, eos_token_id=eot, architectures=["GPT2LMHeadModel"],
               torch_dtype=dtype).save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def main():
    ap = parser(__doc__)
    ap.add_argument("checkpoint", help="llm.c checkpoint (model_N.bin)")
    ap.add_argument("out_dir", help="Hugging Face model directory to write")
    ap.add_argument("--tokenizer", metavar="DIR", help="directory with GPT-2's tokenizer files to include")
    a = ap.parse_args()

    cfg, flat = read_checkpoint(a.checkpoint)
    tokenizer = gpt2_tokenizer(a.tokenizer, cfg["V"]) if a.tokenizer else None
    out_dir = os.path.abspath(a.out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConversionError(f"{a.out_dir}: exists and is not a directory")
    try:
        staging = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp", dir=os.path.dirname(out_dir))
    except OSError as e:
        raise ConversionError(f"cannot create a directory beside {a.out_dir}: {e.strerror}")
    try:
        write_hf(staging, cfg, flat, a.dtype, tokenizer)
        if os.path.isdir(out_dir):  # replace what an earlier export left, file by file
            for name in os.listdir(staging):
                os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
        else:
            os.rename(staging, out_dir)
    except OSError as e:
        raise ConversionError(f"cannot write {a.out_dir}: {e.strerror}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {a.out_dir}: GPT-2 L={cfg['L']} NH={cfg['NH']} C={cfg['C']} V={cfg['V']} maxT={cfg['maxT']}, "
          f"{a.dtype}{', with tokenizer' if tokenizer else ''}")
    return 0


if __name__ == "__main__":
    run("export_hf", main)
