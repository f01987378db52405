#!/usr/bin/env bash
# GPU verification in one command, for a GPU machine with the CUDA toolkit and nothing else to
# rely on (no package manager, no network): builds train_gpt and the GPU tests, runs the tests,
# then scripts/bench_gpu.sh. Correctness first, the largest benchmarks last, and the summary is
# rewritten to $OUT/gpu_summary.txt (when OUT is set, with every log in $OUT/gpu_check_logs.tgz)
# after every test and benchmark, so that a run cut short still leaves what finished. Its lines:
#   PASS|FAIL  <binary>: <test>: <worst error> vs tolerance <its limit> (<ratio> of it) in <check>
#   PASS|FAIL|SKIP  <binary>...                   (the binary as a whole)
#   bench <model> B=.. T=1024 ...: <ms> ms/step, <n> tok/s, MFU <%>
# Exit status: 0 everything passed; 1 something failed, the build included; 77 (automake's
# "skipped") no GPU: everything built, every GPU test skipped (what `make gpu-rehearsal` expects).
#
# Build: `make -f kernels/cuda.mk`, which checks no prerequisites; for this GPU's architecture
# only (nvidia-smi; sm_90, the lent H200's, without one); train_gpt in its own make call beside
# the tests', each test binary once, to its own file. GoogleTest and OpenMPI come from .deps/
# (`scripts/gpu_check.sh --pack` fills it on a machine that has them: scripts/pack_deps.sh),
# else from the system. Without MPI (or without NCCL in the CUDA toolkit, which the MPI build
# links) it builds NO_MPI=1 and skips the ZeRO tests; without OpenBLAS NO_BLAS=1 (plain loops
# for the CPU reference).
# Time, measured here (2 cores, nvcc 13.0, sm_90): each nvcc run is 17-22 s of one core; the two
# make calls side by side took 57 s with both cores free (up to 209 s while other jobs shared
# them). On the 16-core GPU machine the five nvcc runs go side by side: about 25 s. The tests
# and the benchmarks are not timed on a GPU yet (300 s at most per test binary); should a call's
# time run out, they come in this order: kernel tests, ZeRO tests, benchmarks (largest last).
set -u
cd "$(dirname "$0")/.."
[ "${1:-}" = --pack ] && exec bash scripts/pack_deps.sh
NO_GPU=77
START=$SECONDS
export PATH=$PATH:/usr/local/cuda/bin
[ -f .deps/env.sh ] && source .deps/env.sh
logs=$(mktemp -d /tmp/gpu_check_XXXXXX)  # every build and test log, kept
summary=$logs/summary.txt
say() {  # LINE: into the summary; the summary and the logs into $OUT at once
    echo "$*" | tee -a "$summary"
    if [ -n "${OUT:-}" ]; then cp "$summary" "$OUT/gpu_summary.txt" && tar -czf "$OUT/gpu_check_logs.tgz" -C "$logs" .; fi
}
says() { while IFS= read -r line; do say "$line"; done; }  # say every line of stdin

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
MAKE_ARGS=(-f kernels/cuda.mk "GPU_ARCHS=${arch:-90}")
[ -d .deps/include/gtest ] && MAKE_ARGS+=(GTEST_ROOT="$PWD/.deps")
command -v nvcc >/dev/null || { say "FAIL  build: no nvcc"; exit 1; }
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=$(command -v mpirun)
# every binary links MPI when it is chosen: one that does not start costs the ZeRO tests only
if [ -z "$mpi" ] || ! command -v mpicxx >/dev/null; then mpi=""; why_no_mpi="no MPI"
elif [ ! -e "$cuda/include/nccl.h" ] && [ ! -e /usr/include/nccl.h ]; then mpi=""; why_no_mpi="no NCCL in $cuda to link"
elif ! timeout 60 mpirun -np 2 --oversubscribe true >"$logs/mpirun.log" 2>&1; then mpi=""; why_no_mpi="mpirun does not start: mpirun.log"
fi
[ -n "$mpi" ] || MAKE_ARGS+=(NO_MPI=1)
blas=OpenBLAS
echo '#include <cblas.h>' | g++ -E -x c++ - >/dev/null 2>&1 || { MAKE_ARGS+=(NO_BLAS=1); blas="NO_BLAS=1"; }
say "gpu_check: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 | grep . || echo no GPU visible), logs in $logs"
say "build: sm_${arch:-90}, MPI $([ -n "$mpi" ] && echo "${mpi#"$PWD"/}" || echo "none ($why_no_mpi)"), $blas, GoogleTest $([ -d .deps/include/gtest ] && echo from .deps || echo of the system)"

tests=(test/test_kernels_cuda test/test_kernels_cuda_fp32)
[ -n "$mpi" ] && tests+=(test/test_zero_cuda test/test_zero_cuda_fp32)
# one nvcc per binary, one core each: all of them side by side
make "${MAKE_ARGS[@]}" train_gpt >"$logs/build_train_gpt.log" 2>&1 &
make "${MAKE_ARGS[@]}" -k -j"${#tests[@]}" "${tests[@]}" >"$logs/build_tests.log" 2>&1
wait $!
for bin in train_gpt "${tests[@]}"; do
    [ -x "$bin" ] || { say "FAIL  build of $bin"; grep -h -a -E 'error( #|:)|Error [0-9]' "$logs"/build_*.log | head -20 | says; }
done
say "built in $((SECONDS - START)) s"

run() {  # NAME COMMAND...: runs a GoogleTest binary; a line per test it ran and one for it all
    local name=$1; shift
    local log="$logs/${name//[^A-Za-z0-9]/_}.log" bin
    for bin in "$@"; do [[ $bin == test/* ]] && break; done
    [ -x "$bin" ] || { say "FAIL  $name: not built"; return; }
    timeout 300 "$@" --gtest_color=no >"$log" 2>&1
    local rc=$?
    if grep -q '^skipped: no GPU' "$log"; then
        say "SKIP  $name (no GPU)$(sed -n 's/^skipped: no GPU//p' "$log" | head -1)"
        return
    fi
    sed -n "s|^worst-error \([A-Z]*\) |\1  $name: |p" "$log" | says
    if [ $rc -eq 0 ]; then
        say "PASS  $name: $(grep -a -oE '\[  PASSED  \] [0-9]+ tests?' "$log" | tail -1 | cut -c14-)"
    else
        say "FAIL  $name (exit $rc$([ $rc -eq 124 ] && echo ', out of time'))"
        grep -a -E 'Failure|error|Which is|Expected' "$log" | head -20 | says
    fi
}

run "kernels+model bf16" test/test_kernels_cuda
run "kernels+model fp32" test/test_kernels_cuda_fp32
if [ -n "$mpi" ]; then
    for n in 2 3; do run "ZeRO 0-3, $n ranks sharing the GPU, fp32" mpirun -np $n --oversubscribe test/test_zero_cuda_fp32; done
    # bf16: stochastic rounding must not depend on the stage or the rank count
    run "ZeRO 0-3, 3 ranks sharing the GPU, bf16" mpirun -np 3 --oversubscribe test/test_zero_cuda
else
    say "SKIP  ZeRO 0-3 on ranks sharing the GPU ($why_no_mpi)"
fi
case $gpus in
    0) say "SKIP  NCCL (no GPU)" ;;
    1) say "SKIP  NCCL: one GPU" ;;
    *) say "SKIP  NCCL: the ZeRO tests put every rank on GPU 0" ;;
esac

if [ ! -x train_gpt ]; then
    say "FAIL  benchmarks: train_gpt not built"
elif [ "$gpus" -eq 0 ]; then
    # as far as they go without one: the token file (python3 with numpy), train_gpt's start
    export DATA=${DATA:-/tmp/bench_tokens.bin}
    bash scripts/bench_gpu.sh >"$logs/bench.log" 2>&1
    if [ -s "$DATA" ]; then say "SKIP  benchmarks (no GPU)"; else say "FAIL  benchmarks: no token file $DATA (bench.log)"; fi
else
    bash scripts/bench_gpu.sh 2>&1 | while IFS= read -r line; do
        if [[ $line == bench*FAILED ]]; then say "FAIL  $line"; else say "$line"; fi
    done
fi
say "gpu_check done in $((SECONDS - START)) s"
if grep -q "^FAIL" "$summary"; then exit 1; fi
if ! grep -q "^PASS" "$summary"; then exit $NO_GPU; fi
