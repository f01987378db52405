#!/usr/bin/env bash
# No GPU needed: what the compiler makes of the tensor-core attention kernels (issues 35, 44).
# Default build (sm_80 and sm_90 images):
# - ptxas -v: every attention kernel of the bf16 build keeps its registers (0 bytes of spills,
#   0 bytes of stack), for sm_80 and sm_90;
# - the PTX of the flash kernels holds mma.sync m16n8k16 (bf16) and ldmatrix, and no wmma;
# - the SASS (cuobjdump, where the toolkit has it) holds HMMA.16816 and LDSM.
# Candidate build (KERNELS_CANDIDATE, sm_80 and sm_90a images, as kernels/cuda.mk builds it):
# - ptxas -v: every attention kernel, the four sm_90a ones (forward, backward; hs 64, 128)
#   too, without spills or stack, and no ptxas advisory (C75xx: wgmma serialized by the
#   compiler, setmaxnreg ignored);
# - the sm_90a PTX of the Hopper kernels holds wgmma.mma_async, setmaxnreg, the bulk tensor copy
#   completing on mbarriers, and (backward) the bulk add of dQ; the sm_80 image still builds;
# - the sm_90a SASS (cuobjdump) holds HGMMA.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "no nvcc: nothing to check"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
flags=(-x cu -std=c++17 -O3 -I. -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
if ! "$NVCC" "${flags[@]}" -Xptxas -v -c test/attention_kernels.cu -o "$tmp/a.o" >"$tmp/ptxas.log" 2>&1; then
    cat "$tmp/ptxas.log"; echo "FAIL: the attention kernels do not compile"; exit 1
fi
# "Compiling entry function 'NAME' for 'sm_XX'" then "N bytes stack frame, N bytes spill stores, N bytes spill loads", "Used N registers"
report=$(awk '/Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2); arch = $NF }
              /bytes stack frame/ { frame = $0 }
              /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); print name, arch, substr($0, RSTART + 5, RLENGTH - 15), frame }' "$tmp/ptxas.log")
n=$(echo "$report" | grep -c flash_)
[ "$n" -ge 12 ] || { echo "FAIL: expected the three flash kernels at two head sizes for sm_80 and sm_90 (12), found $n"; fail=1; }
while read -r name arch regs frame; do
    [[ $name == *flash_* || $name == *attention_backward_delta* ]] || continue
    pretty=$(echo "$name" | c++filt | sed 's/(gpu::FlashArgs)//; s/void gpu:://')
    echo "$arch $regs registers: $pretty ($frame)" | sed "s/'//g"
    if ! echo "$frame" | grep -q '0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads'; then
        echo "FAIL: $pretty for $arch spills: $frame"; fail=1
    fi
done <<<"$report"

# PTX, kernel by kernel: each flash kernel's body between its .entry and the next
"$NVCC" "${flags[@]/-gencode/}" -x cu -std=c++17 -O3 -I. -arch=sm_90 -ptx test/attention_kernels.cu -o "$tmp/a.ptx" 2>/dev/null ||
    "$NVCC" -x cu -std=c++17 -O3 -I. -arch=sm_90 -ptx test/attention_kernels.cu -o "$tmp/a.ptx"
awk '/^\.visible \.entry|^\.entry/ { name = $NF } { if (name ~ /flash_/) print name "\t" $0 }' "$tmp/a.ptx" >"$tmp/flash.ptx"
for kernel in flash_forward_kernel flash_backward_kv_kernel flash_backward_q_kernel; do
    for want in 'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32' 'ldmatrix.sync.aligned.m8n8.x4'; do
        grep "$kernel" "$tmp/flash.ptx" | grep -q -F "$want" || { echo "FAIL: $kernel's PTX has no $want"; fail=1; }
    done
done
grep -q "ldmatrix.sync.aligned.m8n8.x4.trans" "$tmp/flash.ptx" || { echo "FAIL: no ldmatrix .trans (P V, dS K)"; fail=1; }
if grep -q -i wmma "$tmp/a.ptx"; then echo "FAIL: the attention kernels still use wmma"; fail=1; fi
echo "PTX: $(grep -c 'mma.sync.aligned.m16n8k16' "$tmp/flash.ptx") mma.sync, $(grep -c 'ldmatrix' "$tmp/flash.ptx") ldmatrix, $(grep -c -i wmma "$tmp/a.ptx") wmma"

CUOBJDUMP=$(dirname "$NVCC")/cuobjdump
if [ -x "$CUOBJDUMP" ]; then
    "$CUOBJDUMP" -sass -arch sm_90 "$tmp/a.o" >"$tmp/a.sass" 2>&1
    hmma=$(grep -c 'HMMA.16816.F32.BF16' "$tmp/a.sass"); ldsm=$(grep -c 'LDSM' "$tmp/a.sass")
    echo "SASS sm_90: $hmma HMMA.16816.F32.BF16, $ldsm LDSM"
    [ "$hmma" -gt 0 ] && [ "$ldsm" -gt 0 ] || { echo "FAIL: no HMMA.16816 or LDSM in the SASS"; fail=1; }
fi
[ $fail -eq 0 ] && echo "attention kernels: no spills, mma.sync + ldmatrix, no wmma"

# ---- candidate build: the sm_90a kernels
cflags=(-x cu -std=c++17 -O3 -I. -DKERNELS_CANDIDATE)
if ! "$NVCC" "${cflags[@]}" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a -Werror all-warnings \
        -Xptxas -v -c test/attention_kernels.cu -o "$tmp/c.o" >"$tmp/cptxas.log" 2>&1; then
    cat "$tmp/cptxas.log"; echo "FAIL: the candidate attention kernels do not compile for sm_80 and sm_90a"; exit 1
fi
creport=$(awk '/Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2); arch = $NF }
               /bytes stack frame/ { frame = $0 }
               /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); print name, arch, substr($0, RSTART + 5, RLENGTH - 15), frame }' "$tmp/cptxas.log")
n=$(echo "$creport" | grep hopper_ | grep -c sm_90a)
[ "$n" -eq 4 ] || { echo "FAIL: expected the Hopper forward and backward at two head sizes for sm_90a (4), found $n"; fail=1; }
while read -r name arch regs frame; do
    [[ $name == *hopper_* || $name == *flash_* || $name == *attention_backward_delta* ]] || continue
    pretty=$(echo "$name" | c++filt | sed 's/(CUtensorMap_st.*//; s/(gpu::FlashArgs)//; s/void gpu:://')
    if [[ $name == *hopper_* && $arch == *sm_90a* ]]; then
        echo "candidate $arch $regs registers at entry: $pretty ($frame)" | sed "s/'//g"
        # setmaxnreg hands the producer's registers to the consumers within the block's
        # 384 x 168 (24 x 128 + 240 x 256 forward, 40 x 128 + 232 x 256 backward)
        [ "$regs" -eq 168 ] || { echo "FAIL: $pretty starts with $regs registers a thread, not the 168 its setmaxnreg counts assume"; fail=1; }
    fi
    if ! echo "$frame" | grep -q '0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads'; then
        echo "FAIL: candidate $pretty for $arch spills: $frame"; fail=1
    fi
done <<<"$creport"
if grep -q '(C75[0-9][0-9])' "$tmp/cptxas.log"; then
    grep '(C75[0-9][0-9])' "$tmp/cptxas.log"; echo "FAIL: ptxas serialized wgmma or ignored setmaxnreg in the sm_90a kernels"; fail=1
fi
"$NVCC" "${cflags[@]}" -arch=compute_90a -ptx test/attention_kernels.cu -o "$tmp/c.ptx"
awk '/^\.visible \.entry|^\.entry/ { name = $NF } { if (name ~ /hopper_/) print name "\t" $0 }' "$tmp/c.ptx" >"$tmp/hopper.ptx"
for kernel in hopper_forward_kernel hopper_backward_kernel; do
    for want in 'wgmma.mma_async.sync.aligned.m64n' 'wgmma.wait_group' 'setmaxnreg.inc' 'setmaxnreg.dec' \
                'cp.async.bulk.tensor.3d.shared::cluster.global' 'mbarrier.try_wait.parity' 'cp.async.bulk.tensor.3d.global.shared::cta'; do
        grep "$kernel" "$tmp/hopper.ptx" | grep -q -F "$want" || { echo "FAIL: $kernel's sm_90a PTX has no $want"; fail=1; }
    done
done
for want in 'cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32' 'stmatrix.sync.aligned' 'red.release.gpu' 'ld.acquire.gpu'; do
    grep hopper_backward_kernel "$tmp/hopper.ptx" | grep -q -F "$want" || { echo "FAIL: hopper_backward_kernel's sm_90a PTX has no $want"; fail=1; }
done
echo "PTX sm_90a: $(grep -c 'wgmma.mma_async' "$tmp/hopper.ptx") wgmma.mma_async, $(grep -c 'cp.async.bulk.tensor' "$tmp/hopper.ptx") bulk tensor copies, $(grep -c 'setmaxnreg' "$tmp/hopper.ptx") setmaxnreg"
CUOBJDUMP_ANY=$([ -x "$CUOBJDUMP" ] && echo "$CUOBJDUMP" || command -v cuobjdump || true)
if [ -n "$CUOBJDUMP_ANY" ]; then
    "$CUOBJDUMP_ANY" -sass -arch sm_90a "$tmp/c.o" >"$tmp/c.sass" 2>&1
    hgmma=$(grep -c 'HGMMA' "$tmp/c.sass"); utma=$(grep -c 'UTMALDG' "$tmp/c.sass")
    echo "SASS sm_90a: $hgmma HGMMA, $utma UTMALDG"
    [ "$hgmma" -gt 0 ] && [ "$utma" -gt 0 ] || { echo "FAIL: no HGMMA or UTMALDG in the sm_90a SASS"; fail=1; }
else
    echo "SASS sm_90a: not checked (no cuobjdump here)"
fi
[ $fail -eq 0 ] && echo "candidate attention kernels: no spills, sm_90a wgmma + bulk tensor copies + setmaxnreg, sm_80 image builds"
exit $fail
