"""kvbudget: KV-cache quantization error budgets, from Python.

The library the `kvbudget` CLI is built on (the compiled module kvbudget._core), with
results as pandas DataFrames:

    import kvbudget
    kvbudget.formats()                              # the format table (DataFrame)
    q = kvbudget.quantize(x, "q4_0")                # q.values, q.codes, q.bpe, q.relative_mse
    rec = kvbudget.load_recording("data/records/gpt2-bytes-record.safetensors")
    rec = kvbudget.recording_from_arrays({"layers.0.query": q0, ...}, layout="heads,tokens,head_dim")
    r = kvbudget.run("configs/quickstart.toml", overrides=["data.max_tokens=128"])
    r.points, r.pareto, r.attribution               # DataFrames, each row with its strategy
    r.comparisons                                   # against metrics.baseline: paired verdicts
    r.budget("attn_kl_mean <= 1e-3")                # the budgets.json answer, as rows of r.points
    r.plot("attn_kl_mean")                          # matplotlib axes
    with kvbudget.TorchRecorder(model) as rec:      # a PyTorch model's attention (torch_recorder.py)
        model(input_ids)
    rec.save("run.safetensors")                     # the layout `kvbudget record` writes
    kvbudget.publish(r, "published/mine", ["points.csv"])  # small result files, timing column dropped
    kvbudget.data_path("data/tasks/reasoning_eval.npz")  # a bundled file, from anywhere

Bundled files (configs/, data/) are found from any working directory: a relative config
path or data path is looked up from the working directory, then from the source tree the
module was built from (kvbudget.source_dir()), as the CLI looks up a config's data paths.

run() writes the same results folder as `kvbudget run` (r.dir). Errors raise
kvbudget.ConfigError (a ValueError: a bad config, option or input) or kvbudget.Error
(a RuntimeError: bad data, a failed run) with the CLI's messages. Ctrl-C during run()
stops the sweep, writes what finished (status "interrupted") and raises
KeyboardInterrupt; SIGTERM and SIGHUP stop it too, then take their course.
"""

import io
import json
import os
import re
import signal
import tempfile
import threading
import tomllib
import warnings
from pathlib import Path

from . import _core
from ._core import ConfigError, Error, Quantized, Recording  # noqa: F401
from ._publish import publish, save_figure  # noqa: F401
from ._toml import dumps as _toml_dumps
from .torch_recorder import TorchRecorder, record_torch  # torch is imported when a recorder is made

__all__ = ["ConfigError", "Error", "Quantized", "Recording", "Result", "formats", "quantize", "load_recording",
           "recording_from_arrays", "record", "evaluate", "run", "open_results", "source_dir", "data_path", "publish",
           "save_figure", "TorchRecorder", "record_torch"]


def source_dir():
    """The source tree this module was built from (its configs/ and data/), a Path."""
    return Path(_core.source_dir)


def _find(path, what):
    """`path` as given when absolute or present from the working directory, else under
    source_dir(); ConfigError naming both places when neither holds it."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        if not p.exists():
            raise ConfigError(f"{what} '{path}' not found")
        return p
    bundled = source_dir() / p
    if bundled.exists():
        return bundled
    raise ConfigError(f"{what} '{path}' not found (looked in {Path.cwd() / p}, {bundled})")


def _bundled(path):
    """A relative input path missing from the working directory but present under
    source_dir(): that one, as a string; any other path unchanged (the loader reports
    a missing one)."""
    if path is None or path == "":
        return path
    p = Path(path)
    if not p.is_absolute() and not p.exists() and (source_dir() / p).exists():
        return os.fspath(source_dir() / p)
    return os.fspath(p)


def data_path(*parts):
    """A bundled file or folder, e.g. data_path("data/tasks/reasoning_eval.npz") or
    data_path("configs", "quickstart.toml"): from the working directory when it is
    there, else from source_dir(); ConfigError when neither holds it."""
    return _find(Path(*parts), "data path")


# torch dtypes NumPy has no dtype for: converted to float32 (exact for bfloat16 and
# every float8), by name so that torch need not be imported.
def _numpy_lacks(torch_dtype):
    name = str(torch_dtype)
    return name == "torch.bfloat16" or name.startswith("torch.float8")


def _as_numpy(x):
    """A NumPy array of `x`: NumPy arrays as they are, torch tensors (and anything with
    __dlpack__) through DLPack without a copy where the producer allows, else np.asarray.
    Torch dtypes NumPy lacks (bfloat16, float8_*) become float32 (an exact widening)."""
    import numpy as np

    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor: NumPy reads CPU tensors in place
        x = x.detach().cpu()
        if _numpy_lacks(getattr(x, "dtype", None)):
            x = x.float()
        return x.numpy()
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def formats(head_dim=128, tokens=4096):
    """The format table as a DataFrame, one row per format of each family and per
    preset: name, family, canonical (a preset's format), bpe (one span of tokens x
    head_dim, all metadata counted; NaN where the shape does not fit), cuda,
    keys_only, description (as `kvbudget formats` prints it)."""
    import pandas as pd

    return pd.DataFrame(_core.format_table(head_dim, tokens))


def quantize(x, format, kind="key", rows_per_span=None, seed=0, pre_rope=None, rope_theta=10000.0):
    """Quantizes and dequantizes float array `x` with `format`, as `kvbudget quantize`
    does: rows of the last axis (head_dim); rows_per_span rows form one span (default
    all rows; with pre_rope, the second-to-last axis). kind: "key" or "value" (keys-only
    formats refuse values). pre_rope: the pre-RoPE keys (x's shape) for prerope:<inner>
    formats, with rope_theta; RoPE (rope_theta, positions 0..rows_per_span-1 in each span)
    of pre_rope must give x within a relative L2 error of 2e-2 per span, else an Error
    names the span, the error and the likely cause (wrong rope_theta or rows_per_span).

    Returns a Quantized: values (dequantized, x's shape and dtype), codes (uint8, the
    stored bit stream: codes with their scales, laid out as code_layout says;
    code_bits of it used), storage_bits, bpe (all metadata counted), relative_mse,
    snr_db, max_abs_error, clipped, nonfinite (of values as returned: a float16 x's values
    can overflow float16 where float32 did not), warnings (as `kvbudget quantize` prints
    them, each also issued as a RuntimeWarning); for the ggml formats also blocks (the
    codes as ggml's block structs, no copy) and scales (their fp16 d). float32
    C-contiguous input is read in place; other float dtypes are converted to float32
    once. torch bfloat16 / float8 tensors (dtypes NumPy lacks) are read as float32 and
    their values come back as float32. rows_per_span, when given, must be >= 1; x and
    pre_rope must be finite (kvbudget.Error otherwise)."""
    pre = None if pre_rope is None else _as_numpy(pre_rope)
    q = _core.quantize(_as_numpy(x), format, kind, rows_per_span, seed, pre, rope_theta)
    for message in q.warnings:
        warnings.warn(f"kvbudget.quantize: {message}", RuntimeWarning, stacklevel=2)
    return q


# ggml's block structs (ggml-common.h), little-endian: what q.codes holds for the ggml
# formats, 32 values per block, head_dim/32 blocks per row.
_GGML_BLOCKS = {
    "q4_0": [("d", "<f2"), ("qs", "u1", (16,))],
    "q4_1": [("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))],
    "q5_0": [("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))],
    "q5_1": [("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))],
    "q8_0": [("d", "<f2"), ("qs", "i1", (32,))],
    "iq4_nl": [("d", "<f2"), ("qs", "u1", (16,))],
}


def _blocks(q):
    """For a ggml format (q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl): q.codes as ggml's block
    structs, a structured array [rows, head_dim / 32] viewing the same bytes (no copy):
    fields d (the fp16 scale), m (the fp16 minimum of q4_1 / q5_1), qh (the fifth bits
    of q5_*), qs (the packed codes). None for other formats (q.code_layout describes
    their bytes)."""
    import numpy as np

    fields = _GGML_BLOCKS.get(q.format.split("-")[0])
    if fields is None:
        return None
    block = np.dtype(fields)
    rows = q.values.size // q.values.shape[-1]
    return q.codes.view(block).reshape(rows, -1)


def _scales(q):
    """The per-block fp16 scales of a ggml format (q.blocks["d"]); None for others."""
    blocks = _blocks(q)
    return None if blocks is None else blocks["d"]


Quantized.blocks = property(_blocks)
Quantized.scales = property(_scales)


def load_recording(path, layout="heads,tokens,head_dim", query="layers.{layer}.query", key="layers.{layer}.key",
                   value="layers.{layer}.value", layers=(), max_tokens=0, rope_theta=None):
    """Loads a recording file (safetensors, a sharded index or directory, .npz, a
    directory of .npy) as a config's [data] section does; the arguments are its keys.
    rec.layer(i) gives layer i's tensors as read-only float32 arrays
    ([heads, tokens, head_dim]); rec.save(path) writes it as a recording file.
    max_tokens: the first max_tokens tokens, >= 0 (0 keeps every token; ConfigError
    otherwise, as data.max_tokens)."""
    return _core.load_recording(_bundled(path), layout, query, key, value, list(layers), max_tokens, rope_theta)


# The tensor names recording_from_arrays passes to the recording loader: per layer
# query, key, value (required), key_pre_rope and attn_output (optional); input_ids.
_LAYER_PARTS = ("query", "key", "value", "key_pre_rope", "attn_output")
_ARRAY_NAME = re.compile(r"layers\.(0|[1-9][0-9]*)\.(" + "|".join(_LAYER_PARTS) + r")")
_ACCEPTED_NAMES = ("layers.<i>.query, layers.<i>.key, layers.<i>.value, layers.<i>.key_pre_rope, "
                   "layers.<i>.attn_output, input_ids")


def recording_from_arrays(arrays, layout="heads,tokens,head_dim", name="arrays", rope_theta=None, max_tokens=0):
    """A recording from arrays (NumPy, torch, anything DLPack): either a dict of tensor
    names to arrays, named as in a recording file ("layers.0.query", "layers.0.key",
    "layers.0.value", optionally "layers.0.key_pre_rope", "layers.0.attn_output"
    [tokens, heads * head_dim], and "input_ids", the token ids [tokens] as integers), or
    a list with one dict {"query", "key", "value", optionally "key_pre_rope",
    "attn_output"} per layer. Any other name is refused (ConfigError). `layout` names the
    q/k/v arrays' axes ("heads,tokens,head_dim", "batch,tokens,heads,head_dim", ...) as
    data.layout does; the recording loader's checks apply (shapes, GQA, finite values),
    and its errors name "recording_from_arrays". `name` is the recording's name
    (rec.name; any text, never a file name); max_tokens as load_recording's. To run a
    config on it, save it (rec.save("x.safetensors")) and point data.path there."""
    import numpy as np

    if isinstance(arrays, (list, tuple)):
        named = {}
        for i, layer in enumerate(arrays):
            for part, value in layer.items():
                if part not in _LAYER_PARTS:
                    raise ConfigError(f"recording_from_arrays: layer {i} has a tensor {part!r}; expected "
                                      f"{', '.join(_LAYER_PARTS)}")
                named[f"layers.{i}.{part}"] = value
        arrays = named
    tensors = {}
    for tensor_name, value in arrays.items():
        if not isinstance(tensor_name, str) or not (tensor_name == "input_ids" or _ARRAY_NAME.fullmatch(tensor_name)):
            raise ConfigError(f"recording_from_arrays: tensor name {tensor_name!r} is not one the recording loader "
                              f"reads; accepted: {_ACCEPTED_NAMES}")
        a = _as_numpy(value)
        if tensor_name == "input_ids":
            a = np.asarray(a)
            if a.dtype.kind not in "iu":
                raise ConfigError(f"recording_from_arrays: input_ids has dtype {a.dtype}; expected integer token ids")
            tensors[tensor_name] = np.ascontiguousarray(a, dtype=np.int64)
        else:
            tensors[tensor_name] = np.asarray(a, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="kvbudget-") as tmp:
        path = Path(tmp) / "arrays.safetensors"  # a fixed file name: `name` names the recording only
        _core.write_safetensors(str(path), tensors, {})
        return _core.load_recording(str(path), layout, "layers.{layer}.query", "layers.{layer}.key",
                                    "layers.{layer}.value", [], max_tokens, rope_theta, "recording_from_arrays",
                                    str(name))


def record(checkpoint, text=None, tokens=None, tokenizer="bytes", bos=None, max_tokens=512):
    """Runs a Hugging Face checkpoint on a text file (or a token-id file: .npy or
    whitespace-separated ids) as `kvbudget record` does and returns the Recording:
    per layer query, key, value (post-RoPE), key_pre_rope (RoPE models) and
    attn_output; metadata["nll_mean"] is the exact run's mean next-token NLL.
    rec.save(path, "F16") writes the file `kvbudget record` writes."""
    return _core.record(_bundled(checkpoint), _bundled(text) if text else "", _bundled(tokens) if tokens else "",
                        tokenizer, bos, max_tokens)


def evaluate(checkpoint, text=None, tokens=None, format=None, key_format=None, value_format=None, strategy=None,
             params=None, seed=0, continuations=0, continuation_prompt=64, continuation_tokens=20, tokenizer="bytes",
             bos=None, max_tokens=512, ctx=512, score="all", quantize_layers=None, other_layers_format=None,
             base_memory_mib=1024):
    """Runs a checkpoint on a text (or token-id file) as `kvbudget eval` does: the exact
    cache, and with a plan (format; key_format and value_format; or a strategy or
    preset with params {name: value}) the quantized cache compared with it, in windows of
    `ctx` tokens each from an empty cache (`eval --ctx`; 0 = one window of every token),
    scoring "all" positions after a window's first or llama.cpp's "second_half". Returns a
    dict: tokens, windows, exact_ppl, exact_ppl_se, exact_logits [T, vocab] (each row as
    its window computed it), exact_nll (the scored positions), plan; with a plan also bpe,
    plan_formats, metrics and standard_errors (the metric table's model metrics: ppl,
    ppl_ratio, next_token_kl_*, same_top_rate, Δp, and with continuations > 0 the greedy
    continuations' gen_token_match and gen_bleu4; a task's answer_accuracy and flips_*
    are not computed here and left out, as `kvbudget eval --json` leaves them out), logits, nll (the positions the metrics use).
    exact_logits and logits are None when the exact logits (T × vocab × 4 bytes) exceed
    base_memory_mib MiB (`eval --base-memory`; default 1024): such a run is compared a
    window at a time, the exact logits kept in a temporary file in $TMPDIR (else /tmp),
    and never holds [T, vocab]; the metrics are the same.

    quantize_layers quantizes only some layers with the plan, as a config's [data]
    quantize_layers (and `eval --layers`): "full" (a hybrid's full-attention layers),
    "sliding", "all", "0,2,5-7" or a list of indices [0, 2]; the other layers are stored
    whole at other_layers_format (default "keep-fp16"), and bpe counts them there. A
    budgeted strategy (budget_bpe) is refused with it: its budget is met over every layer."""
    if quantize_layers is not None and not isinstance(quantize_layers, str):
        if isinstance(quantize_layers, int) or not all(isinstance(l, int) for l in quantize_layers):
            raise TypeError("quantize_layers must be a str (\"full\", \"sliding\", \"all\", \"0,2,5-7\") or a list "
                            f"of layer indices, got {quantize_layers!r}")
        quantize_layers = ",".join(str(l) for l in quantize_layers)
    if quantize_layers == "":
        quantize_layers = " "  # given but empty: the selection's own error ("quantize_layers: empty"), not "all"
    return _core.evaluate(_bundled(checkpoint), _bundled(text) if text else "", _bundled(tokens) if tokens else "",
                          tokenizer, bos, max_tokens, format or "", key_format or "", value_format or "",
                          strategy or "", dict(params or {}), seed, continuations, continuation_prompt,
                          continuation_tokens, ctx, score, quantize_layers or "", other_layers_format or "",
                          base_memory_mib)


def _config_file(path):
    """_find for a config file; a missing one given without .toml whose .toml exists
    says so."""
    try:
        return os.fspath(_find(path, "config file"))
    except ConfigError as e:
        with_toml = os.fspath(path) + ".toml"
        if not os.fspath(path).endswith(".toml"):
            try:
                _find(with_toml, "config file")
            except ConfigError:
                raise e from None
            raise ConfigError(f"{e}; did you mean '{with_toml}'?") from None
        raise


def _config_argument(config):
    """(text or path, is_text) for run(): a dict becomes TOML text; a str naming an
    existing file, ending in .toml, or of one line without '=' (no TOML text has a key
    without one), or any os.PathLike, is a path (relative ones looked up from the
    working directory, then source_dir()); another str is TOML text."""
    if isinstance(config, dict):
        return _toml_dumps(config), True
    if isinstance(config, os.PathLike):
        return _config_file(config), False
    if isinstance(config, str):
        if "\n" not in config and (os.path.exists(config) or config.endswith(".toml") or "=" not in config):
            return _config_file(config), False
        return config, True
    raise TypeError(f"config must be a path, a TOML string or a dict, got {type(config).__name__}")


# run() holds it while a run is in progress: the runner installs process-wide state (the
# crash marker's signal handlers, SIGINT), so one run at a time per process.
_run_lock = threading.Lock()


def _as_list(values, what):
    """overrides / budgets as a list: one str is one item (not its characters)."""
    if isinstance(values, (str, bytes)):
        return [values.decode() if isinstance(values, bytes) else values]
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{what} must be a str or a list of str, got {type(values).__name__}") from None


def run(config=None, overrides=(), budgets=(), threads=0, out=None, backend=None, plots=None, quiet=False, shard=None,
        resume=None, precision=None):
    """Runs an experiment as `kvbudget run` does and returns its Result.

    config: a config file's path (relative: from the working directory, else from
    source_dir(), so "configs/quickstart.toml" runs from anywhere), a TOML string or a
    dict (the TOML's tables).
    overrides: ["data.max_tokens=128", ...] as --set; budgets: queries as --budget (a
    single str is one override / query);
    threads, out, backend ("cpu", "cuda", "auto"), precision ("fp32", "tf32": the CUDA
    simulator's plan-dependent products), plots (False = --no-plots), quiet, shard
    ("I/N"), resume (a results folder) as the options of the same names.
    Writes the same results folder as the CLI (Result.dir). A run whose points failed
    or whose files could not be written raises kvbudget.Error after writing what it
    could (the message names the folder); Ctrl-C raises KeyboardInterrupt after
    writing the finished points (status "interrupted"; the Result as .result).
    SIGTERM and SIGHUP stop it as Ctrl-C does; once the finished points are written and
    the previous handlers are back, the signal is raised again: by default the process
    ends as killed by it; a Python handler of it runs (its exception propagates; when it
    returns, KeyboardInterrupt is raised).

    One run at a time per process: a run() called while another is in progress (from
    another thread) raises kvbudget.Error at once, before anything is written (the
    runner's signal handlers are process-wide); run runs side by side in separate
    processes, or split one sweep with shard="I/N"."""
    overrides = _as_list(overrides, "overrides")
    budgets = _as_list(budgets, "budgets")
    if config is None:  # resume=DIR alone: DIR/config.toml
        if resume is None:
            raise TypeError("run() needs a config (or resume=DIR)")
        text, is_text = "", False
    else:
        text, is_text = _config_argument(config)
    command = ["kvbudget.run(" + (repr(text) if not is_text else "<config>")]
    command += [f"--set {o}" for o in overrides] + [f"--budget {b!r}" for b in budgets]
    # Not a blocking wait: a waiting run would start after a Ctrl-C meant to stop the
    # one in progress (whose SIGINT handler the runner holds).
    if not _run_lock.acquire(blocking=False):
        raise Error("kvbudget.run: another run is in progress in this process; one kvbudget.run at a time per "
                    "process: use processes, or shard= to split a sweep")
    try:
        outcome = _core.run(text, is_text, overrides, budgets, int(threads), os.fspath(out) if out else "",
                            backend or "", plots, bool(quiet), shard or "", os.fspath(resume) if resume else "",
                            " ".join(command) + ")", precision or "")
    finally:
        _run_lock.release()
    result = Result(outcome["dir"], outcome)
    if outcome["interrupted"]:
        by = "" if outcome["signal"] in (0, signal.SIGINT) else f" by {signal.Signals(outcome['signal']).name}"
        interrupted = KeyboardInterrupt(f"kvbudget.run interrupted{by}: {outcome['measured'] + outcome['failed']} of "
                                        f"{outcome['points']} points were finished and written to {outcome['dir']}")
        interrupted.result = result
        raise interrupted
    problems = []
    if outcome["failed"]:
        problems.append(f"{outcome['failed']} point(s) failed (see {Path(outcome['dir']) / 'errors.csv'}): " +
                        "; ".join(outcome["point_errors"]))
    if outcome["plot_error"]:
        problems.append("plots not written: " + outcome["plot_error"])
    problems += outcome["run_errors"]
    if outcome["lost_points_csv"]:
        problems.append("the rows points.csv should hold are in error.result.points (as the CLI prints them)")
    if problems:
        error = Error(f"{outcome['dir']}: " + "\n".join(problems))
        error.result = result
        raise error
    return result


def open_results(path):
    """The Result of a results folder written earlier (by the CLI or run()): a folder
    with a manifest.json (results/<name>/<timestamp> or results/<name>/latest).
    ConfigError for a missing path or a folder without manifest.json, naming the runs
    found under it."""
    folder = Path(path)
    if (folder / "manifest.json").is_file():
        return Result(folder)
    if not folder.exists():
        raise ConfigError(f"open_results: '{path}' does not exist")
    if not folder.is_dir():
        raise ConfigError(f"open_results: '{path}' is not a folder (give a results folder with a manifest.json)")
    runs = sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / "manifest.json").is_file())
    message = f"open_results: '{path}' has no manifest.json: not a results folder"
    if runs:
        pick = "latest" if "latest" in runs else runs[-1]
        shown = runs if len(runs) <= 5 else runs[:2] + ["..."] + runs[-2:]
        message += f"; it holds the runs {', '.join(shown)}: give {folder / pick}"
    else:
        named = sorted(p.name for p in folder.iterdir()
                       if p.is_dir() and any((q / "manifest.json").is_file() for q in p.iterdir() if q.is_dir()))
        if named:
            message += (f"; it holds the results of {', '.join(named)}: give one run, e.g. "
                        f"{folder / named[0] / 'latest'}")
    raise ConfigError(message)


# How the runner writes a NaN in its CSV files (format_double; "-nan" from other writers).
# pandas reads "inf" / "-inf" as numbers already; an empty cell is NaN.
_NAN_CELLS = ("nan", "-nan")
# points.csv's columns that name a point: text whatever their cells look like.
_NAME_COLUMNS = ("strategy", "type", "key", "label", "plan")


def _numbers_with_nan(frame):
    """`frame` (as read with only "" as NA, so that text cells stay text) with each column
    whose every cell is a number, empty, "nan" or "-nan" as float64 (NaN there): a metric
    with a NaN cell (a standard error of one position, a correlation of constant values)
    is a number column, not a column of strings."""
    import pandas as pd

    for column in frame.columns:
        cells = frame[column]
        if cells.dtype != object or column in _NAME_COLUMNS:
            continue
        numbers = pd.to_numeric(cells, errors="coerce")
        if (numbers.notna() | cells.isna() | cells.isin(_NAN_CELLS)).all():
            frame[column] = numbers.astype("float64")
    return frame


def _extrapolated_on(flag, column):
    """Whether points.csv's `extrapolated` cell ("no", or "budget_context" and/or
    "target_context" joined by '+') makes the memory on `column` extrapolated
    (docs/methods.md §1: the allocation's any column, the target's bpe_target and
    bytes_target)."""
    what = str(flag).split("+")
    return "budget_context" in what or (column.endswith("_target") and "target_context" in what)


def _id_list(cell):
    """A ';'-separated list of point ids as pandas read it (a string, a number when it
    held one id, NaN when empty) -> [int]."""
    if isinstance(cell, str):
        return [int(i) for i in cell.split(";") if i]
    if cell != cell:  # NaN: empty
        return []
    return [int(cell)]


# The columns budget() adds to a pick's points.csv row (budgets.json's fields of it), and
# those holding point ids, lists of them or None.
_BUDGET_COLUMNS = ("budget_metric", "value", "interval_lo", "interval_hi", "memory", "extrapolated", "extrapolation",
                   "meets_bound_for_certain", "cheaper_within_uncertainty", "least_memory_for_certain",
                   "indistinguishable")
_BUDGET_OBJECT_COLUMNS = ("meets_bound_for_certain", "cheaper_within_uncertainty", "least_memory_for_certain",
                          "indistinguishable")


def _ids_of(points):
    """The ids of budgets.json's list of points; None when it gives none (the field does
    not apply to the query's kind)."""
    return None if points is None else [p["id"] for p in points]


class Result:
    """A results folder: dir, manifest, config, points / pareto / attribution /
    errors (DataFrames, read from the folder's CSV files, each row with its strategy),
    budgets (budgets.json), frontier (the console summary, for a run of this process),
    budget(query) and plot(...)."""

    def __init__(self, path, outcome=None):
        self.dir = Path(path)
        self.outcome = outcome
        self._frames = {}

    def __repr__(self):
        return f"<kvbudget.Result {self.dir} ({self.manifest.get('status')})>"

    @property
    def frontier(self):
        return self.outcome["frontier"] if self.outcome else None

    @property
    def manifest(self):
        return json.loads((self.dir / "manifest.json").read_text())

    @property
    def config(self):
        return tomllib.loads((self.dir / "config.toml").read_text())

    @property
    def budgets(self):
        p = self.dir / "budgets.json"
        return json.loads(p.read_text()) if p.exists() else None

    def _csv(self, name):
        import pandas as pd

        if name not in self._frames:
            p = self.dir / name
            self._frames[name] = (_numbers_with_nan(pd.read_csv(p, keep_default_na=False, na_values=[""]))
                                  if p.exists() and p.stat().st_size > 0 else pd.DataFrame())
        return self._frames[name]

    def _pareto_metrics(self):
        """The run's metrics.pareto with its default resolved, as budgets.json and the plots
        used it: manifest.json's pareto_metrics; in a folder written before the manifest
        held them, config.toml's metrics.pareto, else the runner's default (a model run's
        ppl_ratio, next_token_kl_mean, whose points.csv then has ppl_ratio; otherwise
        attn_kl_mean, attn_out_rel_err)."""
        manifest = self.manifest
        if "pareto_metrics" in manifest:
            return list(manifest["pareto_metrics"])
        metrics = self.config.get("metrics", {})
        if "pareto" in metrics:
            return list(metrics["pareto"])
        if "ppl_ratio" in self.points.columns:
            return ["ppl_ratio", "next_token_kl_mean"]
        return ["attn_kl_mean", "attn_out_rel_err"]

    def _output_setting(self, manifest_key, key, default):
        """output.<key> with its default resolved: manifest.json's `manifest_key`, else
        (older folders) config.toml's output.<key>, else the runner's default."""
        manifest = self.manifest
        if manifest_key in manifest:
            return manifest[manifest_key]
        return self.config.get("output", {}).get(key, default)

    def _with_strategy(self, frame):
        """`frame` with the strategy column of points.csv (by id) when it lacks one."""
        if frame.empty or "strategy" in frame.columns or "id" not in frame.columns:
            return frame
        strategies = self.points[["id", "strategy"]]
        merged = frame.merge(strategies, on="id", how="left")
        cols = list(frame.columns)
        return merged[cols[:1] + ["strategy"] + cols[1:]]

    @property
    def points(self):
        """points.csv; for a run of this process whose points.csv could not be written (a
        full disk), the rows it should hold (as the CLI prints them), from the outcome."""
        import pandas as pd

        lost = self.outcome.get("lost_points_csv") if self.outcome else None
        if not lost:
            return self._csv("points.csv")
        if "lost points" not in self._frames:
            self._frames["lost points"] = _numbers_with_nan(pd.read_csv(io.StringIO(lost), keep_default_na=False,
                                                                        na_values=[""]))
        return self._frames["lost points"]

    @property
    def errors(self):
        return self._csv("errors.csv")

    @property
    def pareto(self):
        """pareto.csv: each metric's front, with `strategy`; `may_be_dominated_by` as a list
        of point ids (those with no more memory the run cannot tell from the point)."""
        frame = self._with_strategy(self._csv("pareto.csv"))
        if "may_be_dominated_by" in frame.columns:
            frame = frame.copy()
            frame["may_be_dominated_by"] = [_id_list(v) for v in frame["may_be_dominated_by"]]
        if "within_uncertainty" in frame.columns:  # empty (no interval) -> None, not NaN (truthy)
            frame["within_uncertainty"] = [None if v != v else bool(v) if not isinstance(v, str) else v == "true"
                                           for v in frame["within_uncertainty"]]
        return frame

    @property
    def attribution(self):
        return self._with_strategy(self._csv("attribution.csv"))

    @property
    def concentration(self):
        return self._with_strategy(self._csv("concentration.csv"))

    @property
    def comparisons(self):
        """Every point against metrics.baseline (comparisons.csv): the paired difference of
        each pairable metric, its interval and the verdict ("better", "worse", "no
        measurable difference"); empty without a baseline."""
        return self._csv("comparisons.csv")

    def budget(self, query):
        """The answer to a budget query ("attn_kl_mean <= 1e-3", "bpe <= 4") over this
        run's points, exactly as `kvbudget run` answers it in budgets.json and on the
        console, whether or not the run asked it: the run's config.toml and results.jsonl
        go through the CLI's report code (no statistics are redone in Python). One row per
        pick (an error budget: the least memory on output.x meeting it; a memory budget:
        the least error within it, for each Pareto metric), its points.csv row and:

        - `budget_metric`: the metric constrained or, for a memory budget, optimized;
          `value`: the pick's value in it, `interval_lo`/`interval_hi` its interval (the
          run's level, 95 %: bootstrap or closed form, else value ± z·SE; NaN without one);
        - `memory`: the memory column the query used (a memory budget: its own; an error
          budget: output.x), `extrapolated` (bool) whether the pick's memory on that column
          is taken at a longer context than its error was measured on, `extrapolation` why
          ("" when not; docs/methods.md §1). points.csv's `extrapolated` says it of any
          column;
        - an error budget: `meets_bound_for_certain` (the whole interval meets the bound;
          None without an interval), `cheaper_within_uncertainty` (ids of the points with
          less memory whose measured value misses the bound but whose interval reaches
          it, least memory first), `least_memory_for_certain` (when the pick's interval
          reaches past the bound: the id of the point with the least memory whose whole
          interval meets it, else None); `indistinguishable` None;
        - a memory budget: `indistinguishable` (ids of the other points within the
          budget that the run cannot tell from the pick in the metric: the paired
          bootstrap interval of the difference holds 0, or, unpaired, their intervals
          overlap; best first); the error budget's columns None.

        An empty frame when nothing qualifies. ConfigError for a query the run cannot
        answer (a metric it did not measure). A folder without results.jsonl (an older
        kvbudget's) gives only the picks, with a warning: the uncertainty columns None,
        `extrapolated` read from points.csv's."""
        import pandas as pd

        points = self.points
        answered = (json.loads(_core.budget_answer(os.fspath(self.dir), query))
                    if (self.dir / "results.jsonl").is_file() else None)
        if answered is not None and "config_unreadable" in answered:
            warnings.warn(f"{self.dir}: its config.toml cannot be read here ({answered['config_unreadable']}): "
                          f"budget({query!r}) gives the picks without their uncertainty, from points.csv",
                          RuntimeWarning, stacklevel=2)
            answers = self._budget_picks_only(query, points)
        elif answered is not None:
            answers = answered["answers"]
        else:
            warnings.warn(f"{self.dir}: no results.jsonl (a folder of an older kvbudget): budget({query!r}) gives the "
                          "picks without their uncertainty, and extrapolated from points.csv", RuntimeWarning,
                          stacklevel=2)
            answers = self._budget_picks_only(query, points)
        row_of = {int(i): k for k, i in enumerate(points["id"])} if "id" in points.columns else {}
        rows = []
        for answer in answers:
            if answer["point"] is None:
                continue
            row = points.iloc[row_of[answer["id"]]].to_dict()
            interval = answer.get("interval") or [float("nan"), float("nan")]
            least = answer.get("least_memory_for_certain")
            row.update({
                "budget_metric": answer["metric"],
                "value": answer["value"],
                "interval_lo": interval[0],
                "interval_hi": interval[1],
                "memory": answer["memory"],
                "extrapolated": answer["extrapolated"],
                "extrapolation": answer.get("extrapolation", ""),
                "meets_bound_for_certain": answer.get("meets_bound_for_certain"),
                "cheaper_within_uncertainty": _ids_of(answer.get("cheaper_within_uncertainty")),
                "least_memory_for_certain": least["id"] if least else None,
                "indistinguishable": _ids_of(answer.get("indistinguishable")),
            })
            rows.append(row)
        columns = list(points.columns) + [c for c in _BUDGET_COLUMNS if c not in points.columns]
        frame = pd.DataFrame(rows, columns=columns)
        for column in _BUDGET_OBJECT_COLUMNS:  # ids and None as they are, not floats with NaN
            frame[column] = pd.Series([row[column] for row in rows], dtype=object)
        return frame

    def _budget_picks_only(self, query, points):
        """budget()'s answers, as budgets.json's, for a folder without results.jsonl: the
        picks from points.csv, with `extrapolated` on the memory column used (points.csv's
        `extrapolated` names the figures extrapolated) and no uncertainty."""
        memory_axis = self._output_setting("memory_axis", "x", "bpe")
        columns = {c: [float(v) for v in points[c]] for c in points.columns
                   if c != "id" and points[c].dtype.kind in "fi"}
        picks = _core.budget_picks(query, columns, list(self._pareto_metrics()), memory_axis)  # checks the query
        lhs = re.match(r"\s*(\w+)", query).group(1)
        memory = lhs if lhs in _core.memory_columns else memory_axis
        answers = []
        for metric, index in picks:
            if index is None:
                answers.append({"metric": metric, "point": None})
                continue
            row = points.iloc[index]
            extrapolated = _extrapolated_on(row.get("extrapolated", "no"), memory)
            answers.append({"metric": metric, "point": row.get("key", ""), "id": int(row["id"]), "value": row[metric],
                            "memory": memory, "extrapolated": extrapolated})
        return answers

    def plot(self, metric=None, x=None, ax=None, frontier=True, logy=None):
        """Plots each point's `metric` (default: the first Pareto metric) against memory
        `x` (default: output.x: "bpe", "bpe_target", "bytes", "bytes_target" or
        "bpe_read"), one
        series per strategy (its name), each with its own marker and line style (the
        line joins the points in memory order), with the metric's interval as error bars
        (`<metric>_lo`/`_hi`, else ± 1.96 `<metric>_se`) and hollow markers where the memory
        on `x` is extrapolated (points.csv `extrapolated`), and the Pareto frontier over all
        of them on `x` itself (pareto.csv's is on output.x); the y axis is named as the
        CLI's plots name it (the metric table's quantity, unit and direction). Returns the
        matplotlib axes. The results folder's plots/ holds the CLI's plots (PNG, SVG, PDF,
        with captions)."""
        import matplotlib.pyplot as plt

        x = x or self._output_setting("memory_axis", "x", "bpe")
        if metric is None:
            pareto = self._pareto_metrics()
            if not pareto:
                raise ConfigError("plot: the run has no Pareto metric (metrics.pareto = []): name the metric")
            metric = pareto[0]
        points = self.points
        if metric not in points.columns:
            raise ConfigError(f"plot: points.csv has no column '{metric}'")
        if x not in _core.memory_columns:
            raise ConfigError(f"plot: x = '{x}' is not a memory column ({', '.join(_core.memory_columns)})")
        if x not in points.columns:
            raise ConfigError(f"plot: points.csv has no column '{x}' (a folder of an older kvbudget)")
        if ax is None:
            _, ax = plt.subplots()
        markers = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
        lines = ["-", "--", "-.", ":"]
        for k, (strategy, group) in enumerate(points.groupby("strategy", sort=False)):
            group = group.sort_values(x)
            line = ax.plot(group[x], group[metric], marker=markers[k % len(markers)],
                           linestyle=lines[k % len(lines)], markersize=4, linewidth=1, label=strategy)[0]
            if f"{metric}_lo" in group.columns and f"{metric}_hi" in group.columns:
                below, above = group[metric] - group[f"{metric}_lo"], group[f"{metric}_hi"] - group[metric]
            elif f"{metric}_se" in group.columns:
                below = above = 1.959964 * group[f"{metric}_se"]
            else:
                below = above = None
            if below is not None and below.notna().any():
                ax.errorbar(group[x], group[metric], yerr=[below.fillna(0), above.fillna(0)], fmt="none",
                            ecolor=line.get_color(), elinewidth=0.8, capsize=2, label="_nolegend_")
            if "extrapolated" in group.columns:
                hollow = group[group["extrapolated"].map(lambda flag: _extrapolated_on(flag, x))]
                if not hollow.empty:
                    ax.plot(hollow[x], hollow[metric], linestyle="none", marker=markers[k % len(markers)],
                            markersize=4, markerfacecolor="white", markeredgecolor=line.get_color(),
                            label="_nolegend_")
        if frontier:
            axis = _core.metric_axis(metric)
            if axis is None:
                raise ConfigError(f"plot: '{metric}' is not in the metric table: no direction for a frontier")
            front = _core.pareto_front([float(v) for v in points[x]], [float(v) for v in points[metric]], axis[1])
            if front:
                rows = points.iloc[front]
                ax.step(rows[x], rows[metric], where="post", color="black", linewidth=2, alpha=0.5,
                        label="Pareto frontier, all strategies")
        values = points[metric].dropna()
        if logy is None:
            logy = len(values) > 0 and (values > 0).all() and values.max() > 100 * max(values.min(), 1e-300)
        if logy:
            ax.set_yscale("log")
        target_context = self._output_setting("target_context", "target_context", 32768)
        at = f" at {target_context} tokens" if x.endswith("_target") else ""
        ax.set_xlabel(("bits per element" if x.startswith("bpe") else "cache size (bytes)") + at)
        axis = _core.metric_axis(metric)
        ax.set_ylabel(axis[0] if axis else metric)
        ax.legend(fontsize="small")
        return ax


