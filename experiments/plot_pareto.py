#!/usr/bin/env python3
"""Plots memory against each Pareto metric of a kvbudget run.

Reads RESULTS/points.csv, RESULTS/pareto.csv and RESULTS/errors.csv (written by
`kvbudget run`) and writes, for each metric, RESULTS/plots/<metric>.png, .svg and .pdf
(text editable in the SVG and PDF) and <metric>.caption.txt:
- every measured point, one series per value of --series (points.csv `strategy`, the
  strategies' names, by default), each series with its own colour, marker and line
  style; the line joins the series' own non-dominated points;
- the Pareto frontier over all points as a black staircase;
- points that overlap on the figure annotated with what tells them apart (their
  differing sweep coordinates, such as bits, or their labels);
- the y axis named by --metric-label (kvbudget passes its metric table's quantity,
  unit and direction: "attention KL, mean (nats, lower is better)"); without one, the
  metric's name and its direction (--higher-is-better lists the metrics where higher
  is better); a log axis has at least two labelled ticks;
- the x axis is the memory column --x (output.x: bpe, bpe_target, bytes, bytes_target, bpe_read).
  Points whose memory on it is taken at a longer context than their error was measured
  on (points.csv `extrapolated`, docs/methods.md §1) are drawn hollow, and a note
  under the plot says so;
- grey bars show each point's 95 % interval where points.csv has one (docs/methods.md
  §4 "Uncertainty"): an attention metric's bootstrap `_lo`/`_hi`, or a model metric's
  value ± 1.96 `_se`.
The caption file describes the figure and lists what it does not show: failed and
infeasible points (errors.csv, with the reason), points without a value, and points a
log axis cannot draw.

Needs matplotlib and numpy (Debian's /usr/bin/python3 with python3-matplotlib); run
with another python3, it says so.
"""
import argparse
import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_style  # noqa: E402  (exits with a clear message without matplotlib)
from plot_style import as_float, plt, point_label, read_csv  # noqa: E402

MEMORY_COLUMNS = ("bpe", "bpe_target", "bytes", "bytes_target", "bpe_read")
OVERLAP_PIXELS = 4.0  # points closer than this on the figure (at 100 dpi) count as overlapping


def to_compression(b):
    """16 / b, its own inverse; used for the top axis."""
    import numpy as np

    b = np.asarray(b, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(b != 0, 16.0 / np.where(b != 0, b, 1.0), np.inf)


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
        " of the caches the evaluated queries read (bpe_read)" if x == "bpe_read" else " at the recorded context"
    if x.startswith("bpe"):
        return "memory: bits per element" + at + ", all metadata counted (bits, lower is better)"
    return "memory: cache size" + at + " (bytes, lower is better)"


def non_dominated(points, x, metric, higher_is_better):
    """The points no other point beats on both memory (lower) and metric, by memory."""
    sign = -1.0 if higher_is_better else 1.0
    ordered = sorted(points, key=lambda p: (as_float(p[x]), sign * as_float(p[metric])))
    front, best = [], math.inf
    for p in ordered:
        v = sign * as_float(p[metric])
        if v < best:
            front.append(p)
            best = v
    return front


def overlapping_groups(ax, points, x, metric):
    """Groups (two or more) of points drawn within OVERLAP_PIXELS of each other."""
    import numpy as np

    if len(points) < 2:
        return []
    xy = ax.transData.transform(np.array([[as_float(p[x]), as_float(p[metric])] for p in points]))
    xy *= 100.0 / ax.figure.dpi
    parent = list(range(len(points)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    cells = {}  # points by grid cell of OVERLAP_PIXELS: neighbours are in adjacent cells
    for i, (u, v) in enumerate(xy):
        cells.setdefault((math.floor(u / OVERLAP_PIXELS), math.floor(v / OVERLAP_PIXELS)), []).append(i)
    for (cu, cv), members in cells.items():
        for du in (-1, 0, 1):
            for dv in (-1, 0, 1):
                for j in cells.get((cu + du, cv + dv), []):
                    for i in members:
                        if i < j and np.hypot(*(xy[i] - xy[j])) <= OVERLAP_PIXELS:
                            parent[root(i)] = root(j)
    groups = {}
    for i in range(len(points)):
        groups.setdefault(root(i), []).append(points[i])
    return [g for g in groups.values() if len(g) > 1]


def telling_apart(group, coordinates):
    """A short name per point of an overlapping group: the sweep coordinates whose
    values differ within the group (widths, groups, ...), with the strategy's name when
    the group spans several strategies; the labels when no coordinate differs."""
    differing = [c for c in coordinates if len({p.get(c, "") for p in group}) > 1]
    several = len({p.get("strategy", "") for p in group}) > 1
    names = []
    for p in group:
        parts = [f"{c}={p[c]}" for c in differing if p.get(c, "")]
        if not parts:
            names.append(point_label(p))
        else:
            names.append((p.get("strategy", "") + ": " if several else "") + ", ".join(parts))
    return names


def plot_metric(points, front, errors, metric, label, higher_is_better, series, marker, title, out_dir, x,
                target_context, coordinates):
    fig, ax = plt.subplots(figsize=(8.0, 5.0), dpi=120)
    finite = [math.isfinite(as_float(p[x])) and math.isfinite(as_float(p[metric])) for p in points]
    drawable = [p for p, ok in zip(points, finite) if ok]
    no_value = [p for p, ok in zip(points, finite) if not ok]
    values = [as_float(p[metric]) for p in drawable]
    positive = [v for v in values if v > 0]
    log_y = bool(not higher_is_better and positive and max(positive) / min(positive) > 20)
    off_log = [p for p in drawable if as_float(p[metric]) <= 0] if log_y else []
    if off_log:
        drawable = [p for p in drawable if as_float(p[metric]) > 0]
    groups = list(dict.fromkeys(p.get(series, "") for p in points))  # in points.csv order
    shapes = list(dict.fromkeys(p.get(marker, "") for p in points)) if marker else []
    for gi, g in enumerate(groups):
        colour, shape, line = plot_style.series_style(gi, len(groups))
        sel = [p for p in drawable if p.get(series, "") == g]
        if not sel:
            continue
        name = g if series == "strategy" and g else f"{series}={g or '(none)'}"
        # The series' own non-dominated points, joined: its curve.
        own = non_dominated(sel, x, metric, higher_is_better)
        ax.plot([as_float(p[x]) for p in own], [as_float(p[metric]) for p in own], color=colour, linestyle=line,
                linewidth=1.3, marker=shape if not marker else None, markersize=5, markerfacecolor=colour,
                label=name, zorder=2)
        # Every point: measured ones filled, extrapolated ones hollow.
        for hollow in (False, True):
            part = [p for p in sel if extrapolated_on(p, x) == hollow]
            for si, s in enumerate(shapes or [""]):
                sub = [p for p in part if not marker or p.get(marker, "") == s]
                if not sub:
                    continue
                m = plot_style.MARKERS[si % len(plot_style.MARKERS)] if marker else shape
                ax.scatter([as_float(p[x]) for p in sub], [as_float(p[metric]) for p in sub],
                           facecolors="none" if hollow else colour, edgecolors=colour, marker=m, s=30,
                           linewidths=1.0, zorder=3)
    for si, s in enumerate(shapes):  # the marker column's legend: grey shapes
        ax.scatter([], [], marker=plot_style.MARKERS[si % len(plot_style.MARKERS)], facecolors="grey",
                   edgecolors="grey", s=30, label=f"{marker}={s or '(none)'}")
    # 95 % intervals as grey bars behind the points (a maximum's bootstrap interval can
    # end at the point itself: bar lengths are clipped at 0).
    bars = []
    for p in drawable:
        iv = interval(p, metric)
        bx, by = as_float(p[x]), as_float(p[metric])
        if iv and all(math.isfinite(v) for v in (bx, by, *iv)):
            lo = max(iv[0], by / 1e3) if log_y else iv[0]  # a log axis cannot draw down to 0
            bars.append((bx, by, max(by - lo, 0.0), max(iv[1] - by, 0.0)))
    if bars:
        ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                    yerr=[[b[2] for b in bars], [b[3] for b in bars]], fmt="none", ecolor="grey",
                    elinewidth=0.8, alpha=0.6, zorder=1, label="95 % interval (docs/methods.md §4)")
    front = [r for r in front if math.isfinite(as_float(r.get(x))) and as_float(r["value"]) > (0 if log_y else -math.inf)]
    if front:
        fx = [as_float(r[x]) for r in front]
        fy = [as_float(r["value"]) for r in front]
        ax.step(fx, fy, where="post", color="black", linewidth=2.0, alpha=0.55, label="Pareto frontier, all strategies",
                zorder=1.5)
        ax.scatter(fx, fy, facecolors="none", edgecolors="black", s=95, linewidths=1.1, zorder=4)
    extrapolated = [p for p in drawable if extrapolated_on(p, x)]
    if extrapolated:
        ax.scatter([], [], facecolors="none", edgecolors="grey", marker="o", s=30,
                   label="hollow: extrapolated (memory at a longer context than its error)")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(x_label(x, target_context))
    ax.set_ylabel(label)
    ax.set_title(f"{title}: {metric} vs memory")
    ax.grid(True, which="both", alpha=0.3)
    if x.startswith("bpe"):
        top = ax.secondary_xaxis("top", functions=(to_compression, to_compression))
        top.set_xlabel("compression vs fp16 (16 / " + x + ")")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7)
    note = caption(extrapolated, len(drawable), x, target_context) if extrapolated else ""
    if note:
        fig.text(0.01, 0.005, note, fontsize=7, ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.07 if note else 0, 1, 1))
    if log_y:
        low, high = ax.get_ylim()
        plot_style.log_ticks(ax.yaxis, low, high)
    # Overlapping points, found on the final layout, named beside them.
    overlaps = overlapping_groups(ax, drawable, x, metric)
    for group in overlaps:
        names = telling_apart(group, coordinates)
        px, py = as_float(group[0][x]), as_float(group[0][metric])
        ax.annotate("\n".join(names), (px, py), xytext=(8, 6), textcoords="offset points", fontsize=6,
                    va="bottom", ha="left", arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.6},
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "grey", "alpha": 0.85},
                    zorder=5)
    plot_style.save(fig, out_dir, metric, bbox_inches="tight")
    text = figure_caption(title, metric, label, x, target_context, points, drawable, front, groups, series,
                          extrapolated, note, overlaps, coordinates, errors, no_value, off_log)
    with open(os.path.join(out_dir, f"{metric}.caption.txt"), "w") as f:
        f.write(text)


def figure_caption(title, metric, label, x, target_context, points, drawable, front, groups, series, extrapolated,
                   note, overlaps, coordinates, errors, no_value, off_log):
    """The caption file's text: what the figure shows, and every point it does not."""
    lines = [f"{title}: {metric}, {label}, against {x_label(x, target_context)}.",
             f"{len(drawable)} of {len(points) + len(errors)} points drawn, "
             f"{len(groups)} {'strategies' if series == 'strategy' else 'series (' + series + ')'}: "
             + "; ".join(g or "(none)" for g in groups) + ".",
             "Each series: its own colour, marker and line style; its line joins its non-dominated points. "
             "Black staircase with circled points: the Pareto frontier over all strategies "
             f"({len(front)} points: " + "; ".join(point_label(r) for r in front) + ")."]
    if any(interval(p, metric) for p in drawable):
        lines.append("Grey bars: 95 % intervals (docs/methods.md §4).")
    if note:
        lines.append(note)
    for group in overlaps:
        lines.append("Overlapping, annotated: " + "; ".join(
            f"{point_label(p)} ({x} {p[x]}, {metric} {p[metric]})" for p in group) + ".")
    if errors or no_value or off_log:
        lines.append("Not drawn:")
        for e in errors:
            why = e.get("error", "")
            kind = "infeasible" if "below the cheapest" in why or "infeasible" in why else "failed"
            lines.append(f"  - {kind}: point {e.get('id', '?')} {e.get('label') or e.get('key', '')}: {why}")
        for p in no_value:
            lines.append(f"  - no value: point {p['id']} {point_label(p)} ({metric} = {p[metric] or 'empty'}, "
                         f"{x} = {p[x] or 'empty'})")
        for p in off_log:
            lines.append(f"  - not positive on the log axis: point {p['id']} {point_label(p)} ({metric} = {p[metric]})")
    else:
        lines.append("Every point of the run is drawn.")
    return "\n".join(lines) + "\n"


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="a results/<name>/<timestamp> directory")
    ap.add_argument("--metrics", required=True, help="comma-separated Pareto metrics to plot")
    ap.add_argument("--series", default="strategy", help="points.csv column whose values are the series")
    ap.add_argument("--marker", default="", help="points.csv column that shapes points")
    ap.add_argument("--title", default="kvbudget")
    ap.add_argument("--x", default="bpe", choices=MEMORY_COLUMNS, help="memory column of the x axis (output.x)")
    ap.add_argument("--target-context", default="32768", help="output.target_context, for the axis label")
    ap.add_argument("--higher-is-better", default="",
                    help="comma-separated metrics where higher is better (kvbudget passes its metric table's)")
    ap.add_argument("--metric-label", action="append", default=[], metavar="METRIC=LABEL",
                    help="the y axis label of a metric (kvbudget passes its metric table's); repeatable")
    args = ap.parse_args()
    plot_style.configure()

    points = read_csv(os.path.join(args.results, "points.csv"))
    pareto = read_csv(os.path.join(args.results, "pareto.csv"))
    errors = read_csv(os.path.join(args.results, "errors.csv"))
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
    labels = {}
    for item in args.metric_label:
        name, sep, text = item.partition("=")
        if not sep or not name or not text:
            print(f"--metric-label '{item}': expected METRIC=LABEL", file=sys.stderr)
            return 2
        labels[name] = text
    higher = set(m for m in args.higher_is_better.split(",") if m)
    coordinates = plot_style.coordinate_columns(points[0].keys())
    out_dir = os.path.join(args.results, "plots")
    os.makedirs(out_dir, exist_ok=True)
    for metric in [m for m in args.metrics.split(",") if m]:
        if metric not in points[0]:
            print(f"metric '{metric}' not in points.csv", file=sys.stderr)
            return 2
        label = labels.get(metric, f"{metric} ({'higher' if metric in higher else 'lower'} is better)")
        front = sorted((r for r in pareto if r["metric"] == metric), key=lambda r: as_float(r.get(args.x, "nan")))
        plot_metric(points, front, errors, metric, label, metric in higher, args.series, args.marker, args.title,
                    out_dir, args.x, args.target_context, coordinates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
