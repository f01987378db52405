#!/usr/bin/env python3
"""Tokenize Tiny Shakespeare with the GPT-2 tokenizer into llm.c token shards.

Writes into --out-dir (default <project>/data/tinyshakespeare/):
  tiny_shakespeare_val.bin    first 32768 tokens
  tiny_shakespeare_train.bin  the rest
  gpt2_tokenizer.bin          the GPT-2 vocabulary in llm.c's tokenizer format

The text is cut into documents at blank lines ("\\n\\n"); every document gets
<|endoftext|> put in front of it. As in llm.c, each document but the last
keeps its trailing "\\n\\n".

Offline use:
  python3 data/tinyshakespeare.py --input input.txt \\
      --vocab-bpe vocab.bpe --encoder-json encoder.json
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_common as dc  # noqa: E402

INPUT_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
VAL_TOKENS = 32768
# what to do when a download fails: this script's flags, or the Makefile's SHARED (make data runs it)
OFFLINE = ("offline, give the files: data/tinyshakespeare.py --input input.txt --vocab-bpe vocab.bpe "
           "--encoder-json encoder.json, or make data SHARED=DIR with DIR/tinyshakespeare/input.txt, "
           "DIR/gpt2/vocab.bpe and DIR/gpt2/encoder.json")


def split_documents(text):
    """Documents at blank lines; all but the last keep their "\\n\\n"."""
    parts = text.split("\n\n")
    return [p + "\n\n" for p in parts[:-1]] + [parts[-1]]


def tokenize(text, enc):
    eot = enc.eot_token
    tokens = []
    for doc in split_documents(text):
        tokens.append(eot)
        tokens.extend(enc.encode_ordinary(doc))
    return tokens


def main(argv=None):
    args = dc.single_file_args(__doc__, "input.txt", "tinyshakespeare", argv)

    path = args.input
    if path is None:
        path = dc.download(INPUT_URL, os.path.join(args.out_dir, "input.txt"), OFFLINE)
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()

    enc = dc.gpt2_encoding(args.vocab_bpe, args.encoder_json, OFFLINE)
    tokens = tokenize(text, enc)
    val, train = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]

    val_path = os.path.join(args.out_dir, "tiny_shakespeare_val.bin")
    train_path = os.path.join(args.out_dir, "tiny_shakespeare_train.bin")
    tok_path = os.path.join(args.out_dir, "gpt2_tokenizer.bin")
    dc.write_token_shard(val_path, val)
    dc.write_token_shard(train_path, train)
    dc.write_tokenizer(tok_path, enc)

    print(f"total tokens: {len(tokens)}")
    print(f"wrote {len(val)} tokens to {val_path}")
    print(f"wrote {len(train)} tokens to {train_path}")
    print(f"wrote tokenizer ({enc.n_vocab} tokens, eot {enc.eot_token}) to {tok_path}")


if __name__ == "__main__":
    main()
