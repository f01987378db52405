#!/usr/bin/env bash
# Runs every test and ends with one line: "N passed, N failed".
# GoogleTest binaries count their own tests; every other check counts as one.
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
passed=0
failed=0
skipped=0
log=$(mktemp)

# gtest_counts LOG: adds the passed/failed counts GoogleTest printed to the totals
gtest_counts() {
    local p f
    if grep -q '^skipped: no GPU' "$1"; then skipped=$((skipped + 1)); return; fi
    p=$(grep -a -oE '\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$' | tail -1)
    f=$(grep -a -oE '\[  FAILED  \] [0-9]+ tests?,' "$1" | grep -oE '[0-9]+' | tail -1)
    if [ -z "$p" ] && [ -z "$f" ]; then f=1; fi  # crashed before reporting
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
}

run_gtest() {  # NAME COMMAND...
    local name=$1 t0=$SECONDS; shift
    echo "== $name"
    if ! timeout 900 "$@" --gtest_color=no >"$log" 2>&1; then grep -a -E -A4 'Failure$|FAILED|error' "$log" | head -60; fi
    gtest_counts "$log"
    grep -a -E '^\[  (PASSED|FAILED)  \]|skipped' "$log" | head -5
    echo "   ($((SECONDS - t0)) s)"
}

run_check() {  # NAME COMMAND...: passes on exit 0 (skipped when it says "skipped: no GPU")
    local name=$1 t0=$SECONDS; shift
    echo "== $name"
    if timeout 900 "$@" >"$log" 2>&1; then
        if grep -q '^skipped: no GPU' "$log"; then skipped=$((skipped + 1)); echo "skipped: no GPU"; else passed=$((passed + 1)); echo "ok"; fi
    else
        failed=$((failed + 1)); tail -30 "$log"; echo "FAILED: $name"
    fi
    echo "   ($((SECONDS - t0)) s)"
}

run_unittest() {  # NAME COMMAND...: a Python unittest script, each test counted; skipped ones as skipped
    local name=$1 ok n bad skip t0=$SECONDS; shift
    echo "== $name"
    if timeout 900 "$@" >"$log" 2>&1; then ok=1; else ok=0; fi
    n=$(grep -a -oE '^Ran [0-9]+ test' "$log" | grep -oE '[0-9]+')
    bad=$(grep -a -oE 'FAILED \((failures|errors)=[0-9]+(, (failures|errors)=[0-9]+)?' "$log" | grep -oE '[0-9]+' | paste -sd+ | bc)
    skip=$(grep -a -oE '^(OK|FAILED) \(.*skipped=[0-9]+' "$log" | grep -oE 'skipped=[0-9]+' | grep -oE '[0-9]+')
    n=${n:-1}; bad=${bad:-$((1 - ok))}; skip=${skip:-0}; [ "$n" -ge "$bad" ] || n=$bad  # a failed setUpClass runs none
    passed=$((passed + n - bad - skip)); failed=$((failed + bad)); skipped=$((skipped + skip))
    if [ "$bad" -gt 0 ]; then grep -a -E '^(FAIL|ERROR):|Error|assert' "$log" | head -20; fi
    tail -3 "$log"
    echo "   ($((SECONDS - t0)) s)"
}

run_gtest "CPU ops vs their formulas in double" env OMP_NUM_THREADS=2 test/test_ops
run_gtest "CPU ops, NO_BLAS matmul" env OMP_NUM_THREADS=2 test/test_ops_noblas
run_gtest "model vs PyTorch" env OMP_NUM_THREADS=2 test/test_model
run_gtest "model vs PyTorch, NO_BLAS matmul" env OMP_NUM_THREADS=2 test/test_model_noblas
run_gtest "file formats" env OMP_NUM_THREADS=2 test/test_formats
run_gtest "flags, schedules, determinism, training" env OMP_NUM_THREADS=2 test/test_training
run_gtest "HellaSwag file, -h flag, scoring and rank split" env OMP_NUM_THREADS=2 test/test_hellaswag
run_gtest "every file train_gpt reads, mutated: exit 0 or one error line, never a crash" env OMP_NUM_THREADS=1 test/test_file_fuzz
for n in 1 2 3 4; do
    run_gtest "ZeRO stages 0-3 on $n rank(s)" env OMP_NUM_THREADS=1 mpirun -np "$n" --oversubscribe -x OMP_NUM_THREADS test/test_zero
done
# again with collectives that finish only at their wait (test/late_comm.h), as NCCL's may
for n in 2 3 4; do
    run_gtest "ZeRO stages 0-3 on $n rank(s), collectives finishing late" env OMP_NUM_THREADS=1 ZERO_TEST_COMM=late \
        mpirun -np "$n" --oversubscribe -x OMP_NUM_THREADS -x ZERO_TEST_COMM test/test_zero
done
run_check "rank failures end the job; -y 1 resumes rank 0's checkpoint everywhere or stops" bash test/test_failures.sh
run_check "a rank stopped or dead mid-run: the watchdog ends the job with one line" bash test/test_watchdog.sh
run_check "command line: main job runs with the defaults" bash test/test_cli.sh
run_check "memory plan: --plan's lines are the runs', -b auto, what does not fit, README's table" bash test/test_memory_plan.sh
run_check "README and docs/: every link resolves, the flags table lists --help's flags" bash test/test_docs.sh
run_check "run_tiny.sh: killed once, resumes to the same final checkpoint" bash test/test_run_tiny.sh
run_check "diverged runs: NaN parameter refused, exit 3 keeping the checkpoints, resume_loop.sh stops on 3 and 2" bash test/test_divergence.sh
run_check "checkpoints synced before rename and DONE, a full disk says why and keeps the last one" bash test/test_durable_checkpoints.sh
run_check "checkpoints by every rank: d12 on 4 ranks saves and loads in its share of memory and reads, async the same files, a rank killed mid-save resumes bit-exact" bash test/test_sharded_checkpoints.sh
run_check "run_gpt2_*.sh: prepare the data, HellaSwag and tokenizer their flags use" bash test/test_run_scripts.sh
run_check "prerequisites: installs what is missing, nothing when all is there" bash test/test_prerequisites.sh
run_check "make data in a fresh clone, offline: one line saying what to do, or made from SHARED" bash test/test_make_data.sh
if [ -x test/test_kernels_cuda ]; then
    run_gtest "CUDA kernels vs CPU backend" test/test_kernels_cuda
    run_check "attention kernels compile to mma.sync + ldmatrix, no spills (ptxas -v)" bash test/test_attention_build.sh
    run_check "fp8 casts (candidate) round with cvt on sm_90a, in software on sm_80, no spills (ptxas -v)" bash test/test_fp8_build.sh
    run_check "memory plan on a GPU: the run takes what --plan says" bash test/test_memory_plan_gpu.sh
fi
if [ -x build/candidate/test/test_kernels_cuda ] && grep -qs KERNELS_CANDIDATE kernels/cuda/*.cuh; then
    run_gtest "CUDA candidate kernels (KERNELS=candidate) vs CPU backend" build/candidate/test/test_kernels_cuda
fi

run_unittest "int8 block quantizer (CPU kernels) vs NumPy" python3 test/test_quantize.py
run_unittest "data scripts" python3 test/test_data_scripts.py
run_unittest "Nsight Compute kernel table (scripts/kernel_table.py)" python3 test/test_kernel_table.py
run_unittest "step trace (scripts/step_trace.py) and GPU clocks (scripts/gpu_clocks.py) on synthetic records" python3 test/test_step_trace.py
run_unittest "Hugging Face import and export vs transformers' GPT-2" /usr/bin/python3 test/test_hf.py
run_unittest "PyTorch peer of bench_gpu.sh (scripts/bench_nanogpt.py) vs transformers' GPT-2 and torch's AdamW" env OMP_NUM_THREADS=2 /usr/bin/python3 test/test_bench_nanogpt.py
# torch and transformers live in the system Python; the data script it calls needs tiktoken
run_unittest "HellaSwag vs PyTorch on 1 and 2 ranks, plot of a real log" env DATA_PYTHON="$(command -v python3)" \
    /usr/bin/python3 test/test_eval_plot.py

run_check "PyTorch fixtures regenerate to the committed ones, edited ones fail" bash test/test_fixtures.sh

rm -f "$log"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
