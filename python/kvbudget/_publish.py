"""Publishing a run's small result files (the notebooks' results/reproductions/<name>/):
copies of a results folder's CSV files without their timing column, and figures, so that
publishing the same numbers again changes no byte."""

import csv
import os
import shutil
from pathlib import Path

# Columns that change from run to run with the same numbers: the per-point wall time
# (points.csv's last column).
TIMING_COLUMNS = ("seconds",)


def _copy_csv_without_timing(src, dst):
    """Copies CSV `src` to `dst` without the TIMING_COLUMNS; every other cell as written
    (re-quoted only where CSV needs it, lines ending in \\n)."""
    with open(src, newline="") as fin:
        rows = list(csv.reader(fin))
    drop = {i for i, name in enumerate(rows[0]) if name in TIMING_COLUMNS} if rows else set()
    with open(dst, "w", newline="") as fout:
        writer = csv.writer(fout, lineterminator="\n")
        for row in rows:
            writer.writerow([v for i, v in enumerate(row) if i not in drop])


def publish(result, folder, files=("points.csv",), prefix=""):
    """Copies `files` of a run (names inside its results folder: "points.csv",
    "attribution.csv", "plots/attn_kl_mean.png"; `result` a Result or a results folder's
    path) into `folder` (created if needed) as prefix + the file's base name. CSV files
    lose their timing column ("seconds"), so publishing the same numbers twice writes
    the same bytes. Returns the written paths. A missing file raises FileNotFoundError
    naming it, after the files before it were copied."""
    source = Path(getattr(result, "dir", result))
    dest = Path(folder)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in [files] if isinstance(files, (str, os.PathLike)) else files:
        src = source / name
        if not src.is_file():
            raise FileNotFoundError(f"publish: {src} does not exist (files of {source}: "
                                    f"{', '.join(sorted(p.name for p in source.iterdir())) if source.is_dir() else 'none'})")
        dst = dest / (prefix + Path(name).name)
        if src.suffix == ".csv":
            _copy_csv_without_timing(src, dst)
        else:
            shutil.copyfile(src, dst)
        written.append(dst)
    return written


def save_figure(fig, folder, filename, dpi=110):
    """Saves matplotlib figure `fig` as folder/filename (folder created if needed; the
    format from the file's extension), cropped to its content. Returns the path."""
    dest = Path(folder)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / filename
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path
