#!/usr/bin/env bash
# The one place that knows what train_gpt needs. `make` runs it with `build`, `make test` with `test`.
#   build  what `make` needs: g++, OpenMPI, OpenBLAS, Python with tiktoken and numpy for the data step;
#          with nvcc present also cuBLASLt and NCCL for the CUDA backend
#   test   that, plus what the suite needs: GoogleTest, bc, and Debian's PyTorch with numpy,
#          transformers (pinned: 4.30.2 is the newest that runs on Debian's torch 1.13), safetensors
#          (from 0.3.3, below 1: 0.3.3 and 0.8.0 pass test/test_hf.py) and matplotlib (Debian's, for
#          the plots)
# Whatever is missing is installed where that is possible (root with apt-get; pip), one line per
# package saying why; otherwise it stops with one line naming the command to run. With everything
# present it installs nothing and takes a few tens of milliseconds (one dpkg-query, one Python per
# interpreter).
# Environment: NO_MPI=1 / NO_BLAS=1 drop MPI / OpenBLAS as the Makefile does; NVCC= the CUDA compiler
# the Makefile found (empty: CPU only).
set -euo pipefail
level=${1:?usage: scripts/prerequisites.sh build|test}
case $level in build|test) ;; *) echo "prerequisites: level '$level': expected build or test" >&2; exit 2;; esac
export DEBIAN_FRONTEND=noninteractive

debs=()       # "package|why", wanted from apt
pip_data=()   # "requirement|module|why", wanted in python3 (the data scripts' interpreter)
pip_torch=()  # the same for /usr/bin/python3, where Debian's PyTorch lives
want_deb() { debs+=("$1|$2"); }

want_deb g++ "C++ compiler"
if [ "${NO_MPI:-}" != 1 ]; then
    want_deb libopenmpi-dev "MPI compiler wrapper mpicxx and headers, for ranks"
    want_deb openmpi-bin "mpirun, to start ranks"
fi
if [ "${NO_BLAS:-}" != 1 ]; then
    want_deb libopenblas-dev "OpenBLAS sgemm for the CPU backend's matmuls"
    want_deb libopenblas-openmp-dev "OpenBLAS built for OpenMP, which shares the trainer's threads"
fi
# the data step runs python3 from PATH; without one, Debian's python3 is that interpreter
PY_DATA=$(command -v python3 || echo /usr/bin/python3)
if [ "$PY_DATA" = /usr/bin/python3 ]; then
    want_deb python3 "Python, for the data scripts"
    want_deb python3-numpy "numpy, for the data scripts"
else
    pip_data+=("numpy|numpy|numpy, for the data scripts")
fi
pip_data+=("tiktoken|tiktoken|GPT-2's BPE tokenizer, for the data scripts")

if [ "$level" = test ]; then
    want_deb libgtest-dev "GoogleTest, for the test binaries"
    want_deb bc "arithmetic in the test runner"
    want_deb procps "pgrep, for the tests that kill a rank"
    want_deb python3-torch "PyTorch, the reference the model is tested against"
    want_deb python3-numpy "numpy for the PyTorch reference scripts"
    want_deb python3-matplotlib "matplotlib, for scripts/plot_log.py and its test"
    pip_torch+=("transformers==4.30.2|transformers|transformers' GPT-2 and tokenizer, for the reference checks")
    pip_torch+=("safetensors>=0.3.3,<1|safetensors|safetensors files, for the Hugging Face conversion tests")
fi

# CUDA: the toolkit itself is NVIDIA's to install; we only check that the parts we link are there
if [ -n "${NVCC:-}" ]; then
    cuda=$(dirname "$(dirname "$NVCC")")
    if [ ! -e "$cuda/include/cublasLt.h" ]; then
        echo "prerequisites: cuBLASLt (cublasLt.h) is missing from the CUDA toolkit at $cuda: install NVIDIA's libcublas-dev for it, or build the CPU backend only with 'make NVCC='" >&2
        exit 1
    fi
    if [ "${NO_MPI:-}" != 1 ] && [ ! -e "$cuda/include/nccl.h" ] && [ ! -e /usr/include/nccl.h ]; then
        want_deb libnccl-dev "NCCL, the CUDA backend's communicator"
    fi
fi

# one dpkg-query for every package: the ones not installed are missing
names=(); for d in "${debs[@]}"; do names+=("${d%%|*}"); done
# (dpkg-query fails when any is unknown to it, which is what we are asking)
installed=" $({ dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${names[@]}" 2>/dev/null || true; } | awk '$2 == "ii" {printf "%s ", $1}') "
missing_debs=(); seen=" "
for d in "${debs[@]}"; do
    pkg=${d%%|*}
    if [[ $installed != *" $pkg "* && $seen != *" $pkg "* ]]; then missing_debs+=("$d"); seen+="$pkg "; fi
done

# missing_pips PYTHON ENTRIES...: prints the entries whose module is absent or at a version outside
# the requirement's (==, >= and < on release numbers)
missing_pips() {
    local py=$1; shift
    [ $# -gt 0 ] || return 0
    [ -x "$py" ] || { printf '%s\n' "$@"; return 0; }
    "$py" - "$@" <<'EOF'
import importlib.metadata, importlib.util, operator, re, sys
def release(version):  # "0.3.3" -> (0, 3, 3, 0); "1.0.0rc1" -> (1, 0, 0, 0)
    return tuple(map(int, (re.match(r"\d+(\.\d+)*", version).group().split(".") + ["0"] * 4)[:4]))
for entry in sys.argv[1:]:
    requirement, module, _ = entry.split("|", 2)
    name = re.match(r"[\w.-]+", requirement).group()
    bounds = re.findall(r"(==|>=|<)([\w.]+)", requirement)
    try:
        present = importlib.util.find_spec(module) is not None
        if present and bounds:
            have = release(importlib.metadata.version(name))
            compare = {"==": operator.eq, ">=": operator.ge, "<": operator.lt}
            present = all(compare[op](have, release(want)) for op, want in bounds)
    except Exception:
        present = False
    if not present:
        print(entry)
EOF
}
mapfile -t missing_data < <(missing_pips "$PY_DATA" "${pip_data[@]}")
mapfile -t missing_torch < <(missing_pips /usr/bin/python3 "${pip_torch[@]}")

[ ${#missing_debs[@]} -eq 0 ] && [ ${#missing_data[@]} -eq 0 ] && [ ${#missing_torch[@]} -eq 0 ] && exit 0

am_root=0; [ "$(id -u)" = 0 ] && am_root=1
# pip_needs_root PYTHON: Debian's system Python (or any non-writable one) needs root to install into
pip_needs_root() { [ ! -w "$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || echo /usr)" ]; }
if [ ${#missing_torch[@]} -gt 0 ] || { [ ${#missing_data[@]} -gt 0 ] && [ "$PY_DATA" = /usr/bin/python3 ]; }; then
    /usr/bin/python3 -m pip --version >/dev/null 2>&1 || missing_debs+=("python3-pip|pip, to install the Python packages below")
fi

if [ ${#missing_debs[@]} -gt 0 ]; then
    pkgs=(); for d in "${missing_debs[@]}"; do pkgs+=("${d%%|*}"); done
    if [ $am_root != 1 ] || ! command -v apt-get >/dev/null; then
        echo "prerequisites: missing ${pkgs[*]}; run: sudo apt-get install -y ${pkgs[*]}" >&2
        exit 1
    fi
    for d in "${missing_debs[@]}"; do echo "prerequisites: installing ${d%%|*} (${d#*|})"; done
    log=$(mktemp)
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } >"$log" 2>&1; then
        tail -5 "$log" >&2; rm -f "$log"
        echo "prerequisites: apt-get install ${pkgs[*]} failed (see above)" >&2
        exit 1
    fi
    rm -f "$log"
fi

# pip_install PYTHON ENTRIES...: installs the requirements, never another torch (none of them needs one)
pip_install() {
    local py=$1; shift
    [ $# -gt 0 ] || return 0
    local reqs=() flags=(-q) e
    for e in "$@"; do reqs+=("${e%%|*}"); done
    # Debian marks its Python as externally managed (PEP 668); installing beside its packages is the point here
    [ -e "$("$py" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" ] && flags+=(--break-system-packages)
    [ $am_root = 1 ] && flags+=(--root-user-action=ignore)  # installing as root is what was asked for
    if pip_needs_root "$py" && [ $am_root != 1 ]; then
        echo "prerequisites: missing ${reqs[*]} in $py; run: sudo $py -m pip install ${flags[*]} ${reqs[*]@Q}" >&2
        exit 1
    fi
    for e in "$@"; do
        local rest=${e#*|}
        echo "prerequisites: installing ${e%%|*} into $py (${rest#*|})"
    done
    "$py" -m pip install "${flags[@]}" "${reqs[@]}" || { echo "prerequisites: pip install ${reqs[*]} into $py failed" >&2; exit 1; }
}
pip_install "$PY_DATA" "${missing_data[@]}"
pip_install /usr/bin/python3 "${missing_torch[@]}"
