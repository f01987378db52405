#!/usr/bin/env bash
# `make gpu-rehearsal`: scripts/gpu_check.sh run here as the lent GPU machine would run it, before
# a device call is spent on it. Root only (it uses mount and network namespaces); nothing on this
# machine changes. It packs .deps/ (gpu_check.sh --pack), copies what a device call carries (the
# files git tracks or would track, as a fresh clone has them once committed, and .deps/), plants
# a KERNELS_CANDIDATE comment in the copy so that both kernel builds are made, and runs
# gpu_check.sh on that copy in a sandbox:
#   - GoogleTest, OpenMPI (with PMIx, hwloc, libevent, munge) and OpenBLAS are gone: their Debian
#     packages' files are hidden under an overlay of /usr, /etc/openmpi under an empty folder
#   - NCCL is not in the toolkit but where the H200 keeps it, laid out like PyTorch's wheel:
#     /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/ with include/nccl.h, lib/libnccl.so.2
#   - dpkg, dpkg-query, apt-get, apt and pip fail, python3 -m pip too; no network but loopback
#   - a fresh empty /tmp; no GPU (none here); compute-sanitizer a stub that runs its program
# The runs, each with what it must show:
#   0. without .deps/: one FAIL line at once, exit 1 (and a bad option: its usage line, exit 2)
#   1. everything, --memcheck too: both builds without a warning, NCCL found in the wheel, every
#      GPU test SKIP (no GPU, CUDA's reason), the ZeRO lines saying that mpirun started 3 ranks, exit 77
#   2. a stub nvidia-smi listing a GPU that CUDA cannot find: FAIL with CUDA's error, no SKIP, exit 1
#   3. that stub, stand-ins for the kernel tests whose kernel faults (scripts/gpu_rehearsal_fault.cpp:
#      within the test, bf16; surfacing in the next test, fp32) and a train_gpt that hangs at d24:
#      a line naming the test each binary died in, one per test that it did not finish, run alone,
#      the faulting launch named; the hanging benchmark cut at its timeout, the ones after it reported
#   4. the hanging benchmark with a timeout longer than the bench phase's time: cut at the phase's
#      end, no process of it left running, the runs after it said SKIP (out of time)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "gpu_rehearsal: needs root, for its mount and network namespaces" >&2; exit 2; }
bash scripts/gpu_check.sh --pack
box=$(mktemp -d /var/tmp/gpu_rehearsal_XXXXXX)
trap 'rm -rf "$box"' EXIT
mkdir -p "$box/tree" "$box/shims" "$box/gpu" "$box/empty" "$box/usr" "$box/usr.upper" "$box/usr.work" \
    "$box/opt" "$box/opt.upper" "$box/opt.work"
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done |
    tar --null -T - -cf - | tar -C "$box/tree" -xf -
cp -a .deps "$box/tree/"
carried=$(du -sb "$box/tree" | cut -f1)
echo "a device call would carry $((carried / 1024)) KiB: the tree and .deps/ ($(du -sh .deps | cut -f1)), of 64 MiB"
[ "$carried" -le $((64 << 20)) ] || { echo "gpu rehearsal FAILED: over the 64 MiB a device call carries"; exit 1; }
echo '// KERNELS_CANDIDATE: planted by make gpu-rehearsal, so that both kernel builds are made' >>"$box/tree/kernels/cuda/common.cuh"

# what the GPU machine lacks, as Debian packages, and the toolkit's NCCL (planted as the wheel)
mapfile -t gone < <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' libgtest-dev libgmock-dev googletest \
    'openmpi-*' 'libopenmpi*' 'libpmix*' 'libhwloc*' 'libevent-*' 'libmunge*' 'libopenblas*' 'libblas*' 'liblapack*' \
    2>/dev/null | awk '$1 == "ii" { print $2 }')
cuda=$(readlink -f /usr/local/cuda)
{ dpkg -L "${gone[@]}" | sed -E 's#^/(lib|bin|sbin)/#/usr/\1/#' | grep '^/usr/'; find "$cuda"/include/nccl* "$cuda"/lib64/libnccl*; } |
    sort -u >"$box/gone.txt"

for tool in dpkg dpkg-query apt-get apt pip pip3; do
    printf '#!/bin/sh\necho "rehearsal: %s is not available on the GPU machine" >&2\nexit 1\n' "$tool" >"$box/shims/$tool"
done
cat >"$box/shims/python3" <<EOF
#!/bin/sh
if [ "\${1:-}" = -m ] && [ "\${2:-}" = pip ]; then echo "rehearsal: pip is not available on the GPU machine" >&2; exit 1; fi
exec $(command -v python3) "\$@"
EOF
cat >"$box/shims/compute-sanitizer" <<'EOF'
#!/bin/sh
# rehearsal: compute-sanitizer's options dropped, its program run, no errors found
while [ "${1#--}" != "$1" ]; do case $1 in --tool | --error-exitcode | --print-limit) shift ;; esac; shift; done
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
cat >"$box/gpu/nvidia-smi" <<'EOF'
#!/bin/sh
# rehearsal: the driver lists a GPU, which CUDA cannot find
case "$*" in
    -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
    *compute_cap*) echo "9.0" ;;
    *name,memory.total,driver_version,compute_mode*) echo "NVIDIA H200, 143771 MiB, 580.159.04, Default" ;;
    "") echo "| NVIDIA-SMI 580.159.04    Driver Version: 580.159.04    CUDA Version: 13.0 |" ;;
esac
EOF
cat >"$box/train_gpt" <<'EOF'
#!/usr/bin/env bash
# rehearsal: train_gpt's step lines at once, but d24 hangs
[[ " $* " == *" -e d24 "* ]] && exec sleep 100000
echo "model: L=12 C=768"
for s in 1 2 3 4 5 6 7 8; do
    echo "step    $s/8 | loss 10.000000 (+0.00z) | norm 1.0000 (+0.00z) | lr 3.00e-04 | 100.00 ms | 655360 tok/s | MFU 40.0% | elapsed 1s | ETA 1s"
done
echo "rank 0 kernel launches per step: 448"
EOF
chmod +x "$box/shims"/* "$box/gpu"/* "$box/train_gpt"

set +e
unshare --mount --net --propagation private env -i HOME="$HOME" PATH="$box/shims:$PATH" BOX="$box" CUDA_DIR="$cuda" bash -c '
    set -e
    ip link set lo up
    # NCCL laid out as PyTorch'"'"'s wheel has it, where the H200 keeps it
    mount -t overlay overlay -o "lowerdir=/opt,upperdir=$BOX/opt.upper,workdir=$BOX/opt.work" "$BOX/opt"
    mount --bind "$BOX/opt" /opt
    wheel=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl
    mkdir -p "$wheel/include" "$wheel/lib"
    cp "$CUDA_DIR/include/nccl.h" "$wheel/include/"
    touch "$wheel/lib/libnccl.so.2" && mount --bind "$(readlink -f "$CUDA_DIR/lib64/libnccl.so.2")" "$wheel/lib/libnccl.so.2"
    mount -t overlay overlay -o "lowerdir=/usr,upperdir=$BOX/usr.upper,workdir=$BOX/usr.work" "$BOX/usr"
    mount --bind "$BOX/usr" /usr
    while IFS= read -r f; do if [ -L "$f" ] || [ -f "$f" ]; then rm -f "$f"; fi; done <"$BOX/gone.txt"
    tac "$BOX/gone.txt" | while IFS= read -r d; do if [ -d "$d" ]; then rmdir "$d" 2>/dev/null || true; fi; done
    find /usr/bin /usr/lib/x86_64-linux-gnu /usr/include -xtype l -delete  # links into what is gone (alternatives)
    if [ -d /etc/openmpi ]; then mount --bind "$BOX/empty" /etc/openmpi; fi
    mount -t tmpfs tmpfs /tmp
    cd "$BOX/tree"
    run() {  # N ARGS...: gpu_check.sh ARGS, its $OUT in out.N, its output in stdout.N, "status seconds" in rc.N
        local n=$1 t0=$SECONDS rc=0
        shift
        echo "== run $n: gpu_check.sh $*"
        mkdir -p "$BOX/out.$n"
        OUT="$BOX/out.$n" bash scripts/gpu_check.sh "$@" >"$BOX/stdout.$n" 2>&1 || rc=$?
        echo "$rc $((SECONDS - t0))" >"$BOX/rc.$n"
    }
    mv .deps ../deps && run 0 && mv ../deps .deps
    run usage --only kernel
    run 1 --memcheck --budget 36000  # the build takes minutes on a few shared cores
    PATH=$BOX/gpu:$PATH run 2 --budget 36000
    g++ -O1 -isystem .deps/include scripts/gpu_rehearsal_fault.cpp -o test/test_kernels_cuda .deps/lib/libgtest.a -lpthread
    g++ -O1 -isystem .deps/include -DFAULT_SURFACES_LATER scripts/gpu_rehearsal_fault.cpp -o test/test_kernels_cuda_fp32 \
        .deps/lib/libgtest.a -lpthread
    cp "$BOX/train_gpt" train_gpt
    PATH=$BOX/gpu:$PATH run 3 --only default,kernels,bench --timeout 10
    # the hanging benchmark again, now with a run timeout longer than the bench phase: the phase
    # ends it, and nothing of it stays on the GPU
    PATH=$BOX/gpu:$PATH run 4 --only default,bench --timeout 300 --budget 45
    pgrep -f "^sleep 100000$" | wc -l >"$BOX/left.4"'
rc=$?
set -e
fail() { echo "gpu rehearsal FAILED: $*"; exit 1; }
[ $rc -eq 0 ] || fail "the sandbox ended with status $rc"

for n in 0 1 2 3 4; do
    read -r rc secs <"$box/rc.$n"
    echo "== run $n: gpu_check.sh exited $rc after $secs s; the summary it left in \$OUT:"
    cat "$box/out.$n/gpu_summary.txt" || cat "$box/stdout.$n"
done
check() {  # N: the status and time of run N (rc, secs), its summary (summary)
    read -r rc secs <"$box/rc.$1"
    summary=$box/out.$1/gpu_summary.txt
    [ -s "$summary" ] || fail "run $1 left no summary in \$OUT"
}
has() { grep -qE "$2" "$summary" || fail "run $1: no line matching '$2'"; }  # RUN REGEX

check 0
[ "$rc" = 1 ] && [ "$(wc -l <"$summary")" = 1 ] || fail "run 0: not one line and exit 1 without .deps/"
has 0 '^FAIL  no .deps/ and no GoogleTest: .*--pack'
read -r rc secs <"$box/rc.usage"
[ "$rc" = 2 ] && grep -q "^gpu_check: --only takes .*not 'kernel' (usage: " "$box/stdout.usage" || fail "--only kernel: no usage line and exit 2"

check 1
! grep -q '^FAIL' "$summary" || fail "run 1: a FAIL line"
mkdir "$box/logs" && tar -xzf "$box/out.1/gpu_check_logs.tgz" -C "$box/logs"
! grep -E 'warning( #|:)' "$box/logs"/build_*.log || fail "warnings in the build (above)"
! grep -q '^WARN' "$summary" || fail "run 1: a WARN line"
[ "$rc" = 77 ] || fail "run 1: exit status $rc, not 77 (no GPU)"
has 1 '^build: .*NCCL /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl: lib/libnccl.so.2 alone, linked by that name'
has 1 '^build: .*builds: default candidate'
for b in default candidate; do
    for want in "kernels bf16" "kernels fp32" "ZeRO 0-3, 2 ranks" "ZeRO 0-3, 3 ranks" "memcheck kernels bf16" "memcheck kernels fp32" "benchmarks"; do
        has 1 "^SKIP  $b $want.*: no GPU"
    done
    has 1 "^SKIP  $b ZeRO 0-3, 3 ranks.*: no GPU \(cudaGetDeviceCount: .*\), 3 ranks started"
    has 1 "^SKIP  $b ZeRO 0-3, 2 ranks sharing the GPU, fp32, collectives finishing late: no GPU"
done
has 1 '^SKIP  NCCL between GPUs: 0 GPU\(s\)'

check 2
[ "$rc" = 1 ] || fail "run 2: exit status $rc, not 1"
! grep -q '^SKIP.*no GPU' "$summary" || fail "run 2: a GPU that nvidia-smi lists was read as no GPU"
has 2 '^gpu_check: NVIDIA H200, 143771 MiB, driver 580.159.04 \(CUDA 13.0\), compute mode Default; toolkit 13.0'
for b in default candidate; do
    for want in "kernels bf16" "kernels fp32" "ZeRO 0-3, 2 ranks sharing the GPU, fp32" "ZeRO 0-3, 3 ranks sharing the GPU, bf16"; do
        has 2 "^FAIL  $b $want: CUDA finds no GPU though nvidia-smi lists 1 \(cudaGetDeviceCount: "
    done
    has 2 "^FAIL  $b benchmarks: not run, CUDA finds no GPU"
done

check 3
[ "$rc" = 1 ] || fail "run 3: exit status $rc, not 1"
[ "$secs" -lt 120 ] || fail "run 3 took $secs s: the hanging benchmark was not cut at its 10 s"
has 3 '^PASS  default kernels bf16: Cuda.Encoder: '
has 3 '^FAIL  default kernels bf16: died \(exit 1\) in \[ RUN \] Cuda.Attention: error: CUDA error at .*illegal memory access.*; 1 of 5 tests ended, the other 4 run alone'
has 3 '^FAIL  default kernels bf16: Cuda.Attention alone died \(exit 1\): error: CUDA error at the launch in attention_forward \(kernels/cuda/attention.cuh:[0-9]+\)'
has 3 '^PASS  default kernels bf16: Cuda.Elementwise alone: '
has 3 '^FAIL  default kernels bf16: Cuda.Classifier alone: '
has 3 '^PASS  default kernels bf16: Cuda.AdamW alone: '
has 3 '^FAIL  default kernels fp32: died \(exit 1\) in \[ RUN \] Cuda.Elementwise: .*; 2 of 5 tests ended, the other 3 run alone'
has 3 '^FAIL  default kernels fp32: Cuda.Elementwise passes alone: the fault came from an earlier test; the 2 before it run alone'
has 3 '^FAIL  default kernels fp32: Cuda.Attention alone died \(exit 1\): error: CUDA error at the launch in attention_forward'
has 3 '^bench default d12 B=64 T=1024 r=1: 100.0 ms/step'
has 3 '^FAIL  bench default d24 B=32 T=1024 r=0: FAILED'
has 3 'cut at its 10 s timeout'
has 3 '^bench default d48 B=16 T=1024 r=2 --offload cpu: 100.0 ms/step'
! grep -q candidate "$summary" || fail "run 3: --only default ran the candidate build"
check 4
[ "$secs" -lt 70 ] || fail "run 4 took $secs s: the bench phase did not end by its budget"
[ "$(cat "$box/left.4")" = 0 ] || fail "run 4: the hanging benchmark outlived gpu_check ($(cat "$box/left.4") left)"
has 4 '^FAIL  bench default d24 B=32 T=1024 r=0: FAILED'
has 4 'cut at its [0-9]+ s timeout'
has 4 '^SKIP  bench default d12 B=16 T=1024, 2 ranks sharing the GPU, ZeRO 3: not run \(out of time\)'
echo "gpu rehearsal passed: both kernel builds built from a copy of the tree and .deps/ ($(du -sh "$box/tree/.deps" | cut -f1))" \
    "with no package manager and NCCL in a wheel; no GPU: every test SKIP; a GPU CUDA cannot use: FAIL; a faulting" \
    "test named and the tests after it run alone; a hanging benchmark cut at its timeout, or at its phase's end with nothing left running"
