"""Shared helpers for the data preparation scripts.

File formats (compatible with karpathy/llm.c):

* token shard: 256 x int32 header (magic 20240520, version 1, num_tokens,
  rest zero) followed by num_tokens uint16 little-endian token ids.
* tokenizer:   256 x uint32 header (magic 20240328, version 2, vocab size,
  eot token id, rest zero) followed, for every token id 0..vocab-1, by one
  uint8 length and that many raw bytes.
* eval file:   256 x int32 header (magic 20240522, version 1, number of
  examples, longest example in bytes) followed by one uint16 stream per
  multiple-choice example (HellaSwag): 65535, the example's size in bytes,
  its index, the label, the number of endings (4), then the context and each
  ending as a length followed by that many tokens.
"""
import argparse
import os
import sys
import urllib.request

import numpy as np

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2
EVAL_MAGIC = 20240522
EVAL_VERSION = 1
EVAL_EXAMPLE_START = 2 ** 16 - 1  # also why no token may be 65535
EVAL_ENDINGS = 4
HEADER_INTS = 256

GPT2_VOCAB_SIZE = 50257
GPT2_EOT = 50256
EOT_STRING = "<|endoftext|>"
# Same regex GPT-2 (r50k_base) uses to pre-split text before BPE.
GPT2_PAT_STR = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++"""
                r"""|\s++$|\s+(?!\S)|\s""")

GPT2_VOCAB_BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
GPT2_ENCODER_JSON_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_atomic(path, chunks):
    """Write the byte strings in chunks to path via path.tmp, so no partial file is ever left."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    os.replace(tmp, path)


def write_token_shard(path, tokens):
    """Write a list/array of token ids as an llm.c token shard."""
    toks = np.asarray(tokens)
    if toks.size and (toks.min() < 0 or toks.max() >= 2 ** 16):
        raise AssertionError("token ids must lie in [0, 2**16) to be stored as uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = toks.size
    write_atomic(path, [header.tobytes(), toks.astype("<u2", copy=False).tobytes()])
    return toks.size


def write_evalfile(path, examples):
    """Write multiple-choice examples as llm.c's eval file (layout in the module docstring).

    examples: dicts with "label", "ctx_tokens" and "ending_tokens" (EVAL_ENDINGS lists).
    Raises ValueError naming the first example that cannot be stored.
    """
    if not 0 < len(examples) < 2 ** 16:
        raise ValueError(f"{len(examples)} examples: the example index is a uint16, so 1..65535 fit")
    stream, longest = [], 0
    for i, ex in enumerate(examples):
        endings = ex["ending_tokens"]
        if len(endings) != EVAL_ENDINGS:
            raise ValueError(f"example {i}: {len(endings)} endings, expected {EVAL_ENDINGS}")
        if not 0 <= ex["label"] < EVAL_ENDINGS:
            raise ValueError(f"example {i}: label {ex['label']}, expected 0..{EVAL_ENDINGS - 1}")
        body = [i, ex["label"], EVAL_ENDINGS]
        for part in [ex["ctx_tokens"]] + list(endings):
            if not part:
                raise ValueError(f"example {i}: an empty context or ending")
            if any(not 0 <= t < EVAL_EXAMPLE_START for t in part):
                raise ValueError(f"example {i}: a token outside [0, {EVAL_EXAMPLE_START})")
            body += [len(part)] + list(part)
        nbytes = 2 * (2 + len(body))  # the start marker and this size field count too
        if nbytes >= 2 ** 16:
            raise ValueError(f"example {i}: {nbytes} bytes, more than a uint16 size field holds")
        stream += [EVAL_EXAMPLE_START, nbytes] + body
        longest = max(longest, nbytes)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = [EVAL_MAGIC, EVAL_VERSION, len(examples), longest]
    write_atomic(path, [header.tobytes(), np.array(stream, dtype="<u2").tobytes()])


def read_token_shard(path):
    """Read an llm.c token shard; returns a uint16 numpy array (header checked)."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_INTS * 4), dtype="<i4")
        if header.size != HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
            raise ValueError(f"{path}: bad token shard header")
        toks = np.frombuffer(f.read(), dtype="<u2")
    if toks.size != header[2]:
        raise ValueError(f"{path}: header says {header[2]} tokens, file holds {toks.size}")
    return toks


def write_tokenizer(path, enc):
    """Write enc's vocabulary in llm.c's tokenizer file format."""
    write_tokenizer_bytes(path, [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)], enc.eot_token)


def write_tokenizer_bytes(path, tokens, eot):
    """Write a vocabulary given as each token id's bytes in llm.c's tokenizer file format."""
    header = np.zeros(HEADER_INTS, dtype="<u4")
    header[0] = TOKENIZER_MAGIC
    header[1] = TOKENIZER_VERSION
    header[2] = len(tokens)
    header[3] = eot
    parts = [header.tobytes()]
    for i, b in enumerate(tokens):
        if not 0 < len(b) < 256:
            raise AssertionError(f"token {i} has length {len(b)}, not storable in one byte")
        parts.append(bytes([len(b)]))
        parts.append(b)
    write_atomic(path, parts)


def first_line(error):
    """An exception's message on one line (some run over several)."""
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


def gpt2_encoding(vocab_bpe=None, encoder_json=None,
                  offline="offline, pass GPT-2's vocab.bpe and encoder.json with --vocab-bpe and --encoder-json"):
    """GPT-2 tiktoken encoding.

    With both local files given it is built fully offline; otherwise
    tiktoken.get_encoding("gpt2") is used (which may download and cache);
    if that fails it exits with one line ending in `offline`, what to do instead.
    """
    import tiktoken
    if vocab_bpe and encoder_json:
        import tiktoken.load
        # tiktoken caches files keyed by their *path*; switch its cache off
        # (empty TIKTOKEN_CACHE_DIR) so edited local files are never served stale.
        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = ""
        try:
            ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
                vocab_bpe_file=os.path.abspath(vocab_bpe),
                encoder_json_file=os.path.abspath(encoder_json),
            )
        finally:
            if saved is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved
        enc = tiktoken.Encoding(
            name="gpt2",
            pat_str=GPT2_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens={EOT_STRING: GPT2_EOT},
        )
        if enc.n_vocab != GPT2_VOCAB_SIZE:
            raise ValueError(f"expected {GPT2_VOCAB_SIZE} tokens, local BPE files give {enc.n_vocab}")
        return enc
    if vocab_bpe or encoder_json:
        raise ValueError("give both --vocab-bpe and --encoder-json, or neither")
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # typically no network and nothing in tiktoken's cache
        raise SystemExit(f"error: could not load tiktoken's gpt2 encoding ({type(e).__name__}: {first_line(e)}); {offline}")


def download(url, path, offline, chunk_size=1 << 20):
    """Download url to path (skipped if path already exists). When that fails (no network) it
    exits with one line: what failed, then `offline`, what to do instead; nothing is left behind."""
    if os.path.exists(path):
        print(f"{path} already exists, not downloading")
        return path
    print(f"downloading {url} -> {path}")
    tmp = path + ".part"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # only once the server answers
            with open(tmp, "wb") as f:
                while True:
                    chunk = r.read(chunk_size)
                    if not chunk:
                        break
                    f.write(chunk)
    except Exception as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        sys.exit(f"error: download of {url} failed ({first_line(e)}); {offline}")
    os.replace(tmp, path)
    return path


def single_file_args(description, input_name, out_subdir, argv=None):
    """Arguments of a script that tokenizes one downloadable file into <project>/data/<out_subdir>."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=None,
                   help=f"local {input_name} (default: download to <out-dir>/{input_name})")
    p.add_argument("--out-dir", default=os.path.join(PROJECT_ROOT, "data", out_subdir),
                   help="output directory (default: %(default)s)")
    add_tokenizer_args(p)
    return p.parse_args(argv)


def add_tokenizer_args(parser):
    parser.add_argument("--vocab-bpe", default=None,
                        help="local GPT-2 vocab.bpe (with --encoder-json: build the tokenizer offline)")
    parser.add_argument("--encoder-json", default=None,
                        help="local GPT-2 encoder.json (with --vocab-bpe)")
