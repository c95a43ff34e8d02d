#!/usr/bin/python3
"""Plots memory against each Pareto metric of a kvbudget run.

Reads RESULTS/points.csv and RESULTS/pareto.csv (written by `kvbudget run`) and writes
RESULTS/plots/<metric>.png and .svg: every measured point, coloured by a series column
and shaped by a marker column, with the Pareto frontier drawn as a staircase. Each axis
says whether lower or higher is better: metrics named in --higher-is-better (kvbudget
passes its metric table's) are higher-is-better, every other metric lower-is-better.
The x axis is the memory column --x (output.x: bpe, bpe_target, bytes, bytes_target).
Points whose memory on it is taken at a longer context than their error was measured
on (points.csv `extrapolated`, docs/methods.md §1) are drawn hollow, and a caption
under the plot says so. Grey bars show each point's 95 % interval where points.csv has
one (docs/methods.md §4 "Uncertainty"): an attention metric's bootstrap `_lo`/`_hi`, or
a model metric's value ± 1.96 `_se`.

Runs under Debian's /usr/bin/python3 with python3-matplotlib.
"""
import argparse
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def as_float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def to_compression(b):
    """16 / b, its own inverse; used for the top axis."""
    import numpy as np  # matplotlib depends on numpy, so it is always there

    b = np.asarray(b, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(b != 0, 16.0 / np.where(b != 0, b, 1.0), np.inf)


MEMORY_COLUMNS = ("bpe", "bpe_target", "bytes", "bytes_target")


def extrapolated_on(point, x):
    """Whether the point's memory on column x is at a longer context than its error.

    points.csv's `extrapolated` is "no", or names what is extrapolated joined by '+':
    "budget_context" (the allocation, every memory column), "target_context"
    (bpe_target and bytes_target only)."""
    what = point.get("extrapolated", "no").split("+")
    return "budget_context" in what or (x.endswith("_target") and "target_context" in what)


def interval(point, metric):
    """The metric's 95 % interval (low, high) from points.csv: the bootstrap's `_lo` and
    `_hi`, or value ± 1.96 standard errors `_se`; None when the metric has neither."""
    lo, hi = point.get(metric + "_lo"), point.get(metric + "_hi")
    if lo and hi:
        return as_float(lo), as_float(hi)
    se = point.get(metric + "_se")
    if se:
        value, error = as_float(point[metric]), as_float(se)
        return value - 1.96 * error, value + 1.96 * error
    return None


def x_label(x, target_context):
    at = f" at {target_context} tokens (output.target_context)" if x.endswith("_target") else \
        " at the recorded context"
    if x.startswith("bpe"):
        return "bits per element" + at + ", all metadata counted"
    return "cache bytes" + at


def plot_metric(points, front, metric, higher_is_better, series, marker, title, out_dir, x, target_context):
    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)
    groups = sorted({p.get(series, "") for p in points})
    shapes = sorted({p.get(marker, "") for p in points}) if marker else [""]
    cmap = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    values = [as_float(p[metric]) for p in points]
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    log_y = (not higher_is_better and len(positive) == len([v for v in values if math.isfinite(v)])
             and positive and max(positive) / min(positive) > 20)
    for gi, g in enumerate(groups):
        for si, s in enumerate(shapes):
            sel = [p for p in points if p.get(series, "") == g and (not marker or p.get(marker, "") == s)]
            if not sel:
                continue
            label = f"{series}={g}" if g else "points"
            if marker:
                label += f", {marker}={s}"
            colour = cmap(gi % cmap.N)
            # Measured pairs filled, extrapolated ones hollow (one legend entry per group).
            for hollow in (False, True):
                part = [p for p in sel if extrapolated_on(p, x) == hollow]
                if not part:
                    continue
                ax.scatter([as_float(p[x]) for p in part], [as_float(p[metric]) for p in part],
                           facecolors="none" if hollow else colour, edgecolors=colour,
                           marker=MARKERS[si % len(MARKERS)], s=28, alpha=0.8, linewidths=1.0,
                           label=None if hollow and any(not extrapolated_on(p, x) for p in sel) else label,
                           zorder=3)
    # 95 % intervals as grey bars behind the points (a maximum's bootstrap interval can
    # end at the point itself: bar lengths are clipped at 0).
    bars = []
    for p in points:
        iv = interval(p, metric)
        bx, by = as_float(p[x]), as_float(p[metric])
        if iv and all(math.isfinite(v) for v in (bx, by, *iv)):
            bars.append((bx, by, max(by - iv[0], 0.0), max(iv[1] - by, 0.0)))
    if bars:
        ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                    yerr=[[b[2] for b in bars], [b[3] for b in bars]], fmt="none", ecolor="grey",
                    elinewidth=0.8, alpha=0.6, zorder=1, label="95 % interval (docs/methods.md §4)")
    fx = [as_float(r.get(x, "nan")) for r in front]
    fy = [as_float(r["value"]) for r in front]
    if fx:
        ax.step(fx, fy, where="post", color="black", linewidth=1.2, label="Pareto frontier", zorder=2)
        ax.scatter(fx, fy, facecolors="none", edgecolors="black", s=90, linewidths=1.2, zorder=4)
    extrapolated = [p for p in points if extrapolated_on(p, x)]
    if extrapolated:
        ax.scatter([], [], facecolors="none", edgecolors="grey", marker="o", s=28,
                   label="hollow: extrapolated (memory at a longer context than its error)")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(x_label(x, target_context))
    better = "higher" if higher_is_better else "lower"
    ax.set_ylabel(f"{metric} ({better} is better)")
    ax.set_title(f"{title}: {metric} vs memory")
    ax.grid(True, which="both", alpha=0.3)
    if x.startswith("bpe"):
        top = ax.secondary_xaxis("top", functions=(to_compression, to_compression))
        top.set_xlabel("compression vs fp16 (16 / " + x + ")")
    ax.legend(fontsize=7, loc="best", ncol=2 if len(groups) * len(shapes) > 8 else 1)
    if extrapolated:
        fig.text(0.01, 0.005, caption(extrapolated, len(points), x, target_context), fontsize=7, ha="left",
                 va="bottom", wrap=True)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
    else:
        fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out_dir, f"{metric}.{ext}"))
    plt.close(fig)


def caption(extrapolated, total, x, target_context):
    """The figure's note on its extrapolated points (docs/methods.md §1)."""
    labels = [p.get("extrapolated", "no").split("+") for p in extrapolated]
    at_target = sum(x.endswith("_target") and "target_context" in what for what in labels)
    sized = sum("budget_context" in what for what in labels)
    why = []
    if at_target:
        why.append(f"{at_target} with {x} at {target_context} tokens, where their windows, sink tokens or phases "
                   "take another share of the cache than in the recording their error was measured on")
    if sized:
        why.append(f"{sized} allocated for a budget_context longer than the recording")
    return (f"Hollow: {len(extrapolated)} of {total} points extrapolated: " + "; ".join(why) +
            ". Measure memory and error on one cache: configs/README.md, configs/long_context.toml.")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True, help="a results/<name>/<timestamp> directory")
    ap.add_argument("--metrics", required=True, help="comma-separated Pareto metrics to plot")
    ap.add_argument("--series", default="strategy", help="points.csv column that colours points")
    ap.add_argument("--marker", default="", help="points.csv column that shapes points")
    ap.add_argument("--title", default="kvbudget")
    ap.add_argument("--x", default="bpe", choices=MEMORY_COLUMNS, help="memory column of the x axis (output.x)")
    ap.add_argument("--target-context", default="32768", help="output.target_context, for the axis label")
    ap.add_argument("--higher-is-better", default="",
                    help="comma-separated metrics where higher is better (kvbudget passes its metric table's)")
    args = ap.parse_args()

    points = read_csv(os.path.join(args.results, "points.csv"))
    pareto = read_csv(os.path.join(args.results, "pareto.csv"))
    if not points:
        print("no measured points to plot", file=sys.stderr)
        return 1
    for col in (args.series, args.marker):
        if col and col not in points[0]:
            print(f"column '{col}' not in points.csv (columns: {', '.join(points[0].keys())})", file=sys.stderr)
            return 2
    drawn_on = {r.get("memory", "bpe") for r in pareto}  # the frontiers' memory column (bpe before output.x)
    if drawn_on - {args.x}:
        print(f"pareto.csv's frontiers are on {', '.join(sorted(drawn_on))}, not --x {args.x} (output.x of the run)",
              file=sys.stderr)
        return 2
    higher = set(m for m in args.higher_is_better.split(",") if m)
    out_dir = os.path.join(args.results, "plots")
    os.makedirs(out_dir, exist_ok=True)
    for metric in [m for m in args.metrics.split(",") if m]:
        if metric not in points[0]:
            print(f"metric '{metric}' not in points.csv", file=sys.stderr)
            return 2
        front = sorted((r for r in pareto if r["metric"] == metric), key=lambda r: as_float(r.get(args.x, "nan")))
        plot_metric(points, front, metric, metric in higher, args.series, args.marker, args.title, out_dir, args.x,
                    args.target_context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
