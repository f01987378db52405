#!/usr/bin/env python3
"""Plot one or more train_gpt main.log files: loss and HellaSwag against step.

  /usr/bin/python3 scripts/plot_log.py out/main.log [other/main.log ...] \\
      [--size 124M|350M|774M|1558M] [--tokens-per-step N] [-o plot.png]

Reads llm.c's log lines: "s:<step> trl:<train loss> ...", "s:<step> tel:<val loss>"
and "s:<step> eval:<HellaSwag acc_norm>"; a last line without its newline (a run
still writing, or killed mid-line) is left out. Left panel: train and val loss;
right panel: HellaSwag. --size draws OpenAI GPT-2's figures for that size as
dashed lines (val loss on FineWeb and HellaSwag, as llm.c's README quotes them);
--tokens-per-step adds a token axis on top. Each log gets its own colour,
labelled by its directory.
"""
import argparse
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("plot_log: error: matplotlib is not installed (pip install matplotlib, or apt-get install python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# OpenAI's GPT-2 checkpoints, evaluated as llm.c does: (val loss on FineWeb, HellaSwag acc_norm)
OPENAI_GPT2 = {
    "124M": (3.424958, 0.294463),
    "350M": (3.083089, 0.375224),
    "774M": (3.000580, 0.431986),
    "1558M": (2.831273, 0.488946),
}
KEYS = {"trl": "train", "tel": "val", "eval": "hellaswag"}


class LogError(Exception):
    """A log that cannot be plotted; reported as one line."""


def read_log(path):
    """{"train"|"val"|"hellaswag": ([steps], [values])} from one main.log."""
    series = {name: ([], []) for name in KEYS.values()}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise LogError(f"{path}: cannot open ({e.strerror})")
    if lines and not lines[-1].endswith("\n"):
        lines.pop()  # cut short: the run is still writing it, or was killed mid-line
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
        try:
            step = int(fields["s"])
            for key, name in KEYS.items():
                if key in fields:
                    series[name][0].append(step)
                    series[name][1].append(float(fields[key]))
        except (KeyError, ValueError):
            raise LogError(f"{path}:{lineno}: expected 's:<step> trl:|tel:|eval:<value>', got {line.strip()!r}")
    if not any(steps for steps, _ in series.values()):
        raise LogError(f"{path}: no s:<step> lines (expected a main.log written by train_gpt)")
    return series


def plot(logs, size, tokens_per_step, out):
    fig, (ax_loss, ax_hs) = plt.subplots(1, 2, figsize=(10, 4), dpi=80, sharex=True)
    for i, (path, series) in enumerate(logs):
        colour = f"C{i}"
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        for name, style in (("train", dict(alpha=0.5, lw=1)), ("val", dict(lw=2, marker="o", ms=3))):
            steps, values = series[name]
            if steps:
                ax_loss.plot(steps, values, color=colour, label=f"{label} {name}", **style)
        steps, values = series["hellaswag"]
        if steps:
            ax_hs.plot(steps, values, color=colour, marker="o", ms=3, label=label)
    if size:
        val_loss, hellaswag = OPENAI_GPT2[size]
        ax_loss.axhline(val_loss, color="k", ls="--", lw=1, label=f"OpenAI GPT-2 {size} val")
        ax_hs.axhline(hellaswag, color="k", ls="--", lw=1, label=f"OpenAI GPT-2 {size}")
    if not any(series["hellaswag"][0] for _, series in logs):
        ax_hs.text(0.5, 0.5, "no HellaSwag in the log (-h 1)", ha="center", va="center", transform=ax_hs.transAxes)
    for ax, title in ((ax_loss, "loss"), (ax_hs, "HellaSwag acc_norm")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        if tokens_per_step:
            top = ax.secondary_xaxis("top", functions=(lambda s: s * tokens_per_step, lambda t: t / tokens_per_step))
            top.set_xlabel("tokens")
    fig.tight_layout()
    tmp = out + ".tmp"
    fig.savefig(tmp, format="png")
    os.replace(tmp, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", help="main.log files")
    ap.add_argument("--size", choices=sorted(OPENAI_GPT2, key=lambda s: int(s[:-1])),
                    help="draw OpenAI GPT-2's figures for this size")
    ap.add_argument("--tokens-per-step", type=int, default=0, help="tokens per step (train_gpt's -d), for a token axis")
    ap.add_argument("-o", "--out", default="plot.png", help="PNG to write (default: %(default)s)")
    a = ap.parse_args(argv)
    if a.tokens_per_step < 0:
        ap.error("--tokens-per-step must be positive")
    try:
        logs = [(path, read_log(path)) for path in a.logs]
    except LogError as e:
        print(f"plot_log: error: {e}", file=sys.stderr)
        return 1
    plot(logs, a.size, a.tokens_per_step, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
