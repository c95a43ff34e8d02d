#!/usr/bin/env python3
"""Plots the error-budget attribution of a kvbudget run.

Reads RESULTS/attribution.csv, RESULTS/concentration.csv and RESULTS/points.csv
(written by `kvbudget run`, see experiments/attribution.h for the definitions) and
writes, under RESULTS/plots/, as PNG, SVG and PDF:
  concentration             share of the total error carried by the worst x% of heads
  attribution_layers        share of the error per layer, one row per point
  attribution_regions       share per token region (and the interaction), per point,
                            when some plan has protections or phases
Every attributed point is drawn: --points-per-page of them per page (12 by default),
page 1 in the files above, page k in <name>-p<k>.*. `attribution.points` in the config
chooses which points are attributed at all. attribution.caption.txt lists the pages and
the points on each. Points are named by points.csv `label` (the strategy's name with
its axes' values).

Needs matplotlib and numpy (Debian's /usr/bin/python3 with python3-matplotlib); run
with another python3, it says so.
"""
import argparse
import os
import sys
from collections import OrderedDict, defaultdict

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_style  # noqa: E402  (exits with a clear message without matplotlib)
from plot_style import plt, point_label, read_csv  # noqa: E402

import numpy as np  # noqa: E402

POINTS_PER_PAGE = 12
# Panel titles of the attributed errors (attribution.csv `metric`: AdditiveError::name);
# one panel per error the CSV holds, in its order (attribution.metrics in the config).
TITLES = {"kl": "attention KL (share of its total, %)",
          "out_err2": "attention-output error ||o - ô||² (share of its total, %)",
          "out_rel": "relative attention-output error ||o - ô|| / ||o|| (share of its total, %)",
          "logit_err2": "attention-logit error Σ (ŝ - s)² (share of its total, %)"}


def panels(metrics, width, height, **kw):
    """A figure with one panel per attributed error (`width` inches per two panels), its
    axes and (error, panel title) pairs."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(width * max(len(metrics), 2) / 2, height), dpi=120,
                             squeeze=False, **kw)
    return fig, list(axes[0]), [(m, TITLES.get(m, f"{m} (share of its total, %)")) for m in metrics]


def short(text, n=56):
    """`text` cut to n characters in the middle, where long keys repeat their family."""
    if len(text) <= n:
        return text
    head = (n - 3) // 2
    return text[:head] + "..." + text[len(text) - (n - 3 - head):]


def page_name(name, page):
    return name if page == 1 else f"{name}-p{page}"


def plot_concentration(conc, metrics, points, title, out_dir, name):
    fig, axes, titled = panels(metrics, 11, 4.8)
    for ax, (metric, label) in zip(axes, titled):
        for k, (pid, text) in enumerate(points):
            rows = [r for r in conc if r["id"] == pid and r["metric"] == metric]
            x = [0.0] + [float(r["head_fraction"]) * 100 for r in rows]
            y = [0.0] + [float(r["error_share"]) * 100 for r in rows]
            colour, marker, line = plot_style.series_style(k, len(points))
            ax.plot(x, y, color=colour, linestyle=line, marker=marker, markevery=max(1, len(x) // 6), markersize=4,
                    linewidth=1.2, label=short(text))
        ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="equal shares")
        ax.axvline(2, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("worst heads (% of query heads, worst first)")
        ax.set_ylabel("share of the total error (%)")
        ax.set_title(label, fontsize=9)
        ax.set_xlim(0, 100)
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle(f"{title}: error concentration over heads", fontsize=11)
    fig.tight_layout()
    plot_style.save(fig, out_dir, name, bbox_inches="tight")


def plot_layers(attr, metrics, layers, points, title, out_dir, name):
    fig, axes, titled = panels(metrics, 12, 1.6 + 0.32 * len(points))
    for ax, (metric, label) in zip(axes, titled):
        grid = np.zeros((len(points), len(layers)))
        for i, (pid, _) in enumerate(points):
            for r in attr.get((pid, metric, "layer"), []):
                grid[i, layers.index(r["name"])] = float(r["share"]) * 100
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=max(grid.max(), 1e-12))
        if len(layers) <= 16:  # the value in each cell, in a colour that reads on it
            for i in range(len(points)):
                for j in range(len(layers)):
                    v = grid[i, j]
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=6,
                            color="black" if v > 0.6 * grid.max() else "white")
        ax.set_xticks(range(len(layers)))
        ax.set_xticklabels(layers, fontsize=7, rotation=90 if len(layers) > 16 else 0)
        ax.set_yticks(range(len(points)))
        ax.set_yticklabels([short(t) for _, t in points], fontsize=7)
        ax.set_xlabel("layer")
        ax.set_title(label, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04, label="share per layer (%)")
    fig.suptitle(f"{title}: error per layer", fontsize=11)
    fig.tight_layout()
    plot_style.save(fig, out_dir, name, bbox_inches="tight")


def plot_regions(attr, metrics, names, points, title, out_dir, name):
    # One group of bars per point, one bar per region: colour and hatch tell regions apart.
    per_point = 0.2 * len(names) + 0.25
    fig, axes, titled = panels(metrics, 12, 1.8 + per_point * len(points), sharey=True)
    height = 0.8 / len(names)
    for ax, (metric, label) in zip(axes, titled):
        shares = defaultdict(float)
        for pid, _ in points:
            for scope in {s for s, _ in names}:
                for r in attr.get((pid, metric, scope), []):
                    shares[(pid, scope, r["name"])] = float(r["share"]) * 100
        for k, (scope, region) in enumerate(names):
            y = [i - 0.4 + (k + 0.5) * height for i in range(len(points))]
            colour, _, _ = plot_style.series_style(k, len(names))
            ax.barh(y, [shares[(pid, scope, region)] for pid, _ in points], height=height * 0.92, color=colour,
                    hatch=plot_style.HATCHES[k % len(plot_style.HATCHES)], edgecolor="black", linewidth=0.4,
                    label=f"{scope}: {region}")
        for i in range(1, len(points)):
            ax.axhline(i - 0.5, color="grey", linewidth=0.5, alpha=0.5)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(points)))
        ax.set_yticklabels([short(t) for _, t in points], fontsize=7)
        ax.set_ylim(len(points) - 0.5, -0.5)
        ax.set_xlabel("share of the total error with only this region quantized (%)")
        ax.set_title(label, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle(f"{title}: error with only one region quantized", fontsize=11)
    fig.tight_layout()
    plot_style.save(fig, out_dir, name, bbox_inches="tight")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="a results/<name>/<timestamp> directory")
    ap.add_argument("--title", default="kvbudget")
    ap.add_argument("--points-per-page", type=int, default=POINTS_PER_PAGE,
                    help=f"points per page of each plot (default {POINTS_PER_PAGE})")
    args = ap.parse_args()
    if args.points_per_page < 1:
        print(f"--points-per-page {args.points_per_page}: expected at least 1", file=sys.stderr)
        return 2
    plot_style.configure()
    rows = read_csv(os.path.join(args.results, "attribution.csv"))
    conc = read_csv(os.path.join(args.results, "concentration.csv"))
    if not rows:
        print("no attribution.csv rows to plot", file=sys.stderr)
        return 1
    labels = {p["id"]: point_label(p) for p in read_csv(os.path.join(args.results, "points.csv"))}
    points = [(pid, labels.get(pid, key)) for pid, key in OrderedDict((r["id"], r["key"]) for r in rows).items()]
    attr = defaultdict(list)  # (id, metric, scope) -> rows
    for r in rows:
        attr[(r["id"], r["metric"], r["scope"])].append(r)
    metrics = list(OrderedDict((r["metric"], 1) for r in rows))
    layers = list(OrderedDict((r["name"], 1) for r in rows if r["scope"] == "layer"))
    regions = list(OrderedDict(((r["scope"], r["name"]), 1) for r in rows if r["scope"] not in ("layer", "head")))
    # Plans without protections or phases are 100% "rest": no regions plot.
    draw_regions = bool(regions) and not set(regions) <= {("protection", "rest"), ("protection", "interaction")}
    out_dir = os.path.join(args.results, "plots")
    os.makedirs(out_dir, exist_ok=True)
    size = args.points_per_page
    pages = [points[i: i + size] for i in range(0, len(points), size)]
    drawn = ["concentration"] + (["attribution_layers"] if layers else []) + \
        (["attribution_regions"] if draw_regions else [])
    caption = [f"{args.title}: error-budget attribution of {len(points)} points (attribution.csv), "
               f"{len(pages)} page(s) of at most {size} points each: " + ", ".join(drawn) +
               " (page k > 1 in <name>-p<k>)."]
    for k, page in enumerate(pages, start=1):
        plot_concentration(conc, metrics, page, args.title, out_dir, page_name("concentration", k))
        if layers:
            plot_layers(attr, metrics, layers, page, args.title, out_dir, page_name("attribution_layers", k))
        if draw_regions:
            plot_regions(attr, metrics, regions, page, args.title, out_dir, page_name("attribution_regions", k))
        caption.append(f"page {k}: " + "; ".join(f"point {pid} {text}" for pid, text in page))
    if not draw_regions:
        caption.append("No regions plot: no plan has protections or phases (all of its error is in 'rest').")
    with open(os.path.join(out_dir, "attribution.caption.txt"), "w") as f:
        f.write("\n".join(caption) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
