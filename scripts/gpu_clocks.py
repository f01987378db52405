"""The GPU's SM clock, power and clock event (throttle) reasons while a run ran, from nvidia-smi's
samples: min, median and max SM clock under load, how far the median sits below the GPU's max SM
clock (a sag that is the machine's, not the program's), power, and each reason seen under load.

    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,utilization.gpu,clocks_event_reasons.active \\
        --format=csv -lms 100 > samples.csv &   # while the run runs
    python3 scripts/gpu_clocks.py samples.csv [TITLE]

Reads nvidia-smi's CSV with its header (columns by name, any order; clocks.sm alone is required).
Under load: the samples with utilization.gpu at LOAD_PERCENT or more (all of them without that column).
scripts/bench_gpu.sh samples each of its d12 and d48 runs so.
"""
import re
import statistics
import sys

LOAD_PERCENT = 50  # a sample's GPU utilization from which it counts as under load (idle start-up is 0)
COLUMNS = {  # what each column may be called in nvidia-smi's header, its unit dropped
    "sm": ("clocks.current.sm", "clocks.sm"),
    "max_sm": ("clocks.max.sm", "clocks.max.sm_clock"),
    "power": ("power.draw", "power.draw.instant", "power.draw.average"),
    "utilization": ("utilization.gpu",),
    "reasons": ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
}
# NVML's clock event reason bits (nvml.h, nvmlClocksEventReason*)
REASONS = [(0x1, "GPU idle"), (0x2, "applications clocks setting"), (0x4, "SW power cap"), (0x8, "HW slowdown"),
           (0x10, "sync boost"), (0x20, "SW thermal slowdown"), (0x40, "HW thermal slowdown"),
           (0x80, "HW power brake slowdown"), (0x100, "display clock setting")]


def number(text):
    """'1980 MHz' -> 1980.0, '0x0000000000000004' -> 4, '[N/A]' -> None."""
    text = text.strip()
    if text.startswith("0x"):
        return int(text, 16)
    m = re.match(r"[0-9.]+", text)
    return float(m.group()) if m else None


def read_samples(path):
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError as e:
        sys.exit(f"gpu_clocks: {path}: {e.strerror}")
    column_names = lambda line: [re.sub(r"\s*\[.*\]$", "", name.strip()) for name in line.split(",")]  # noqa: E731
    known = {alias for aliases in COLUMNS.values() for alias in aliases}
    header = next((line for line in lines if known & set(column_names(line))), None)
    if header is None:
        sys.exit(f"gpu_clocks: {path}: no nvidia-smi CSV header (--format=csv) with clocks.sm: "
                 f"{lines[0][:100] if lines else 'the file is empty'}")
    names = column_names(header)
    where = {key: next((names.index(a) for a in aliases if a in names), None) for key, aliases in COLUMNS.items()}
    if where["sm"] is None:
        sys.exit(f"gpu_clocks: {path}: no clocks.sm column in '{header}'")
    samples, malformed = [], 0
    for line in lines:
        fields = line.split(",")
        if line == header:
            continue  # nvidia-smi may repeat it
        if len(fields) != len(names):
            malformed += 1  # the last line, cut when the sampler was stopped
            continue
        samples.append({key: None if col is None else number(fields[col]) for key, col in where.items()})
    return [s for s in samples if s["sm"] is not None], malformed


def spread(values, unit, digits):
    return f"min {values[0]:.{digits}f}, median {statistics.median(values):.{digits}f}, max {values[-1]:.{digits}f} {unit}"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: gpu_clocks.py SAMPLES.csv [TITLE]")
    samples, malformed = read_samples(sys.argv[1])
    title = f"clocks{' ' + sys.argv[2] if len(sys.argv) == 3 else ''}"
    has_utilization = any(s["utilization"] is not None for s in samples)
    load = [s for s in samples if not has_utilization or (s["utilization"] or 0) >= LOAD_PERCENT]
    said = f"{len(samples)} samples" + (f" ({malformed} malformed lines skipped)" if malformed else "")
    if not load:
        print(f"{title}: {said}, none under load (GPU utilization >= {LOAD_PERCENT}%)")
        return
    sm = sorted(s["sm"] for s in load)
    line = f"{title}: {said}, {len(load)} under load" + (f" (GPU utilization >= {LOAD_PERCENT}%)" if has_utilization else "")
    line += f": SM clock {spread(sm, 'MHz', 0)}"
    max_sm = max((s["max_sm"] for s in samples if s["max_sm"] is not None), default=None)
    if max_sm:
        line += f"; the median {100 * (max_sm - statistics.median(sm)) / max_sm:.1f}% below the GPU's max SM clock {max_sm:.0f} MHz"
    power = sorted(s["power"] for s in load if s["power"] is not None)
    if power:
        line += f"; power {spread(power, 'W', 1)}"
    masks = [s["reasons"] for s in load if s["reasons"] is not None]
    if masks:
        seen = [f"{name} in {n}" for bit, name in REASONS if (n := sum(1 for m in masks if m & bit))]
        unknown = sum(1 for m in masks if m & ~sum(bit for bit, _ in REASONS))
        seen += [f"unknown bits in {unknown}"] if unknown else []
        line += f"; clock event reasons under load: none in {sum(1 for m in masks if m == 0)} samples" + "".join(f", {s}" for s in seen)
    print(line)


if __name__ == "__main__":
    main()
