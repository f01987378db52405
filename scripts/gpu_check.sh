#!/usr/bin/env bash
# GPU verification in one command, for a GPU machine with the CUDA toolkit and nothing else to
# rely on (no package manager, no network): builds train_gpt and the GPU tests, runs the tests,
# then scripts/bench_gpu.sh; for the default kernels and, when a kernels/cuda/*.cuh holds
# KERNELS_CANDIDATE, for the candidate build too (kernels/cuda.mk's KERNELS=candidate, in
# build/candidate/). Correctness first, the largest benchmarks last.
#
# The device call. .deps/ (GoogleTest, OpenMPI) is ignored by git, so it travels only when
# carried: make it first, in the checkout that the call sends, with `bash scripts/gpu_check.sh
# --pack` (`make gpu-rehearsal` does too). The summary is the call's output; $OUT gets two files.
#   run(carry=[".deps"], command="bash scripts/gpu_check.sh", timeout_s=600)
#   a short first call, the kernel tests alone:
#   run(carry=[".deps"], command="bash scripts/gpu_check.sh --only kernels --budget 240", timeout_s=300)
#
# Options:
#   --only WORDS         a comma list of phases (kernels, zero, train, bench, memcheck) and builds
#                        (default, candidate) to run, e.g. --only candidate,kernels; each phase
#                        builds what it runs
#   --filter PATTERN     GoogleTest's --gtest_filter for every test binary, e.g. 'Cuda.Attention*'
#   --memcheck[=FILTER]  adds compute-sanitizer's memcheck over the kernel tests FILTER names
#                        (default the small shapes: see MEMCHECK_FILTER below), with its time
#   --timeout S          the most that one test binary, mpirun or benchmark run takes (150)
#   --budget S           the whole check's time (540, of a 600 s call): see Time
#   --pack               fills .deps/ (scripts/pack_deps.sh) and stops
#
# The summary: rewritten to $OUT/gpu_summary.txt after every line, the logs packed into
# $OUT/gpu_check_logs.tgz then and every 15 s, so a call cut short keeps what was written. Lines:
#   PASS|FAIL  <build> <binary>: <test>: <worst error> vs tolerance <limit> (<ratio> of it) in <check>
#   PASS|FAIL|SKIP  <build> <binary>: ...        (the binary as a whole)
#   bench <build> <model> B=.. T=1024 ...: <ms> ms/step, <n> tok/s, MFU <%>
#   WARN  <build> build: <a compiler warning>   (built without -Werror: another toolkit may warn)
# A binary that ends without GoogleTest's final summary (a CUDA fault exits the process; a hang
# meets its timeout) gets a line naming the test it died in and its last error; then each test
# that did not finish runs again alone, with CUDA_SYNC_LAUNCHES=1 (kernels/cuda/common.cuh: each
# launch checked at once, the faulting one named) and its own timeout, a line each. When the test
# it died in passes alone, the fault was an earlier test's, and those run alone too.
# A test binary that finds no GPU says "skipped: no GPU (CUDA's reason)": SKIP, or FAIL when
# nvidia-smi lists a GPU (a driver older than the toolkit, a device CUDA cannot use).
# Exit status: 0 everything passed; 1 something failed, the build included; 77 (automake's
# "skipped") no GPU: everything built, every GPU test skipped (what `make gpu-rehearsal` expects).
#
# Time. Each phase ends by its deadline, a share of --budget (shares of the phases run, scaled to
# it), so a slow phase cannot take a later one's time; within a phase each build gets its part in
# turn; what cannot start in time is said SKIP (out of time). The shares, scaled to the default
# 540 s, follow what each phase took on a GPU (docs/gpu_runs.md has the times):
#   build      50 s  both builds side by side
#   kernels   170 s  bf16 and fp32 kernel tests per build, --timeout each, a test rerun alone half
#   zero       70 s  per build: mpirun of the ZeRO tests, 2 and 3 ranks fp32, 3 ranks bf16, 2
#                    ranks fp32 with collectives finishing late (test/late_comm.h); with two GPUs
#                    or more, the ZeRO tests over NCCL (a GPU per rank) and test/test_nccl_gpus.sh
#                    (d12 over NCCL against one GPU)
#   train      60 s  the trainer's own checks on the GPU (default build): test/test_memory_plan_gpu.sh
#                    (the plan against what the runs take) and test/test_divergence.sh (a NaN model
#                    refused, a diverging run stopped with exit 3, its checkpoint kept)
#   bench     220 s  bench_gpu.sh per build, --timeout a run, PyTorch's twice that (attention,
#                    d12 and d48 beside PyTorch's with the clocks, a d12 step traced, kernels,
#                    GEMMs, d12's kernel table, d12 and d48 with --gemm-algos, d48's kernel table,
#                    offload, d24, ZeRO 0-3: the most wanted first; PyTorch's compile takes a
#                    minute or more, so the last runs may not fit: `--only bench --budget 540`)
#   memcheck  150 s  only with --memcheck; memcheck slows kernels tens of times
# One build fits a 600 s call; two builds (a candidate kernel in the tree) do not: each phase is
# halved between them and the fp32 tests, the bf16 ZeRO tests and the later benchmarks run out of
# time (SKIP lines). Then split the check over two calls: --only kernels,zero, then --only bench.
#
# Build: `make -f kernels/cuda.mk` (no prerequisites check) without -Werror (warnings are WARN
# lines), for this GPU's architecture only (nvidia-smi; sm_90, the lent H200's, without one).
# GoogleTest and OpenMPI come from .deps/ (scripts/pack_deps.sh), else from the system. NCCL:
# NCCL_HOME, the toolkit, /usr, /usr/local/nccl, /opt/nccl, then the Python wheel (nvidia/nccl in
# python3's site-packages or /opt/*/.venv, where the H200 has it: lib/libnccl.so.2 only, linked
# by that name with an rpath). Without MPI or NCCL it builds NO_MPI=1 and skips the ZeRO tests;
# without OpenBLAS NO_BLAS=1 (plain loops for the CPU reference).
set -u
cd "$(dirname "$0")/.."
[ "${1:-}" = --pack ] && exec bash scripts/pack_deps.sh
NO_GPU=77
START=$SECONDS
MEMCHECK_FILTER='Cuda.*-*Model*:*Training*:*Shape*'  # the tests at small shapes
only="" filter="" memcheck="" timeout_s=150 budget=540
usage() { echo "gpu_check: $1 (usage: gpu_check.sh [--only WORDS] [--filter PATTERN] [--memcheck[=FILTER]] [--timeout S] [--budget S] | --pack)" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --only) only=${2:-}; shift ;;
        --filter) filter=${2:-}; shift ;;
        --memcheck) memcheck=$MEMCHECK_FILTER ;;
        --memcheck=*) memcheck=${1#*=} ;;
        --timeout) timeout_s=${2:-}; shift ;;
        --budget) budget=${2:-}; shift ;;
        *) usage "unknown argument '$1'" ;;
    esac
    shift
done
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || usage "--timeout wants whole seconds, not '$timeout_s'"
[[ $budget =~ ^[1-9][0-9]*$ ]] || usage "--budget wants whole seconds, not '$budget'"
phases=(kernels zero train bench) builds=(default candidate)
[ -n "$memcheck" ] && phases+=(memcheck)
if [ -n "$only" ]; then
    want_phases=() want_builds=()
    for w in ${only//,/ }; do
        case $w in
            kernels | zero | train | bench) want_phases+=("$w") ;;
            memcheck) want_phases+=("$w"); memcheck=${memcheck:-$MEMCHECK_FILTER} ;;
            default | candidate) want_builds+=("$w") ;;
            *) usage "--only takes kernels, zero, train, bench, memcheck, default, candidate; not '$w'" ;;
        esac
    done
    [ ${#want_phases[@]} -gt 0 ] && phases=("${want_phases[@]}")
    [ ${#want_builds[@]} -gt 0 ] && builds=("${want_builds[@]}")
fi
has() { local x; for x in "${@:2}"; do [ "$x" = "$1" ] && return 0; done; return 1; }  # WORD LIST...
[ "$memcheck" = "$MEMCHECK_FILTER" ] && [ -n "$filter" ] && memcheck=$filter  # the tests asked for

export PATH=$PATH:/usr/local/cuda/bin
logs=$(mktemp -d /tmp/gpu_check_XXXXXX)  # every build and test log, kept
summary=$logs/summary.txt
publish() {  # the summary and the logs into $OUT, each file replaced whole
    [ -n "${OUT:-}" ] || return 0
    cp "$summary" "$OUT/summary.$BASHPID" && mv -f "$OUT/summary.$BASHPID" "$OUT/gpu_summary.txt"
    tar -czf "$OUT/logs.$BASHPID" -C "$logs" . 2>/dev/null && mv -f "$OUT/logs.$BASHPID" "$OUT/gpu_check_logs.tgz"
}
say() { echo "$*" | tee -a "$summary"; publish; }  # LINE: into the summary, and out
says() { while IFS= read -r line; do say "$line"; done; }  # say every line of stdin
details() { sed "s|^|  $1: |" | says; }  # TITLE: say every line of stdin, under TITLE
(while sleep 15; do publish; done) >/dev/null 2>&1 &
packer=$!
trap 'kill $packer 2>/dev/null' EXIT

if [ ! -d .deps ] && ! echo '#include <gtest/gtest.h>' | g++ -E -x c++ - >/dev/null 2>&1; then
    say "FAIL  no .deps/ and no GoogleTest: .deps/ is ignored by git, so a device call must carry it: make it with \`bash scripts/gpu_check.sh --pack\` and call run(carry=[\".deps\"], ...)"
    exit 1
fi
[ -f .deps/env.sh ] && source .deps/env.sh
command -v nvcc >/dev/null || { say "FAIL  build: no nvcc"; exit 1; }
cuda=$(dirname "$(dirname "$(command -v nvcc)")")

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader 2>/dev/null | head -1 |
    awk -F', ' 'NF == 4 { printf "%s, %s, driver %s (CUDA %s), compute mode %s", $1, $2, $3, cu, $4 }' cu="$(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: [0-9.]+' | cut -d' ' -f3)")
say "gpu_check: ${gpu:-no GPU listed by nvidia-smi}; toolkit $(nvcc --version | grep -oE 'release [0-9.]+' | cut -d' ' -f2) ($cuda); $(nproc) cores; budget $budget s; logs in $logs"

# NCCL_HOME (include/, lib/) for kernels/cuda.mk, or none where the toolkit or the system has it
nccl_dirs() {  # the folders that may hold include/nccl.h and lib/libnccl.so*, in the order tried
    local site
    echo /usr/local/nccl; echo /opt/nccl
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null | sed 's|$|/nvidia/nccl|'
    for site in /opt/*/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages; do echo "$site/nvidia/nccl"; done
}
nccl="" nccl_home=""
if [ -n "${NCCL_HOME:-}" ]; then
    if [ -e "$NCCL_HOME/include/nccl.h" ] && compgen -G "$NCCL_HOME/lib/libnccl.so*" >/dev/null; then nccl_home=$NCCL_HOME
    else say "FAIL  NCCL_HOME=$NCCL_HOME: wants include/nccl.h and lib/libnccl.so*; looking elsewhere"; fi
fi
if [ -n "$nccl_home" ]; then nccl="$nccl_home (NCCL_HOME)"
elif [ -e "$cuda/include/nccl.h" ]; then nccl="the toolkit's ($cuda)"
elif [ -e /usr/include/nccl.h ]; then nccl="the system's (/usr/include)"
else
    while IFS= read -r dir; do
        if [ -e "$dir/include/nccl.h" ] && compgen -G "$dir/lib/libnccl.so*" >/dev/null; then nccl_home=$dir; break; fi
    done < <(nccl_dirs)
    [ -n "$nccl_home" ] && nccl="$nccl_home$([ -e "$nccl_home/lib/libnccl.so" ] || echo ': lib/libnccl.so.2 alone, linked by that name')"
fi

MAKE_ARGS=(-f kernels/cuda.mk "GPU_ARCHS=${arch:-90}" NVCC_WERROR=)
[ -d .deps/include/gtest ] && MAKE_ARGS+=(GTEST_ROOT="$PWD/.deps")
MAKE_ARGS+=(NCCL_HOME="$nccl_home")  # set, or empty over the environment's
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=$(command -v mpirun)
# every binary links MPI when it is chosen: one that does not start costs the ZeRO tests only
if [ -z "$mpi" ] || ! command -v mpicxx >/dev/null; then mpi=""; why_no_mpi="no MPI"
elif [ -z "$nccl" ]; then mpi=""; why_no_mpi="no NCCL to link: not in NCCL_HOME, $cuda, /usr or a Python wheel"
elif ! timeout 60 mpirun -np 2 --oversubscribe true >"$logs/mpirun.log" 2>&1; then mpi=""; why_no_mpi="mpirun does not start: mpirun.log"
fi
[ -n "$mpi" ] || MAKE_ARGS+=(NO_MPI=1)
blas=OpenBLAS
echo '#include <cblas.h>' | g++ -E -x c++ - >/dev/null 2>&1 || { MAKE_ARGS+=(NO_BLAS=1); blas="NO_BLAS=1"; }
candidates=$(grep -l KERNELS_CANDIDATE kernels/cuda/*.cuh 2>/dev/null | paste -sd' ')
if [ -z "$candidates" ] && has candidate "${builds[@]}"; then
    has default "${builds[@]}" && builds=(default) || builds=()
    say "SKIP  candidate build: no kernels/cuda/*.cuh holds KERNELS_CANDIDATE"
fi
say "build: sm_${arch:-90}, MPI $([ -n "$mpi" ] && echo "${mpi#"$PWD"/}" || echo "none ($why_no_mpi)"), NCCL ${nccl:-none}, $blas, GoogleTest $([ -d .deps/include/gtest ] && echo from .deps || echo of the system); builds: ${builds[*]:-none}${candidates:+ (KERNELS_CANDIDATE in $candidates)}; phases: ${phases[*]}"
[ ${#builds[@]} -gt 0 ] || exit 1

# each phase's deadline: its share of the budget, the shares of the phases run scaled to it
declare -A share=([build]=50 [kernels]=170 [zero]=70 [train]=60 [bench]=220 [memcheck]=150) deadline=()
total=${share[build]}
for p in "${phases[@]}"; do total=$((total + share[$p])); done
sum=0 until=""
for p in build kernels zero train bench memcheck; do
    [ "$p" = build ] || has "$p" "${phases[@]}" || continue
    sum=$((sum + share[$p]))
    deadline[$p]=$((START + budget * sum / total))
    until+="${until:+, }$p by $((budget * sum / total)) s"
done
say "time: $until; at most $timeout_s s a test binary, mpirun or benchmark run, $((timeout_s / 2)) s a test alone"
limit() {  # CAP UNTIL: seconds a command may take, at most CAP, ending by UNTIL (SECONDS' clock)
    local left=$(($2 - SECONDS))
    echo $((left < $1 ? left : $1))
}
prefix() { case $1 in default) echo "" ;; candidate) echo build/candidate/ ;; esac; }  # BUILD: its folder
kernels_bins=(test/test_kernels_cuda test/test_kernels_cuda_fp32)
zero_bins=(test/test_zero_cuda test/test_zero_cuda_fp32)

# ---- build: one make per build, side by side, one nvcc per binary and core
targets=()
{ has kernels "${phases[@]}" || has memcheck "${phases[@]}"; } && targets+=("${kernels_bins[@]}")
has zero "${phases[@]}" && [ -n "$mpi" ] && targets+=("${zero_bins[@]}")
has zero "${phases[@]}" && [ -n "$mpi" ] && [ "$gpus" -ge 2 ] && targets+=(train_gpt)  # d12 over NCCL
has bench "${phases[@]}" && targets+=(train_gpt scripts/bench_attention scripts/bench_gemm test/bench_kernels_cuda scripts/kernel_trace.so)
has train "${phases[@]}" && targets+=(train_gpt)
jobs=$(($(nproc) / ${#builds[@]}))
declare -A maker=()
for b in "${builds[@]}"; do
    timeout -k 10 "$(limit 100000 "${deadline[build]}")" make "${MAKE_ARGS[@]}" KERNELS="$b" -k -j"$((jobs > 0 ? jobs : 1))" \
        "${targets[@]/#/$(prefix "$b")}" >"$logs/build_$b.log" 2>&1 &
    maker[$b]=$!
done
for b in "${builds[@]}"; do
    wait "${maker[$b]}"
    rc=$?
    for t in "${targets[@]}"; do
        bin=$(prefix "$b")$t
        [ -x "$bin" ] || say "FAIL  $b build of $bin$([ $rc -eq 124 ] && echo ": out of time")"
    done
    [ $rc -eq 0 ] || grep -h -a -E 'error( #|:)|Error [0-9]' "$logs/build_$b.log" | head -20 | details "$b build"
    grep -h -a -E 'warning( #|:)' "$logs/build_$b.log" | sort -u | head -20 | sed "s/^/WARN  $b build: /" | says
done
say "built ${builds[*]} in $((SECONDS - START)) s"

# ---- a GoogleTest binary and what it says
cuda_missing=""  # CUDA's reason, once a binary found no GPU that nvidia-smi lists
died_in=""       # set by run_gtest: the test a binary died in ("" when it finished)
finished() { sed -n -E 's/^\[ +(OK|FAILED|SKIPPED) +\] ([^ ,]+).* \([0-9]+ ms\)$/\2/p' "$1"; }  # LOG: the tests that ended
last_error() { grep -a -E '^error: |CUDA error|cuBLAS error|terminate called|Segmentation fault|Aborted' "$1" | tail -1 | cut -c1-400; }
how_ended() {  # RC: "exit N", "out of time" or the signal
    case $1 in 124 | 137) echo "out of time" ;; 1[3-9][0-9]) echo "killed by SIG$(kill -l $(($1 - 128)))" ;; *) echo "exit $1" ;; esac
}
# NAME UNTIL COMMAND...: runs a GoogleTest binary (COMMAND: the binary, or mpirun ... binary) to
# a line per test it ran and one for it all; should it die, each test it did not finish alone
run_gtest() {
    local name=$1 until=$2; shift 2
    local log="$logs/${name//[^A-Za-z0-9]/_}.log" bin t rc secs
    for bin in "$@"; do [[ $bin == */test_* ]] && break; done
    [ -x "$bin" ] || { say "FAIL  $name: not built"; return; }
    secs=$(limit "$timeout_s" "$until")
    [ "$secs" -ge 5 ] || { say "SKIP  $name (out of time)"; return; }
    timeout -k 10 "$secs" "$@" --gtest_color=no ${filter:+--gtest_filter="$filter"} >"$log" 2>&1
    rc=$?
    if grep -q '^skipped: no GPU' "$log"; then
        local why
        why=$(sed -n 's/^skipped: no GPU//p' "$log" | head -1)
        if [ "$gpus" -gt 0 ]; then
            cuda_missing=${why%, * ranks started}
            say "FAIL  $name: CUDA finds no GPU though nvidia-smi lists $gpus$why"
        else
            say "SKIP  $name: no GPU$why"
        fi
        return
    fi
    sed -n "s|^worst-error \([A-Z]*\) |\1  $name: |p" "$log" | says
    if grep -a -qE '^\[==========\] [0-9]+ tests? from .* ran' "$log"; then
        if [ $rc -eq 0 ]; then
            say "PASS  $name: $(grep -a -oE '\[  PASSED  \] [0-9]+ tests?' "$log" | tail -1 | cut -c14-)"
        else
            say "FAIL  $name (exit $rc)"
            grep -a -E 'Failure|error|Which is|Expected' "$log" | head -20 | details "$name"
        fi
        return
    fi
    # died: which test, and the tests it did not finish, alone
    died_in=$(grep -a -oE '^\[ RUN      \] [^ ]+' "$log" | tail -1 | cut -c14-)
    local list_cmd=("$bin") all done_tests rest
    [ "$1" = mpirun ] && list_cmd=(mpirun -np 1 --oversubscribe "$bin")
    all=$(timeout -k 10 60 "${list_cmd[@]}" --gtest_list_tests ${filter:+--gtest_filter="$filter"} 2>/dev/null |
        awk '/^[^ ]/ { suite = $1 } /^  [^ ]/ { print suite $1 }')
    if [ -z "$all" ]; then
        say "FAIL  $name: died ($(how_ended $rc)) before its tests could be listed: $(last_error "$log")"
        return
    fi
    done_tests=$(finished "$log")
    rest=$(grep -vxF -f <(echo "$done_tests") <<<"$all")
    say "FAIL  $name: died ($(how_ended $rc)) in [ RUN ] ${died_in:-(before the first test)}: $(last_error "$log"); $(grep -c . <<<"$done_tests") of $(grep -c . <<<"$all") tests ended, the other $(grep -c . <<<"$rest") run alone with CUDA_SYNC_LAUNCHES=1"
    local alone_passed=""
    for t in $rest; do
        run_alone "$name" "$until" "$t" loud "$@" && [ "$t" = "$died_in" ] && alone_passed=1
    done
    if [ -n "$alone_passed" ]; then
        local before
        before=$(awk -v t="$died_in" '$0 == t { exit } { print }' <<<"$all")
        say "FAIL  $name: $died_in passes alone: the fault came from an earlier test; the $(grep -c . <<<"$before") before it run alone"
        for t in $before; do run_alone "$name" "$until" "$t" quiet "$@"; done
    fi
}
# NAME UNTIL TEST loud|quiet COMMAND...: TEST alone, each launch checked at once, and a line
# saying how it ended (quiet: only when it failed). Its status: 0 when it passed.
run_alone() {
    local name=$1 until=$2 t=$3 quiet=$4; shift 4
    local log="$logs/${name//[^A-Za-z0-9]/_}.${t//[^A-Za-z0-9]/_}.log" cmd=("$@") secs rc
    [ "$1" = mpirun ] && cmd=(mpirun -x CUDA_SYNC_LAUNCHES=1 "${@:2}")
    secs=$(limit $((timeout_s / 2)) "$until")
    [ "$secs" -ge 5 ] || { say "SKIP  $name: $t alone (out of time)"; return 1; }
    CUDA_SYNC_LAUNCHES=1 timeout -k 10 "$secs" "${cmd[@]}" --gtest_color=no --gtest_filter="$t" >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -a -q "^\[       OK \] $t " "$log"; then
        [ "$quiet" = quiet ] || say "PASS  $name: $t alone$(sed -n "s|^worst-error PASS $t||p" "$log" | head -1)"
        return 0
    fi
    if grep -a -q "^\[  FAILED  \] $t (" "$log"; then
        say "FAIL  $name: $t alone$(sed -n "s|^worst-error FAIL $t||p" "$log" | head -1)"
        grep -a -E 'Failure|Which is|Expected' "$log" | head -10 | details "$name"
    else
        say "FAIL  $name: $t alone died ($(how_ended $rc)): $(last_error "$log")"
    fi
    return 1
}

phase_start=0
part_until() {  # PHASE I: when the I-th of the builds' parts of PHASE ends (its phase started at phase_start)
    echo $((phase_start + (deadline[$1] - phase_start) * ($2 + 1) / ${#builds[@]}))
}

if has kernels "${phases[@]}"; then
    phase_start=$SECONDS
    for i in "${!builds[@]}"; do
        b=${builds[$i]} d=$(prefix "${builds[$i]}")
        run_gtest "$b kernels bf16" "$(part_until kernels "$i")" "${d}test/test_kernels_cuda"
        run_gtest "$b kernels fp32" "$(part_until kernels "$i")" "${d}test/test_kernels_cuda_fp32"
    done
fi

if has zero "${phases[@]}"; then
    phase_start=$SECONDS
    for i in "${!builds[@]}"; do
        b=${builds[$i]} d=$(prefix "${builds[$i]}")
        if [ -z "$mpi" ]; then say "SKIP  $b ZeRO 0-3 on ranks sharing the GPU ($why_no_mpi)"; continue; fi
        for n in 2 3; do
            run_gtest "$b ZeRO 0-3, $n ranks sharing the GPU, fp32" "$(part_until zero "$i")" mpirun -np $n --oversubscribe "${d}test/test_zero_cuda_fp32"
        done
        # bf16: stochastic rounding must not depend on the stage or the rank count
        run_gtest "$b ZeRO 0-3, 3 ranks sharing the GPU, bf16" "$(part_until zero "$i")" mpirun -np 3 --oversubscribe "${d}test/test_zero_cuda"
    done
    # the collectives finishing only at their wait (test/late_comm.h), on ranks sharing the GPU
    for i in "${!builds[@]}"; do
        b=${builds[$i]} d=$(prefix "${builds[$i]}")
        [ -n "$mpi" ] && run_gtest "$b ZeRO 0-3, 2 ranks sharing the GPU, fp32, collectives finishing late" "$(part_until zero "$i")" \
            env ZERO_TEST_COMM=late mpirun -np 2 --oversubscribe -x ZERO_TEST_COMM "${d}test/test_zero_cuda_fp32"
    done
    # NCCL between GPUs, a GPU per rank: the ZeRO tests, then d12 against one GPU
    if [ "$gpus" -lt 2 ]; then say "SKIP  NCCL between GPUs: $gpus GPU(s)"
    elif [ -z "$mpi" ]; then say "SKIP  NCCL between GPUs ($why_no_mpi)"
    else
        for i in "${!builds[@]}"; do
            b=${builds[$i]} d=$(prefix "${builds[$i]}")
            run_gtest "$b ZeRO 0-3 over NCCL, $gpus ranks on $gpus GPUs, fp32" "$(part_until zero "$i")" \
                env ZERO_TEST_COMM=nccl mpirun -np "$gpus" --oversubscribe -x ZERO_TEST_COMM "${d}test/test_zero_cuda_fp32"
        done
        has default "${builds[@]}" && run_script "d12 over NCCL on $gpus GPUs against one" "${deadline[zero]}" bash test/test_nccl_gpus.sh ./train_gpt
    fi
fi

# NAME UNTIL SCRIPT...: a test script that ends "ok: ..." (PASS), "skipped: no GPU" or "FAIL: ..."
run_script() {
    local name=$1 until=$2; shift 2
    local log="$logs/${name//[^A-Za-z0-9]/_}.log" secs rc
    secs=$(limit "$timeout_s" "$until")
    [ "$secs" -ge 5 ] || { say "SKIP  $name (out of time)"; return; }
    timeout -k 10 "$secs" "$@" >"$log" 2>&1
    rc=$?
    if grep -q '^skipped: no GPU' "$log"; then
        say "$([ "$gpus" -gt 0 ] && echo "FAIL  $name: skipped, though nvidia-smi lists $gpus GPU(s)" || echo "SKIP  $name: no GPU")"
    elif [ $rc -eq 0 ]; then
        say "PASS  $name: $(grep -v '^ *$' "$log" | tail -1 | cut -c1-300)"
    else
        say "FAIL  $name ($(how_ended $rc)): $(grep -a -E '^FAIL' "$log" | head -1 | cut -c1-300)"
        grep -a -v -E '^FAIL' "$log" | tail -8 | details "$name"
    fi
}

if has train "${phases[@]}"; then
    if ! has default "${builds[@]}"; then
        say "SKIP  train: its checks run the default build"
    elif [ ! -x train_gpt ]; then
        say "FAIL  train: ./train_gpt not built"
    else
        run_script "memory plan on the GPU" "${deadline[train]}" bash test/test_memory_plan_gpu.sh ./train_gpt
        if [ "$gpus" -eq 0 ]; then say "SKIP  divergence on the GPU: no GPU"
        elif [ -z "$(command -v mpirun)" ]; then say "SKIP  divergence on the GPU: no mpirun"
        else run_script "divergence on the GPU" "${deadline[train]}" bash test/test_divergence.sh; fi
    fi
fi

if has bench "${phases[@]}"; then
    phase_start=$SECONDS
    export DATA=${DATA:-/tmp/bench_tokens.bin}
    for i in "${!builds[@]}"; do
        b=${builds[$i]} train_gpt=./$(prefix "${builds[$i]}")train_gpt
        secs=$(limit 100000 "$(part_until bench "$i")")
        if [ ! -x "$train_gpt" ]; then
            say "FAIL  $b benchmarks: $train_gpt not built"
        elif [ "$gpus" -eq 0 ]; then
            # as far as they go without one: the token file (python3 with numpy), train_gpt's start
            TRAIN_GPT=$train_gpt bash scripts/bench_gpu.sh >"$logs/bench_$b.log" 2>&1
            if [ -s "$DATA" ]; then say "SKIP  $b benchmarks: no GPU"; else say "FAIL  $b benchmarks: no token file $DATA (bench_$b.log)"; fi
        elif [ -n "$cuda_missing" ]; then
            say "FAIL  $b benchmarks: not run, CUDA finds no GPU$cuda_missing"
        elif [ "$secs" -lt 10 ]; then
            say "SKIP  $b benchmarks (out of time)"
        else
            # a line as each run ends; each run at most --timeout, and ended (kill included) by the
            # phase's part, so that none is left on the GPU beside the next build's benchmarks; the
            # outer timeout only backs that up
            TRAIN_GPT=$train_gpt BENCH_TIMEOUT=$timeout_s BENCH_DEADLINE=$(($(date +%s) + secs - 8)) \
                timeout -k 10 "$((secs + 5))" bash scripts/bench_gpu.sh 2>&1 |
                tee "$logs/bench_$b.log" | while IFS= read -r line; do
                    case $line in
                        bench*": FAILED"*) say "FAIL  ${line/#bench /bench $b }" ;;  # "FAILED" or "FAILED (why)"
                        bench*"not run (out of time)") say "SKIP  ${line/#bench /bench $b }" ;;
                        bench*) say "${line/#bench /bench $b }" ;;
                        *) say "  $b: $line" ;;  # what a bench line's run said beside it
                    esac
                done
            [ "${PIPESTATUS[0]}" -ne 124 ] || say "SKIP  $b benchmarks after the first $secs s (out of time): the rest not run"
        fi
    done
fi

if has memcheck "${phases[@]}"; then
    phase_start=$SECONDS
    sanitizer=$(command -v compute-sanitizer || echo "$cuda/bin/compute-sanitizer")
    for i in "${!builds[@]}"; do
        b=${builds[$i]} d=$(prefix "${builds[$i]}")
        [ -x "$sanitizer" ] || { say "SKIP  $b memcheck: no compute-sanitizer in $cuda/bin"; continue; }
        for p in bf16 fp32; do
            name="$b memcheck kernels $p ($memcheck)" bin=${d}test/test_kernels_cuda$([ $p = fp32 ] && echo _fp32)
            log="$logs/memcheck_${b}_$p.log" secs=$(limit $((4 * timeout_s)) "$(part_until memcheck "$i")") t0=$SECONDS
            [ -x "$bin" ] || { say "FAIL  $name: not built"; continue; }
            [ "$secs" -ge 10 ] || { say "SKIP  $name (out of time)"; continue; }
            timeout -k 10 "$secs" "$sanitizer" --tool memcheck --error-exitcode 3 --print-limit 20 "$bin" --gtest_color=no --gtest_filter="$memcheck" >"$log" 2>&1
            rc=$?
            errors=$(grep -a -oE 'ERROR SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
            if grep -q '^skipped: no GPU' "$log"; then
                say "$([ "$gpus" -gt 0 ] && echo FAIL || echo SKIP)  $name: no GPU$(sed -n 's/^skipped: no GPU//p' "$log" | head -1)"
            elif [ $rc -eq 0 ] && [ "${errors:-1}" = 0 ]; then
                say "PASS  $name: no memory errors, $(grep -a -oE '\[  PASSED  \] [0-9]+ tests?' "$log" | tail -1 | cut -c14-) in $((SECONDS - t0)) s"
            else
                say "FAIL  $name ($(how_ended $rc)): ${errors:-no} memcheck errors in $((SECONDS - t0)) s"
                grep -a -E '^========= +(Invalid|at |Address|Program hit)|Failure' "$log" | head -12 | details "$name"
            fi
        done
    done
fi

say "gpu_check done in $((SECONDS - START)) s"
if grep -q "^FAIL" "$summary"; then exit 1; fi
if ! grep -qE "^(PASS|bench)" "$summary"; then exit $NO_GPU; fi
