"""Where a training step's time goes on the GPU, from the trace that scripts/kernel_trace.so writes
during a real run (CUPTI's activity API, kernels back to back as they ran; not Nsight Compute's
replay, one kernel at a time): the step's busy time (a kernel, copy or memset running on any stream),
its idle time, and where the idle time is: the largest gaps with the activity on each side and the
host's CUDA runtime call under way, the gaps by length, and the idle time summed by the pair of
kernels around it.

    CUDA_INJECTION64_PATH=$PWD/scripts/kernel_trace.so KERNEL_TRACE_FILE=/tmp/trace.tsv \\
        ./train_gpt --device cuda -e d12 -b 64 -t 1024 -x 4 -v 0 -s 0 -o "" -i TOKENS
    python3 scripts/step_trace.py /tmp/trace.tsv [--top N]

train_gpt brackets its last step with cudaProfilerStart/Stop, which the trace keeps as a window; a
trace without a window is read whole, from its first activity to its last. scripts/bench_gpu.sh
traces a d12 step so. The trace's format is in scripts/kernel_trace.cpp.
"""
import argparse
import re
import sys
from collections import defaultdict, namedtuple

Activity = namedtuple("Activity", "kind start end where name")
Gap = namedtuple("Gap", "start end before after")
DEVICE_KINDS = ("kernel", "memcpy", "memset")
# gap lengths in us: a launch's latency behind its predecessor (a few us), then host work of growing size
GAP_BUCKETS_US = (2, 10, 100, 1000)


def base_name(activity):
    """A kernel's name without return type, template arguments and parameters ('void attn<64>(float*)':
    'attn'); a copy's or memset's without its size ('memcpy HtoD 4096 B': 'memcpy HtoD')."""
    if activity is None:
        return "(window edge)"
    if activity.kind != "kernel":
        return re.sub(r" [0-9]+ B$", "", activity.name)
    depth, kept = 0, []
    for ch in activity.name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1].lstrip(":") if words else activity.name  # '(anonymous namespace)::f' leaves '::f'


def read_trace(path):
    """The trace's windows [(number, start, end)], device activities, host calls and dropped count."""
    windows, device, host, dropped = [], [], [], 0
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit(f"step_trace: {path}: {e.strerror}")
    for number, line in enumerate(lines, 1):
        if not line or line.startswith("#"):
            continue
        fields = line.split("\t", 4)
        try:
            if fields[0] == "window" and len(fields) == 4:
                windows.append((int(fields[1]), int(fields[2]), int(fields[3])))
            elif fields[0] == "dropped" and len(fields) == 2:
                dropped += int(fields[1])
            elif fields[0] in DEVICE_KINDS + ("api",) and len(fields) == 5:
                a = Activity(fields[0], int(fields[1]), int(fields[2]), fields[3], fields[4])
                (host if a.kind == "api" else device).append(a)
            else:
                raise ValueError
        except ValueError:
            sys.exit(f"step_trace: {path} line {number}: '{line[:80]}' is not a record (expected window N START END, dropped N, "
                     "or kernel|memcpy|memset|api START END STREAM NAME, tab-separated)")
    return windows, device, host, dropped


def gaps_in(device, start, end):
    """The idle stretches of [start, end): no device activity on any stream. Each with the activity
    that ended last before it and the one that starts it (None at the window's edges)."""
    inside = sorted((a for a in device if a.end > start and a.start < end), key=lambda a: (a.start, a.end))
    gaps, busy_until, last = [], start, None
    for a in inside:
        if a.start > busy_until:
            gaps.append(Gap(busy_until, a.start, last, a))
        if a.end >= busy_until:
            busy_until, last = a.end, a
    if busy_until < end:
        gaps.append(Gap(busy_until, end, last, None))
    return inside, gaps


def host_call_during(host, gap):
    """The host's CUDA call that overlaps the gap most, and the share of the gap it covers."""
    best, covered = None, 0
    for call in host:
        overlap = min(call.end, gap.end) - max(call.start, gap.start)
        if overlap > covered:
            best, covered = call, overlap
    if best is None:
        return "host: no CUDA call (host code)"
    return f"host: {re.sub(r'_v[0-9]+$', '', best.name)} ({100 * covered / (gap.end - gap.start):.0f}% of it)"


def report(title, device, host, start, end, top):
    ms = lambda ns: f"{ns / 1e6:.3f} ms"  # noqa: E731
    us = lambda ns: f"{ns / 1e3:.1f} us"  # noqa: E731
    inside, gaps = gaps_in(device, start, end)
    span = end - start
    idle = sum(g.end - g.start for g in gaps)
    kernels = [a for a in inside if a.kind == "kernel"]
    kernel_ns = sum(min(a.end, end) - max(a.start, start) for a in kernels)
    print(f"{title}: {ms(span)}, busy {ms(span - idle)} ({100 * (span - idle) / span:.1f}%), idle {ms(idle)} "
          f"({100 * idle / span:.1f}%); {len(kernels)} kernels ({ms(kernel_ns)} summed), "
          f"{sum(a.kind == 'memcpy' for a in inside)} copies, {sum(a.kind == 'memset' for a in inside)} memsets")
    edge_before = sum(g.end - g.start for g in gaps if g.before is None)
    edge_after = sum(g.end - g.start for g in gaps if g.after is None and g.before is not None)
    between = [g for g in gaps if g.before is not None and g.after is not None]
    print(f"  idle before the first activity {ms(edge_before)}, after the last {ms(edge_after)}, "
          f"between activities {ms(sum(g.end - g.start for g in between))} in {len(between)} gaps")
    buckets = []
    for i, upper in enumerate(GAP_BUCKETS_US + (None,)):
        lower = GAP_BUCKETS_US[i - 1] if i > 0 else 0
        members = [g for g in gaps if g.end - g.start >= lower * 1000 and (upper is None or g.end - g.start < upper * 1000)]
        label = f"under {upper} us" if i == 0 else f"{lower} us and over" if upper is None else f"{lower}-{upper} us"
        buckets.append(f"{label}: {len(members)} ({ms(sum(g.end - g.start for g in members))})")
    print("  gaps by length: " + ", ".join(buckets))
    print(f"  largest gaps (of {len(gaps)}):")
    for g in sorted(gaps, key=lambda g: g.start - g.end)[:top]:
        print(f"    {us(g.end - g.start):>10}  {base_name(g.before)} -> {base_name(g.after)}  {host_call_during(host, g)}")
    pairs = defaultdict(list)
    for g in gaps:
        pairs[(base_name(g.before), base_name(g.after))].append(g.end - g.start)
    print("  idle by the pair of activities around it (total, gaps, mean):")
    for (before, after), lengths in sorted(pairs.items(), key=lambda p: -sum(p[1]))[:top]:
        print(f"    {ms(sum(lengths)):>12}  {len(lengths):4d} gaps  {us(sum(lengths) / len(lengths)):>10} mean  {before} -> {after}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="the file scripts/kernel_trace.so wrote (KERNEL_TRACE_FILE)")
    parser.add_argument("--top", type=int, default=10, help="largest gaps and kernel pairs listed (10)")
    args = parser.parse_args()
    windows, device, host, dropped = read_trace(args.trace)
    if dropped:
        print(f"step trace: CUPTI dropped {dropped} records: the busy time is understated")
    if not windows:
        if not device:
            sys.exit(f"step_trace: {args.trace}: no kernel, copy or memset recorded")
        report("step trace, whole trace (no cudaProfilerStart/Stop window)", device, host,
               min(a.start for a in device), max(a.end for a in device), args.top)
    for number, start, end in windows:
        if end <= start:
            sys.exit(f"step_trace: {args.trace}: window {number} ends at {end}, not after its start {start}")
        report(f"step trace, window {number} of {len(windows)}", device, host, start, end, args.top)


if __name__ == "__main__":
    main()
