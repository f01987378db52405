"""Per-kernel table of a training run profiled by Nsight Compute: time per step summed by kernel
name, with calls per step and share, and the totals of attention, the GEMMs and everything else.

    ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum \\
        --print-kernel-base function --csv --page raw ./train_gpt ... > profile.csv
    python3 scripts/kernel_table.py profile.csv STEPS [STEP_MS]

train_gpt has the profiler measure its last step alone (STEPS 1). Given STEP_MS, the step's wall time
in a run without the profiler, it also gives that time less its kernels' times as the profiler measures
them, one at a time: launches and host work between kernels are part of it, but on the H200 not most of
it (docs/gpu_runs.md: a CUDA graph removed 301 of 304 launches and under 0.5% of a 7.5% difference).
scripts/bench_gpu.sh runs it on a d12 and a d48 run. Reads the CSV that ncu writes (a header row, a row of
units, then one row per kernel launch; any lines ncu prints before the header are skipped)."""
import csv
import sys
from collections import defaultdict

UNIT_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def group(name):
    lower = name.lower()
    if "attention" in lower or "flash" in lower:
        return "attention"
    if any(k in lower for k in ("nvjet", "gemm", "cutlass", "xmma", "cublas")):
        return "matmul (cuBLASLt)"
    return "other"


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: kernel_table.py PROFILE.csv STEPS [STEP_MS]")
    path, steps = sys.argv[1], int(sys.argv[2])
    step_ms = float(sys.argv[3]) if len(sys.argv) == 4 else None
    with open(path, newline="") as f:
        lines = f.readlines()
    start = next((i for i, line in enumerate(lines) if "Kernel Name" in line), None)
    if start is None:
        sys.exit(f"{path}: no 'Kernel Name' header: not ncu --csv --page raw output")
    rows = list(csv.reader(lines[start:]))
    header, units = rows[0], rows[1]
    name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    scale = UNIT_MS.get(units[time_col].strip(), None)
    if scale is None:
        sys.exit(f"{path}: unknown time unit '{units[time_col]}'")
    per_name, calls = defaultdict(float), defaultdict(int)
    for row in rows[2:]:
        if len(row) <= max(name_col, time_col):
            continue
        try:
            ms = float(row[time_col].replace(",", "")) * scale
        except ValueError:
            continue
        per_name[row[name_col]] += ms
        calls[row[name_col]] += 1
    total = sum(per_name.values())
    if total == 0:
        sys.exit(f"{path}: no kernel times")
    print(f"kernel table: {sum(calls.values()) / steps:.0f} kernels per step, {total / steps:.2f} ms of kernel time per step "
          f"(ncu gpu__time_duration.sum over {steps} step{'' if steps == 1 else 's'})")
    if step_ms is not None:
        gap = step_ms - total / steps
        print(f"kernel table: a step takes {step_ms:.2f} ms, {gap:.2f} ms ({100 * gap / step_ms:.1f}%) more than its kernels "
              f"as profiled one at a time")
    groups = defaultdict(float)
    for name, ms in per_name.items():
        groups[group(name)] += ms
    for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {g:<40} {ms / steps:9.2f} ms/step {100 * ms / total:5.1f}%")
    for name, ms in sorted(per_name.items(), key=lambda kv: -kv[1]):
        print(f"  {name[:60]:<60} {calls[name] / steps:6.1f}/step {ms / steps:9.3f} ms/step {100 * ms / total:5.1f}%")


if __name__ == "__main__":
    main()
