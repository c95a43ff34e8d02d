#!/usr/bin/python3
"""Plots the error-budget attribution of a kvbudget run.

Reads RESULTS/attribution.csv, RESULTS/concentration.csv and RESULTS/pareto.csv (written
by `kvbudget run`, see experiments/attribution.h for the definitions) and writes, under
RESULTS/plots/:
  concentration.png/.svg       share of the total error carried by the worst x% of heads
  attribution_layers.png/.svg  share of the error per layer, one row per point
  attribution_regions.png/.svg share per token region (and the interaction), per point,
                               when some plan has protections or phases
At most 12 points are drawn: all of them when there are few, else the Pareto points of
the first Pareto metric, else the first 12.

Runs under Debian's /usr/bin/python3 with python3-matplotlib.
"""
import argparse
import csv
import os
import sys
from collections import OrderedDict, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

MAX_POINTS = 12
METRICS = [("kl", "attention KL"), ("out_err2", "attention-output error ||o - ô||²")]


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def pick_points(attribution, pareto):
    ids = list(OrderedDict((r["id"], r["key"]) for r in attribution).items())
    if len(ids) <= MAX_POINTS:
        return ids
    keys = dict(ids)
    if pareto:
        first = pareto[0]["metric"]
        front = [r["id"] for r in pareto if r["metric"] == first and r["id"] in keys]
        if front:
            return [(i, keys[i]) for i in front[:MAX_POINTS]]
    return ids[:MAX_POINTS]


def short(key, n=48):
    return key if len(key) <= n else key[: n - 3] + "..."


def save(fig, out_dir, name):
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out_dir, f"{name}.{ext}"))
    plt.close(fig)


def plot_concentration(conc, points, title, out_dir):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=120)
    cmap = plt.get_cmap("tab10" if len(points) <= 10 else "tab20")
    for ax, (metric, label) in zip(axes, METRICS):
        for k, (pid, key) in enumerate(points):
            rows = [r for r in conc if r["id"] == pid and r["metric"] == metric]
            x = [0.0] + [float(r["head_fraction"]) * 100 for r in rows]
            y = [0.0] + [float(r["error_share"]) * 100 for r in rows]
            ax.plot(x, y, color=cmap(k % cmap.N), linewidth=1.2, label=short(key))
        ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="equal shares")
        ax.axvline(2, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("worst heads (% of query heads, worst first)")
        ax.set_ylabel("share of the total error (%)")
        ax.set_title(label, fontsize=10)
        ax.set_xlim(0, 100)
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{title}: error concentration over heads", fontsize=11)
    save(fig, out_dir, "concentration")


def plot_layers(attr, points, title, out_dir):
    layers = list(OrderedDict((r["name"], 1) for r in attr if r["scope"] == "layer"))
    if not layers:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.8 + 0.35 * len(points) + 1.2), dpi=120)
    for ax, (metric, label) in zip(axes, METRICS):
        grid = np.zeros((len(points), len(layers)))
        for i, (pid, _) in enumerate(points):
            for r in attr:
                if r["id"] == pid and r["metric"] == metric and r["scope"] == "layer":
                    grid[i, layers.index(r["name"])] = float(r["share"])
        im = ax.imshow(grid * 100, aspect="auto", cmap="viridis", vmin=0)
        ax.set_xticks(range(len(layers)))
        ax.set_xticklabels(layers, fontsize=7)
        ax.set_yticks(range(len(points)))
        ax.set_yticklabels([short(k, 36) for _, k in points], fontsize=6)
        ax.set_title(f"{label}: share per layer (%)", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04)
    fig.suptitle(f"{title}: error per layer", fontsize=11)
    save(fig, out_dir, "attribution_layers")


def plot_regions(attr, points, title, out_dir):
    names = list(OrderedDict(((r["scope"], r["name"]), 1) for r in attr
                             if r["scope"] not in ("layer", "head")))
    # Plans without protections or phases are 100% "rest": nothing to draw.
    if not names or set(names) <= {("protection", "rest"), ("protection", "interaction")}:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.8 + 0.35 * len(points) + 1.2), dpi=120, sharey=True)
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    height = 0.8 / len(names)
    for ax, (metric, label) in zip(axes, METRICS):
        shares = defaultdict(float)
        for r in attr:
            if r["metric"] == metric and (r["scope"], r["name"]) in names:
                shares[(r["id"], r["scope"], r["name"])] = float(r["share"])
        for k, (scope, name) in enumerate(names):
            y = [i - 0.4 + (k + 0.5) * height for i in range(len(points))]
            ax.barh(y, [shares[(pid, scope, name)] * 100 for pid, _ in points], height=height,
                    color=cmap(k % cmap.N), label=f"{scope}: {name}")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(points)))
        ax.set_yticklabels([short(k, 36) for _, k in points], fontsize=6)
        ax.set_xlabel("share of the total error (%)")
        ax.set_title(label, fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    axes[1].legend(fontsize=6, loc="best")
    fig.suptitle(f"{title}: error with only one region quantized", fontsize=11)
    save(fig, out_dir, "attribution_regions")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True, help="a results/<name>/<timestamp> directory")
    ap.add_argument("--title", default="kvbudget")
    args = ap.parse_args()
    attr = read_csv(os.path.join(args.results, "attribution.csv"))
    conc = read_csv(os.path.join(args.results, "concentration.csv"))
    if not attr:
        print("no attribution.csv rows to plot", file=sys.stderr)
        return 1
    points = pick_points(attr, read_csv(os.path.join(args.results, "pareto.csv")))
    out_dir = os.path.join(args.results, "plots")
    os.makedirs(out_dir, exist_ok=True)
    plot_concentration(conc, points, args.title, out_dir)
    plot_layers(attr, points, args.title, out_dir)
    plot_regions(attr, points, args.title, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
