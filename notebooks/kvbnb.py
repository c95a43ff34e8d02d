"""Helpers shared by the reproduction notebooks: find the source tree and the kvbudget
binary, run a config, read its CSVs, and publish small result files and plots under
results/reproductions/<name>/.

Environment (the test suite sets these; by hand the defaults apply):
  KVB_SOURCE_DIR   the source tree (default: found by walking up from the working directory)
  KVB_BIN          the kvbudget binary (default: <source>/build/kvbudget)
  KVB_REPRO_OUT    where results are published (default: <source>/results/reproductions)

Only the Python standard library, numpy and matplotlib are used.
"""
import csv
import os
import shutil
import subprocess
import tempfile


def source_dir():
    env = os.environ.get("KVB_SOURCE_DIR")
    if env:
        return os.path.abspath(env)
    d = os.path.abspath(os.getcwd())
    while True:
        if os.path.exists(os.path.join(d, "CMakeLists.txt")) and os.path.isdir(os.path.join(d, "sim")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            raise RuntimeError("cannot find the kvbudget source tree; set KVB_SOURCE_DIR")
        d = parent


def binary():
    path = os.environ.get("KVB_BIN") or os.path.join(source_dir(), "build", "kvbudget")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"kvbudget binary not found at {path}: build it (cmake -S . -B build && "
                           "cmake --build build -j2) or set KVB_BIN")
    return path


def publish_dir(name):
    base = os.environ.get("KVB_REPRO_OUT") or os.path.join(source_dir(), "results", "reproductions")
    d = os.path.join(base, name)
    os.makedirs(d, exist_ok=True)
    return d


_RUNS = tempfile.mkdtemp(prefix="kvb_notebook_runs_")


def run(config, sets=(), tag=None, plots=False):
    """Runs `kvbudget run configs/<config>` with --set overrides; returns the run directory."""
    cfg = os.path.join(source_dir(), "configs", config)
    out = os.path.join(_RUNS, tag or os.path.splitext(config)[0])
    cmd = [binary(), "run", cfg, "--out", out, "--quiet"]
    if not plots:
        cmd.append("--no-plots")
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=source_dir(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    names = [n for n in os.listdir(out) if not n.startswith(".")]
    return os.path.realpath(os.path.join(out, names[0], "latest"))


def read_csv(path):
    """Rows as dicts; numeric fields become floats."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            try:
                r[k] = float(v)
            except (TypeError, ValueError):
                pass
    return rows


def points(run_dir):
    return read_csv(os.path.join(run_dir, "points.csv"))


def publish(run_dir, name, files, prefix=""):
    """Copies files of a run (e.g. points.csv, plots/attn_kl_mean.png) into the published results.
    A points.csv loses its `seconds` column, so republishing the same numbers changes nothing."""
    dest = publish_dir(name)
    for f in files:
        src, dst = os.path.join(run_dir, f), os.path.join(dest, prefix + os.path.basename(f))
        if os.path.basename(f) != "points.csv":
            shutil.copyfile(src, dst)
            continue
        with open(src, newline="") as fin:
            rows = list(csv.reader(fin))
        drop = rows[0].index("seconds") if rows and "seconds" in rows[0] else None
        with open(dst, "w", newline="") as fout:
            w = csv.writer(fout, lineterminator="\n")
            for r in rows:
                w.writerow([v for i, v in enumerate(r) if i != drop])
    return dest


def savefig(fig, name, filename):
    path = os.path.join(publish_dir(name), filename)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def table(rows, columns, formats=None):
    """A plain-text table of selected columns (for notebook output)."""
    formats = formats or {}
    cells = [[c for c in columns]]
    for r in rows:
        line = []
        for c in columns:
            v = r.get(c, "")
            f = formats.get(c)
            line.append(f.format(v) if f and isinstance(v, float) else str(v))
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells)
