#!/usr/bin/env bash
# GPU verification in one command: builds train_gpt and the GPU tests, runs every GPU test and
# the GPU benchmark, and prints a summary (also written to $OUT/gpu_summary.txt when OUT is set).
# Needs the CUDA toolkit; no apt-get, no network. OpenMPI is optional (without it the build is
# NO_MPI=1 and the multi-rank ZeRO tests are skipped), so is OpenBLAS (without it NO_BLAS=1:
# the CPU reference multiplies with plain loops). GoogleTest comes from the system, or from
# .deps/ made on a development machine with `scripts/gpu_check.sh --pack`.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--pack" ]; then  # on a machine that has GoogleTest: its headers and static lib
    rm -rf .deps && mkdir -p .deps/include .deps/lib
    cp -r /usr/include/gtest .deps/include/
    cp /usr/lib/x86_64-linux-gnu/libgtest.a .deps/lib/
    echo "packed $(du -sh .deps | cut -f1) into .deps/ (carry it to the GPU machine)"
    exit 0
fi
START=$SECONDS
export PATH=$PATH:/usr/local/cuda/bin
MAKE_ARGS=(-j8)
[ -d .deps ] && MAKE_ARGS+=(GTEST_ROOT="$PWD/.deps")
command -v mpicxx >/dev/null || MAKE_ARGS+=(NO_MPI=1)
echo '#include <cblas.h>' | g++ -E -x c++ - >/dev/null 2>&1 || MAKE_ARGS+=(NO_BLAS=1)
summary=$(mktemp)
say() { echo "$*" | tee -a "$summary"; }
run() {  # NAME COMMAND...: runs, keeps the log, says PASS/FAIL/SKIP
    local name=$1; shift
    local log="/tmp/gpu_check_${name// /_}.log"
    timeout 300 "$@" >"$log" 2>&1
    local rc=$?
    if grep -q "^skipped: no GPU" "$log"; then say "SKIP  $name (no GPU)"
    elif [ $rc -eq 0 ]; then say "PASS  $name $(grep -a -oE '\[  PASSED  \] [0-9]+ tests?' "$log" | tail -1)"
    else say "FAIL  $name (exit $rc)"; grep -a -E 'Failure|error|Which is|Expected' "$log" | head -20 | tee -a "$summary"; fi
}

say "gpu_check: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
make "${MAKE_ARGS[@]}" train_gpt test/test_kernels_cuda >/tmp/gpu_check_build.log 2>&1 || { say "FAIL  build"; tail -30 /tmp/gpu_check_build.log; exit 1; }
make "${MAKE_ARGS[@]}" PRECISION=FP32 -B test/test_kernels_cuda -o train_gpt >>/tmp/gpu_check_build.log 2>&1 &&
    cp test/test_kernels_cuda /tmp/test_kernels_cuda_fp32 || say "FAIL  build of the fp32 kernel tests"
make "${MAKE_ARGS[@]}" -B test/test_kernels_cuda -o train_gpt >>/tmp/gpu_check_build.log 2>&1 || say "FAIL  rebuild of the bf16 kernel tests"
say "built in $((SECONDS - START)) s"

run "kernels+model bf16" test/test_kernels_cuda
[ -x /tmp/test_kernels_cuda_fp32 ] && run "kernels+model fp32" /tmp/test_kernels_cuda_fp32
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    make "${MAKE_ARGS[@]}" PRECISION=FP32 -B test/test_zero_cuda -o train_gpt >/dev/null 2>&1
    for n in 2 3; do run "ZeRO 0-3 on $n ranks sharing the GPU (fp32)" mpirun -np $n --oversubscribe test/test_zero_cuda; done
    # bf16: stochastic rounding must not depend on the stage or the rank count
    make "${MAKE_ARGS[@]}" -B test/test_zero_cuda -o train_gpt >/dev/null 2>&1
    run "ZeRO 0-3 on 3 ranks sharing the GPU (bf16)" mpirun -np 3 --oversubscribe test/test_zero_cuda
else
    say "SKIP  ZeRO multi-rank tests (no MPI on this machine)"
fi
bash scripts/bench_gpu.sh 2>&1 | tee -a "$summary"
say "gpu_check done in $((SECONDS - START)) s"
[ -n "${OUT:-}" ] && cp "$summary" "$OUT/gpu_summary.txt"
! grep -q "^FAIL" "$summary"
