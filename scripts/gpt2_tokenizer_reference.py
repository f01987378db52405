#!/usr/bin/env python3
"""GPT-2 tokenization by transformers' GPT2Tokenizer: the independent reference that
test/test_data_scripts.py checks the data scripts' tiktoken encoding against. It reads the same
two files (encoder.json, vocab.bpe) but shares no code with tiktoken.

usage: /usr/bin/python3 scripts/gpt2_tokenizer_reference.py ENCODER_JSON VOCAB_BPE [--vocab]
  stdin: a JSON list of texts; stdout: a JSON list of their token id lists, "<|endoftext|>"
  in a text being the end-of-text token (tiktoken's allowed_special="all").
  --vocab: no input; stdout: a JSON list of every token's bytes, in hex, by id.
Runs under /usr/bin/python3, where transformers 4.30.2 lives beside Debian's torch.
"""
import json
import sys

from transformers import GPT2Tokenizer


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--vocab"):
        print(__doc__, file=sys.stderr)
        return 2
    tok = GPT2Tokenizer(vocab_file=argv[1], merges_file=argv[2])
    # from_pretrained would register it; built from the two files it must be told it is special
    tok.add_special_tokens({"eos_token": "<|endoftext|>"})
    if len(argv) == 4:
        tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
        json.dump([bytes(tok.byte_decoder[ch] for ch in t).hex() for t in tokens], sys.stdout)
    else:
        json.dump([tok.encode(text) for text in json.load(sys.stdin)], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
