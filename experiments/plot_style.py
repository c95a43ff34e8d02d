"""What kvbudget's plot scripts share (experiments/plot_pareto.py, plot_attribution.py):
the interpreter check, print-ready styles, the output formats, log-axis ticks and how a
point is labelled.

Figures are written as PNG, SVG and PDF. SVG text stays text (svg.fonttype 'none')
and PDF embeds TrueType fonts (pdf.fonttype 42), so labels remain editable in a vector
editor; the files carry no dates, so the same results give the same files.
"""
import csv
import math
import os
import sys

try:
    import matplotlib
    import numpy  # noqa: F401  (matplotlib needs it; checked here for a clear message)
except ImportError as missing:  # the scripts run with whichever python3 is first on PATH
    sys.exit(f"{os.path.basename(sys.argv[0])}: this Python ({sys.executable}) cannot import {missing.name}; the "
             "plot scripts need matplotlib and numpy: run them with Debian's /usr/bin/python3 after "
             "`apt-get install python3-matplotlib` (scripts/setup.sh does), or any python3 that has them")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

FORMATS = ("png", "svg", "pdf")

# One style per series: colour, marker and line style all differ, so that series stay
# apart in greyscale print (12 markers x 6 line styles: 12 distinct pairs before repeating).
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
LINE_STYLES = ["-", "--", "-.", ":", (0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (8, 2))]
HATCHES = ["", "///", "\\\\\\", "xxx", "...", "---", "+++", "ooo"]


def configure():
    """Print-ready defaults: editable text in SVG and PDF, readable sizes."""
    plt.rcParams.update({
        "svg.fonttype": "none",
        "pdf.fonttype": 42,
        "ps.fonttype": 42,
        "svg.hashsalt": "kvbudget",  # stable element ids
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.labelsize": 9,
        "legend.fontsize": 8,
        "xtick.labelsize": 8,
        "ytick.labelsize": 8,
    })


def series_style(index, cmap_size=10):
    """(colour, marker, line style) of series `index`."""
    cmap = plt.get_cmap("tab10" if cmap_size <= 10 else "tab20")
    return cmap(index % cmap.N), MARKERS[index % len(MARKERS)], LINE_STYLES[index % len(LINE_STYLES)]


def save(fig, out_dir, name, **kwargs):
    """Writes out_dir/name.png, .svg and .pdf; returns their paths."""
    paths = []
    for ext in FORMATS:
        path = os.path.join(out_dir, f"{name}.{ext}")
        metadata = {"Date": None} if ext == "svg" else {"CreationDate": None} if ext == "pdf" else None
        fig.savefig(path, metadata=metadata, **kwargs)
        paths.append(path)
    plt.close(fig)
    return paths


def read_csv(path):
    """The rows of a CSV file as dicts; [] when it does not exist."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def as_float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def point_label(row):
    """How results name a point: points.csv `label` (the strategy's name with its axes'
    values, or its key when the strategy has no name); `key` in older results."""
    return row.get("label") or row.get("key", "")


def coordinate_columns(header):
    """points.csv's sweep coordinates: the columns between its lead columns and `plan`."""
    header = list(header)
    lead_end = header.index("label") + 1 if "label" in header else header.index("key") + 1
    end = header.index("plan") if "plan" in header else lead_end
    return header[lead_end:end]


def log_ticks(axis, low, high):
    """Puts at least two labelled ticks on a log axis spanning [low, high] (> 0): the
    decades when the span holds two, else 1-2-5 steps, else 1..9 steps, else its two
    ends."""
    if not (low > 0 and high > 0 and math.isfinite(low) and math.isfinite(high)):
        return
    for subs in ((1.0,), (1.0, 2.0, 5.0), tuple(range(1, 10))):
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                 for m in subs if low * (1 - 1e-9) <= m * 10.0 ** e <= high * (1 + 1e-9)]
        if len(ticks) >= 2:
            break
    else:
        ticks = [low, high]
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    axis.set_minor_formatter(ticker.NullFormatter())
