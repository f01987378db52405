#!/usr/bin/env python3
"""Tokenize FineWeb-Edu / FineWeb with the GPT-2 tokenizer into llm.c token shards.

Every document gets <|endoftext|> put in front of it; the token stream is
packed into shards of exactly --shard-size tokens (the last one may be
partial). Shard 0 is the validation shard, the rest are training shards:
  <prefix>_val_000000.bin, <prefix>_train_000001.bin, <prefix>_train_000002.bin, ...
with <prefix> = "edu_fineweb" (--type edu) or "fineweb" (--type classic).

Sources:
  --input FILE [FILE ...]  local files, for offline use and tests: a .jsonl
                           file gives one document per line (its "text"
                           field); any other file is one document.
  (no --input)             download HuggingFaceFW/fineweb-edu (or fineweb),
                           subset sample-10BT / sample-100BT, via the HF
                           `datasets` package (needs network).
"""
import argparse
import json
import multiprocessing as mp
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_common as dc  # noqa: E402

DATASETS = {"edu": ("HuggingFaceFW/fineweb-edu", "edu_fineweb"),
            "classic": ("HuggingFaceFW/fineweb", "fineweb")}
REMOTE_NAMES = {"10B": "sample-10BT", "100B": "sample-100BT"}


def iter_local_documents(paths):
    for path in paths:
        if path.endswith(".jsonl"):
            with open(path, "r", encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)["text"]
                    except (ValueError, KeyError) as e:
                        raise SystemExit(f"{path}:{lineno}: expected a JSON object with a \"text\" field ({e})")
        else:
            with open(path, "r", encoding="utf-8") as f:
                yield f.read()


def iter_remote_documents(kind, version, streaming):
    try:
        from datasets import load_dataset
    except ImportError:
        raise SystemExit("the HF `datasets` package is needed to download FineWeb "
                         "(pip install datasets), or pass local files with --input")
    ds = load_dataset(DATASETS[kind][0], name=REMOTE_NAMES[version], split="train",
                      streaming=streaming)
    for row in ds:
        yield row["text"]


_ENC = None


def _init_worker(vocab_bpe, encoder_json):
    global _ENC
    _ENC = dc.gpt2_encoding(vocab_bpe, encoder_json)


def tokenize_document(text):
    """EOT followed by the document's tokens, as a uint16 array."""
    toks = [_ENC.eot_token]
    toks.extend(_ENC.encode_ordinary(text))
    arr = np.array(toks, dtype=np.int64)
    assert arr.max() < 2 ** 16, "token id too large for uint16"
    return arr.astype(np.uint16)


class ShardWriter:
    """Packs a token stream into shards of exactly shard_size tokens."""

    def __init__(self, out_dir, prefix, shard_size):
        self.out_dir, self.prefix, self.shard_size = out_dir, prefix, shard_size
        self.buf = np.empty(shard_size, dtype=np.uint16)
        self.fill = 0
        self.index = 0
        self.paths = []
        self.total = 0

    def _flush(self):
        split = "val" if self.index == 0 else "train"
        path = os.path.join(self.out_dir, f"{self.prefix}_{split}_{self.index:06d}.bin")
        dc.write_token_shard(path, self.buf[:self.fill])
        print(f"wrote {self.fill} tokens to {path}", flush=True)
        self.paths.append(path)
        self.index += 1
        self.fill = 0

    def add(self, toks):
        self.total += len(toks)
        pos = 0
        while pos < len(toks):
            n = min(self.shard_size - self.fill, len(toks) - pos)
            self.buf[self.fill:self.fill + n] = toks[pos:pos + n]
            self.fill += n
            pos += n
            if self.fill == self.shard_size:
                self._flush()

    def close(self):
        if self.fill:
            self._flush()
        return self.paths


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--type", choices=sorted(DATASETS), default="edu",
                   help="FineWeb-Edu or classic FineWeb (default: %(default)s)")
    p.add_argument("--version", choices=sorted(REMOTE_NAMES), default="10B",
                   help="sample size to download (default: %(default)s)")
    p.add_argument("--input", nargs="+", default=None,
                   help="local .jsonl / text files instead of downloading")
    p.add_argument("--shard-size", type=int, default=10 ** 8,
                   help="tokens per shard (default: %(default)s)")
    p.add_argument("--out-dir", default=None,
                   help="output directory (default: <project>/data/<prefix><version>)")
    p.add_argument("--workers", type=int, default=1,
                   help="tokenizer processes (default: %(default)s)")
    p.add_argument("--streaming", action="store_true",
                   help="stream the HF dataset instead of downloading it fully first")
    dc.add_tokenizer_args(p)
    args = p.parse_args(argv)
    if args.shard_size <= 0:
        p.error("--shard-size must be positive")
    if args.workers <= 0:
        p.error("--workers must be positive")
    if bool(args.vocab_bpe) != bool(args.encoder_json):
        p.error("give both --vocab-bpe and --encoder-json, or neither")

    prefix = DATASETS[args.type][1]
    out_dir = args.out_dir or os.path.join(dc.PROJECT_ROOT, "data", f"{prefix}{args.version}")
    os.makedirs(out_dir, exist_ok=True)

    if args.input:
        docs = iter_local_documents(args.input)
    else:
        docs = iter_remote_documents(args.type, args.version, args.streaming)

    writer = ShardWriter(out_dir, prefix, args.shard_size)
    ndocs = 0
    if args.workers == 1:
        _init_worker(args.vocab_bpe, args.encoder_json)
        for doc in docs:
            writer.add(tokenize_document(doc))
            ndocs += 1
    else:
        with mp.Pool(args.workers, initializer=_init_worker,
                     initargs=(args.vocab_bpe, args.encoder_json)) as pool:
            for toks in pool.imap(tokenize_document, docs, chunksize=16):
                writer.add(toks)
                ndocs += 1
    paths = writer.close()
    print(f"{ndocs} documents, {writer.total} tokens, {len(paths)} shards in {out_dir}")


if __name__ == "__main__":
    main()
