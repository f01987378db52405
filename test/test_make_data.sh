#!/usr/bin/env bash
# `make data` in a fresh clone, with the network blocked (and tiktoken's cache empty): without
# ../shared, or with a SHARED that lacks input.txt or the BPE files, it fails with exit != 0 and
# one line of its own saying which files to give and how (make adds its usual "make: *** ...
# Error" line), and leaves no file behind; with SHARED holding the files it makes the shards and
# the tokenizer from them.
set -u
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; cat "$dir/err" 2>/dev/null; rm -rf "$dir"; exit 1; }
mkdir "$dir/clone" && git ls-files -z | xargs -0 cp --parents -t "$dir/clone" || fail "cannot copy the tracked files"
if unshare -n true 2>/dev/null; then
    offline=(unshare -n)
else  # no network namespace for us: a proxy that refuses every connection
    offline=(env http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9)
fi
files() { (cd "$dir/clone" && find . -path '*/__pycache__' -prune -o -print | sort); }
files >"$dir/before"

make_data() {  # [SHARED=...]: make data in the clone, offline; stdout, stderr in $dir/out, $dir/err
    mkdir -p "$dir/tiktoken_cache"
    # as a user starts it: not a sub-make of make test (whose variables would reach it)
    (cd "$dir/clone" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL TIKTOKEN_CACHE_DIR="$dir/tiktoken_cache" "${offline[@]}" \
        make data NVCC= "$@" >"$dir/out" 2>"$dir/err")
}
expect_one_line() {  # RC CASE WHAT_FAILED
    local rc=$1 ours
    [ "$rc" -ne 0 ] || fail "$2: make data succeeded offline"
    ours=$(grep -v '^make: \*\*\* ' "$dir/err")
    [ "$(grep -c '' <<<"$ours")" -eq 1 ] || fail "$2: expected one line of its own on stderr"
    grep -q "^error: $3 (.*); offline, give the files: data/tinyshakespeare.py --input input.txt --vocab-bpe vocab.bpe --encoder-json encoder.json, or make data SHARED=DIR with DIR/tinyshakespeare/input.txt, DIR/gpt2/vocab.bpe and DIR/gpt2/encoder.json$" <<<"$ours" ||
        fail "$2: the line does not say what to do"
    files | cmp -s - "$dir/before" || fail "$2: files left behind: $(files | diff "$dir/before" - | grep '^>')"
}

download="download of .*input.txt failed" encoding="could not load tiktoken's gpt2 encoding"
make_data
expect_one_line $? "no ../shared" "$download"

shared=$(cd .. && pwd)/shared/data
if [ -d "$shared/gpt2" ] && [ -d "$shared/tinyshakespeare" ]; then
    mkdir -p "$dir/bpe/gpt2" "$dir/text/tinyshakespeare"  # the BPE files alone, input.txt alone
    ln -s "$shared/gpt2/vocab.bpe" "$shared/gpt2/encoder.json" "$dir/bpe/gpt2/"
    ln -s "$shared/tinyshakespeare/input.txt" "$dir/text/tinyshakespeare/"
    make_data SHARED="$dir/bpe"
    expect_one_line $? "SHARED without input.txt" "$download"
    make_data SHARED="$dir/text"
    expect_one_line $? "SHARED without the BPE files" "$encoding"

    make_data SHARED="$shared" || fail "make data SHARED=$shared offline exited $?"
    for f in tiny_shakespeare_train.bin tiny_shakespeare_val.bin gpt2_tokenizer.bin; do
        cmp -s "$dir/clone/data/tinyshakespeare/$f" "data/tinyshakespeare/$f" || fail "SHARED=$shared: $f differs from make data's here"
    done
fi
rm -rf "$dir"
echo "ok"
