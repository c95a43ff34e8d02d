"""Publishing a run's small result files (the notebooks' results/reproductions/<name>/):
copies of a results folder's CSV files without their timing column, and figures, so that
publishing the same numbers again changes no byte."""

import csv
import json
import os
import shutil
import warnings
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


# Written beside the published files of a run that did not complete (prefix + this name).
STATUS_NOTE = "run_status.txt"


def _csv_rows(path):
    """The data rows of CSV file `path` (0 when it is missing or empty)."""
    if not path.is_file():
        return 0
    with open(path, newline="") as f:
        return max(sum(1 for _ in csv.reader(f)) - 1, 0)


def _incomplete_run_note(source):
    """Why the run in results folder `source` is not the whole sweep, in words (its
    manifest's status other than complete: how many points of how many were measured
    and failed; or one shard of several); None for a complete run or a folder without a
    manifest.json."""
    manifest_path = source / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    status = manifest.get("status", "unknown")
    shard = manifest.get("shard", {"index": 0, "count": 1})
    notes = []
    if status != "complete":
        notes.append(f"its status is '{status}': {_csv_rows(source / 'points.csv')} of "
                     f"{manifest.get('points_total', '?')} points measured, {_csv_rows(source / 'errors.csv')} "
                     f"failed; its frontiers and budget answers cover the measured points only")
    if shard.get("count", 1) > 1:
        notes.append(f"it is shard {shard.get('index', 0) + 1} of {shard['count']} of a sweep of "
                     f"{manifest.get('sweep_points_total', '?')} points (kvbudget merge joins the shards)")
    return f"published from {source}, a run that did not complete: " + "; ".join(notes) if notes else None


def publish(result, folder, files=("points.csv",), prefix=""):
    """Copies `files` of a run (names inside its results folder: "points.csv",
    "attribution.csv", "plots/attn_kl_mean.png"; `result` a Result or a results folder's
    path) into `folder` (created if needed) as prefix + the file's base name. CSV files
    lose their timing column ("seconds"), so publishing the same numbers twice writes
    the same bytes. Returns the written paths. A missing file raises FileNotFoundError
    naming it, after the files before it were copied.

    A run that did not complete (manifest.json's status interrupted, failed, crashed or
    running; or one shard of a sweep) is published with a warning and a note,
    prefix + "run_status.txt", naming its status and how many points of how many were
    measured; publishing a complete run removes an earlier note."""
    source = Path(getattr(result, "dir", result))
    dest = Path(folder)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    note = _incomplete_run_note(source)
    note_path = dest / (prefix + STATUS_NOTE)
    if note is None:
        note_path.unlink(missing_ok=True)
    else:
        warnings.warn(f"publish: {note}", stacklevel=2)
        note_path.write_text(note + "\n")
        written.append(note_path)
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
