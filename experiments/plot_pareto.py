#!/usr/bin/python3
"""Plots memory (bits per element) against each Pareto metric of a kvbudget run.

Reads RESULTS/points.csv and RESULTS/pareto.csv (written by `kvbudget run`) and writes
RESULTS/plots/<metric>.png and .svg: every measured point, coloured by a series column
and shaped by a marker column, with the Pareto frontier drawn as a staircase. Each axis
says whether lower or higher is better: metrics named in --higher-is-better (kvbudget
passes its metric table's) are higher-is-better, every other metric lower-is-better.

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


def plot_metric(points, front, metric, higher_is_better, series, marker, title, out_dir):
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
            ax.scatter([as_float(p["bpe"]) for p in sel], [as_float(p[metric]) for p in sel],
                       color=cmap(gi % cmap.N), marker=MARKERS[si % len(MARKERS)], s=28, alpha=0.8, label=label,
                       zorder=3)
    fx = [as_float(r["bpe"]) for r in front]
    fy = [as_float(r["value"]) for r in front]
    if fx:
        ax.step(fx, fy, where="post", color="black", linewidth=1.2, label="Pareto frontier", zorder=2)
        ax.scatter(fx, fy, facecolors="none", edgecolors="black", s=90, linewidths=1.2, zorder=4)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("bits per element (all metadata counted)")
    better = "higher" if higher_is_better else "lower"
    ax.set_ylabel(f"{metric} ({better} is better)")
    ax.set_title(f"{title}: {metric} vs memory")
    ax.grid(True, which="both", alpha=0.3)
    top = ax.secondary_xaxis("top", functions=(to_compression, to_compression))
    top.set_xlabel("compression vs fp16 (16 / bpe)")
    ax.legend(fontsize=7, loc="best", ncol=2 if len(groups) * len(shapes) > 8 else 1)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out_dir, f"{metric}.{ext}"))
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True, help="a results/<name>/<timestamp> directory")
    ap.add_argument("--metrics", required=True, help="comma-separated Pareto metrics to plot")
    ap.add_argument("--series", default="strategy", help="points.csv column that colours points")
    ap.add_argument("--marker", default="", help="points.csv column that shapes points")
    ap.add_argument("--title", default="kvbudget")
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
    higher = set(m for m in args.higher_is_better.split(",") if m)
    out_dir = os.path.join(args.results, "plots")
    os.makedirs(out_dir, exist_ok=True)
    for metric in [m for m in args.metrics.split(",") if m]:
        if metric not in points[0]:
            print(f"metric '{metric}' not in points.csv", file=sys.stderr)
            return 2
        front = sorted((r for r in pareto if r["metric"] == metric), key=lambda r: as_float(r["bpe"]))
        plot_metric(points, front, metric, metric in higher, args.series, args.marker, args.title, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
