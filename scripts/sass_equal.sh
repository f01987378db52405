#!/usr/bin/env bash
# Does a refactor leave the attention kernels' machine code as it was? No GPU needed: compiles
# test/attention_kernels.cu (as test/test_attention_build.sh does) from REV and from the working
# tree, in the default build (sm_80, sm_90) and the candidate build (sm_80, sm_90a), and compares
# each kernel's SASS, instructions and their encodings, line by line. The same SASS runs the
# same: same bits, same speed, same registers.
#   bash scripts/sass_equal.sh [REV]     (REV: default HEAD)
# Needs cuobjdump: CUOBJDUMP=PATH, or one beside nvcc or on PATH. A toolkit without it can take
# the one in PyPI's nvidia-cuda-cuobjdump wheel (`pip download --no-deps nvidia-cuda-cuobjdump`,
# unzip, nvidia/cu13/bin/cuobjdump). Exit 0: every kernel the same; 1: one differs, or the two
# trees have different kernels; 2: nothing compared.
set -u
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "no nvcc: nothing compared"; exit 2; }
CUOBJDUMP=${CUOBJDUMP:-$([ -x "$(dirname "$NVCC")/cuobjdump" ] && echo "$(dirname "$NVCC")/cuobjdump" || command -v cuobjdump)}
[ -x "$CUOBJDUMP" ] || { echo "no cuobjdump (set CUOBJDUMP): nothing compared"; exit 2; }
git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "$rev: not a commit"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/base"
git archive "$rev" | tar -x -C "$tmp/base"

# sass TREE NAME ARCH FLAGS...: one file a kernel, $tmp/NAME/KERNEL (its mangled name)
sass() {
    local tree=$1 name=$2 arch=$3
    shift 3
    mkdir -p "$tmp/$name"
    (cd "$tree" && "$NVCC" -x cu -std=c++17 -O3 -I. "$@" -gencode "arch=compute_$arch,code=sm_$arch" -cubin \
        test/attention_kernels.cu -o "$tmp/$name.cubin") || { echo "FAIL: $name does not compile"; return 1; }
    "$CUOBJDUMP" -sass "$tmp/$name.cubin" | awk -v dir="$tmp/$name" '
        /Function : / { out = dir "/" $3; next }
        out { print > out }'
}
fail=0
for build in "default 80" "default 90" "candidate 80 -DKERNELS_CANDIDATE" "candidate 90a -DKERNELS_CANDIDATE"; do
    set -- $build
    kind=$1 arch=$2
    shift 2
    sass "$tmp/base" "base_${kind}_$arch" "$arch" "$@" &
    base_job=$!
    sass . "work_${kind}_$arch" "$arch" "$@" && wait $base_job || { wait; fail=1; continue; }
    base=$tmp/base_${kind}_$arch work=$tmp/work_${kind}_$arch
    for kernel in $( (ls "$base"; ls "$work") | sort -u); do
        pretty=$(echo "$kernel" | c++filt | sed 's/(.*//; s/^void //')
        if [ ! -f "$base/$kernel" ] || [ ! -f "$work/$kernel" ]; then
            echo "FAIL $kind sm_$arch: $pretty is only in $([ -f "$base/$kernel" ] && echo "$rev" || echo "the working tree")"
            fail=1
        elif cmp -s "$base/$kernel" "$work/$kernel"; then
            echo "same $kind sm_$arch: $pretty ($(grep -c '^ */\*[0-9a-f]*\*/' "$work/$kernel") instructions)"
        else
            echo "FAIL $kind sm_$arch: $pretty differs ($(diff "$base/$kernel" "$work/$kernel" | grep -c '^[<>]') lines)"
            fail=1
        fi
    done
done
[ $fail -eq 0 ] && echo "every attention kernel's SASS is the same as at $rev"
exit $fail
