#!/usr/bin/env bash
# No GPU needed: what the compiler makes of the candidate fp8 casts (kernels/cuda/fp8.cuh, issue 46).
# - sm_90a: both cast kernels round with the hardware's cvt.rn.satfinite.{e4m3,e5m2}x2.f32, no
#   software rounding (rintf) left;
# - sm_80: they compile, the software rounding (common/fp8.h's) in place of cvt, which sm_80 lacks;
# - ptxas -v: the amax and cast kernels keep their registers (0 bytes of spills, 0 of stack).
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "no nvcc: nothing to check"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include "kernels/cuda/fp8.cuh"\n' >"$tmp/fp8.cu"
flags=(-x cu -std=c++17 -O3 -I. -DKERNELS_CANDIDATE -Werror all-warnings)
fail=0
for arch in 90a 80; do
    "$NVCC" "${flags[@]}" -arch=compute_$arch --ptx "$tmp/fp8.cu" -o "$tmp/$arch.ptx" 2>"$tmp/log" || { cat "$tmp/log"; echo "FAIL: compute_$arch does not compile"; exit 1; }
    hw=$(grep -cE 'cvt\.rn\.satfinite\.e(4m3|5m2)x2\.f32' "$tmp/$arch.ptx"); soft=$(grep -c 'cvt\.rni' "$tmp/$arch.ptx")
    echo "compute_$arch: $hw hardware fp8 conversions, $soft software roundings"
    if [ "$arch" = 90a ] && { [ "$hw" -eq 0 ] || [ "$soft" -ne 0 ]; }; then echo "FAIL: sm_90a should round with cvt alone"; fail=1; fi
    if [ "$arch" = 80 ] && { [ "$hw" -ne 0 ] || [ "$soft" -eq 0 ]; }; then echo "FAIL: sm_80 should round in software"; fail=1; fi
done
"$NVCC" "${flags[@]}" -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80 -Xptxas -v -c "$tmp/fp8.cu" -o "$tmp/fp8.o" 2>"$tmp/ptxas.log" ||
    { cat "$tmp/ptxas.log"; echo "FAIL: ptxas"; exit 1; }
kernels=$(grep -c "Compiling entry function '_ZN3gpu1[0-9]fp8_" "$tmp/ptxas.log")
# each entry's report: "Compiling entry function", "Function properties", then its stack and spills
frames=$(grep -A2 "Compiling entry function '_ZN3gpu1[0-9]fp8_" "$tmp/ptxas.log" | grep -E 'bytes stack frame')
spills=$(echo "$frames" | grep -vc '^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads')
echo "ptxas: $kernels fp8 kernel images, $spills with stack or spills"
[ "$kernels" -eq 6 ] && [ "$(echo "$frames" | grep -c 'bytes stack frame')" -eq 6 ] ||
    { echo "FAIL: expected 6 reports (amax and two casts, for sm_80 and sm_90a)"; fail=1; }
[ "$spills" -eq 0 ] || { grep -A1 "fp8_" "$tmp/ptxas.log"; fail=1; }
[ $fail -eq 0 ] && echo ok
exit $fail
