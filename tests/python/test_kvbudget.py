"""The Python package (python/kvbudget): every format of the table round-trips through
quantize(); run() writes the CLI's results byte for byte (timing column aside) and
reads them as DataFrames; recordings from files and arrays; errors carry the CLI's
messages; Ctrl-C stops a run cleanly. Run by ctest (python_kvbudget) with
PYTHONPATH=<build>/python and KVB_BINARY=<build>/kvbudget."""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

import kvbudget
from kvbudget.torch_recorder import rope_rotate

SOURCE = Path(__file__).resolve().parents[2]
KVB = os.environ.get("KVB_BINARY", str(SOURCE / "build" / "kvbudget"))
RECORD = SOURCE / "data" / "records" / "gpt2-bytes-record.safetensors"
QUICKSTART = SOURCE / "configs" / "quickstart.toml"
SMALL = ["data.max_tokens=64", "strategy.0.vars.bits=[3, 4]"]


def without_column(path, column):
    """The CSV text of `path` without `column` (the per-point timing)."""
    rows = list(csv.reader(io.StringIO(Path(path).read_text())))
    if not rows or column not in rows[0]:
        return Path(path).read_text()
    i = rows[0].index(column)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([r[:i] + r[i + 1:] for r in rows])
    return out.getvalue()


def only_run(base):
    runs = [p for p in Path(base).glob("*/2*") if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


# ---------------------------------------------------------------------------
# formats and quantize
# ---------------------------------------------------------------------------

def test_formats_is_the_cli_table():
    table = kvbudget.formats()
    listing = subprocess.run([KVB, "formats"], capture_output=True, text=True, check=True).stdout
    assert {"name", "family", "canonical", "bpe", "cuda", "keys_only", "description"} <= set(table.columns)
    assert len(table) > 50
    for name in table["name"]:
        assert name in listing, name
    assert table.loc[table["name"] == "q4_0", "bpe"].item() == pytest.approx(4.5)
    # A span whose bits overflow int64 is refused, as by `kvbudget formats`.
    with pytest.raises(kvbudget.ConfigError, match="would overflow a 64-bit integer"):
        kvbudget.formats(head_dim=128, tokens=10**16)


def rope_of_rows(x, theta=10000.0):
    """RoPE of x's rows (the last axis) as one span: positions 0..rows-1, what quantize
    re-applies for pre_rope= (float32, x's shape)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    return rope_rotate(x.reshape(1, -1, d), inv_freq).reshape(x.shape)


def test_every_format_round_trips_through_quantize():
    rng = np.random.default_rng(7)
    pre = rng.standard_normal((2, 64, 64)).astype(np.float32)
    post = rope_of_rows(pre)  # the keys whose pre-RoPE keys are `pre` (one span of 128 rows)
    table = kvbudget.formats(head_dim=64, tokens=128)
    for row in table.itertuples():
        x, pre_rope = (post, pre) if row.canonical.startswith("prerope:") else (pre, None)
        q = kvbudget.quantize(x, row.name, rows_per_span=128, pre_rope=pre_rope)
        assert q.values.shape == x.shape and q.values.dtype == x.dtype, row.name
        assert np.isfinite(q.values).all(), row.name
        assert q.relative_mse < 2.0, (row.name, q.relative_mse)  # 1-bit min-max exceeds 1 on Gaussian data
        assert q.bpe == pytest.approx(q.storage_bits / x.size), row.name
        if not np.isnan(row.bpe):
            assert q.bpe == pytest.approx(row.bpe), row.name  # one span of 128 rows, as the table's
        assert q.codes.dtype == np.uint8 and q.codes.size == (q.code_bits + 7) // 8 > 0, row.name
        again = kvbudget.quantize(x, row.name, rows_per_span=128, pre_rope=pre_rope)
        assert np.array_equal(again.values, q.values) and np.array_equal(again.codes, q.codes), row.name


def test_quantize_refuses_pre_rope_keys_that_do_not_rotate_into_the_keys():
    rng = np.random.default_rng(5)
    pre = rng.standard_normal((1, 128, 64)).astype(np.float32)
    post = rope_of_rows(pre, theta=500000.0)
    q = kvbudget.quantize(post, "prerope:keep-fp32", pre_rope=pre, rope_theta=500000.0)
    assert q.relative_mse < 1e-10
    with pytest.raises(kvbudget.Error, match=r"RoPE \(theta 10000, positions 0..127\) .* relative L2 error"):
        kvbudget.quantize(post, "prerope:int8-asym-g32", pre_rope=pre)  # the default rope_theta
    with pytest.raises(kvbudget.Error, match=r"positions 0..63\) .*rows_per_span=64"):
        kvbudget.quantize(post, "prerope:int8-asym-g32", pre_rope=pre, rope_theta=500000.0, rows_per_span=64)
    # Values are not rotated: no check.
    kvbudget.quantize(post, "prerope:int8-asym-g32", kind="value", pre_rope=pre)


def test_quantize_keeps_dtype_and_matches_the_cli(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 32, 64))
    q64 = kvbudget.quantize(x, "q4_0")
    assert q64.values.dtype == np.float64 and q64.values.shape == x.shape
    q32 = kvbudget.quantize(x.astype(np.float32), "q4_0")
    assert np.array_equal(q64.values.astype(np.float32), q32.values)
    # The CLI on the same tensor: the same codes and the same numbers.
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    out = subprocess.run([KVB, "quantize", str(tmp_path / "x.npy"), "--format", "q4_0", "--json", "--codes",
                          str(tmp_path / "x.codes")], capture_output=True, text=True, check=True).stdout
    cli = json.loads(out)
    assert cli["bpe"] == q32.bpe and cli["storage_bits"] == q32.storage_bits
    assert cli["relative_mse"] == pytest.approx(q32.relative_mse, rel=1e-12)
    assert (tmp_path / "x.codes").read_bytes() == q32.codes.tobytes()


def test_float16_values_that_overflow_are_counted_and_reported():
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (8, 64)).astype(np.float16)
    x[::2, 0], x[1::2, 7] = 65504, -65504  # float16's largest: a block's scale times its code can pass it
    with pytest.warns(RuntimeWarning, match=r"dequantized values overflow float16 \(x's dtype\)"):
        q = kvbudget.quantize(x, "q8_0")
    overflowed = int((~np.isfinite(q.values)).sum())
    assert overflowed > 0 and q.nonfinite == overflowed
    assert q.relative_mse == np.inf and q.snr_db == -np.inf and q.max_abs_error == np.inf
    assert q.warnings == [f"{overflowed} of {x.size} dequantized values overflow float16 (x's dtype) and come back "
                          f"infinite; pass x as float32 to keep them"]
    q32 = kvbudget.quantize(x.astype(np.float32), "q8_0")  # as computed: finite, no warning
    assert q32.nonfinite == 0 and q32.warnings == [] and np.isfinite(q32.values).all()


def test_ggml_codes_as_blocks():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    q = kvbudget.quantize(x, "q8_0")
    blocks = q.blocks
    assert blocks.shape == (8, 2) and np.shares_memory(blocks, q.codes)
    # q8_0 dequantizes as d * qs: the stored scales and codes give the values back.
    d = blocks["d"].astype(np.float32)[..., None]
    assert np.array_equal((d * blocks["qs"].astype(np.float32)).reshape(8, 64), q.values)
    assert np.array_equal(q.scales, blocks["d"])
    assert kvbudget.quantize(x, "int4-asym-g32").blocks is None


def test_quantize_errors_carry_the_cli_messages():
    x = np.zeros((4, 64), np.float32)
    with pytest.raises(kvbudget.ConfigError, match="did you mean"):
        kvbudget.quantize(x, "q4_O")
    with pytest.raises(kvbudget.ConfigError, match="float array"):
        kvbudget.quantize(np.zeros((4, 64), np.int32), "q4_0")
    with pytest.raises(kvbudget.ConfigError, match="needs pre_rope as a float array .* got dtype int32"):
        kvbudget.quantize(x, "prerope:int8-asym-g32", pre_rope=np.zeros((4, 64), np.int32))
    with pytest.raises(kvbudget.ConfigError, match="stores keys only"):
        kvbudget.quantize(x, "qjl-m256", kind="value")


def test_quantize_refuses_a_preset_bad_pre_rope_and_rows_per_span():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 16, 64)).astype(np.float32)
    # A strategy preset given as a format: the CLI's hint, in Python's spelling.
    with pytest.raises(kvbudget.ConfigError, match="'kivi-2' is a strategy preset, not a format: quantize takes a "
                                                   "format .*strategy=\"kivi-2\""):
        kvbudget.quantize(x, "kivi-2")
    # pre_rope is checked finite as x is (a NaN gave relative_mse inf).
    pre_rope = x.copy()
    pre_rope[1, 3, 5] = np.nan
    with pytest.raises(kvbudget.Error, match="pre_rope\\[flat 1221\\] is not finite \\(nan\\)"):
        kvbudget.quantize(x, "prerope:int4-asym-g32", pre_rope=pre_rope)
    # rows_per_span >= 1 as `kvbudget quantize --rows-per-span` requires (-3 meant all rows).
    for bad in (-3, 0):
        with pytest.raises(kvbudget.ConfigError, match=f"rows_per_span must be >= 1 .*got {bad}"):
            kvbudget.quantize(x, "q4_0", rows_per_span=bad)
    cli = subprocess.run([KVB, "quantize", str(RECORD), "--tensor", "layers.0.key", "--format", "q4_0",
                          "--rows-per-span", "0"], capture_output=True, text=True)
    assert cli.returncode == 2 and "--rows-per-span must be >= 1" in cli.stderr
    assert kvbudget.quantize(x, "q4_0", rows_per_span=16).spans == 2
    assert kvbudget.quantize(x, "q4_0").spans == 1


def test_torch_dtypes_numpy_lacks_are_read_as_float32():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q = kvbudget.quantize(x, "q4_0")  # torch's TypeError before: NumPy has no bfloat16
    exact = x.float().numpy()  # bf16 -> fp32 is exact
    assert q.values.dtype == np.float32
    assert np.array_equal(q.values, kvbudget.quantize(exact, "q4_0").values)
    parts = {f"layers.0.{p}": torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
             for i, p in enumerate(("query", "key", "value"))}
    rec = kvbudget.recording_from_arrays(parts)
    assert np.array_equal(rec.layer(0)["key"], parts["layers.0.key"].float().numpy())


# ---------------------------------------------------------------------------
# run(): the CLI's results folder, DataFrames, budgets
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quickstart_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    cli_args = [KVB, "run", str(QUICKSTART), "--quiet", "--out", str(base / "cli")]
    for s in SMALL:
        cli_args += ["--set", s]
    subprocess.run(cli_args, check=True, capture_output=True)
    api = kvbudget.run(QUICKSTART, overrides=SMALL, out=base / "api", quiet=True)
    return only_run(base / "cli"), api


def test_run_writes_the_cli_results_byte_for_byte(quickstart_runs):
    cli_dir, api = quickstart_runs
    assert api.dir.parent.parent == cli_dir.parent.parent.parent / "api"
    assert api.manifest["status"] == "complete"
    assert without_column(api.dir / "points.csv", "seconds") == without_column(cli_dir / "points.csv", "seconds")
    for name in ("pareto.csv", "attribution.csv", "concentration.csv", "budgets.json"):
        assert (api.dir / name).read_bytes() == (cli_dir / name).read_bytes(), name
    assert (api.dir / "config.toml").read_text() == (cli_dir / "config.toml").read_text().replace(
        str(cli_dir.parent.parent), str(api.dir.parent.parent))
    for plot in ("attn_kl_mean.png", "topk_overlap.svg", "attn_out_rel_err.pdf", "attn_kl_mean.caption.txt"):
        assert (api.dir / "plots" / plot).stat().st_size > 0


def test_results_as_dataframes(quickstart_runs):
    _, api = quickstart_runs
    points = api.points
    assert len(points) == 8 and "strategy" in points.columns
    assert (points["strategy"] == "uniform").all()
    for frame in (api.pareto, api.attribution):
        assert len(frame) > 0 and "strategy" in frame.columns and frame["strategy"].notna().all()
    assert "Pareto frontier: attn_kl_mean" in api.frontier
    rivals = api.pareto["may_be_dominated_by"]  # point ids, as lists
    assert all(isinstance(r, list) and all(i in set(points["id"]) for i in r) for r in rivals)
    assert list(api.pareto["within_uncertainty"]) == [bool(r) for r in rivals]
    # However pandas read the cell: several ids, one id as a number, empty.
    assert [kvbudget._id_list(c) for c in ("3;14", 20.0, float("nan"))] == [[3, 14], [20], []]


def test_budget_answers_as_budgets_json(quickstart_runs):
    _, api = quickstart_runs
    for saved in api.budgets:  # the config's queries, answered by the run
        answer = api.budget(saved["query"])
        picked = [a for a in saved["answers"] if a["point"] is not None]
        assert list(answer["id"]) == [a["id"] for a in picked], saved["query"]
        assert list(answer["budget_metric"]) == [a["metric"] for a in picked], saved["query"]
    answer = api.budget("attn_kl_mean <= 1e-2")
    ok = api.points[api.points["attn_kl_mean"] <= 1e-2]
    assert len(answer) == 1 and answer["bpe"].item() == ok["bpe"].min()
    memory = api.budget("bpe <= 4")
    assert set(memory["budget_metric"]) == {"attn_kl_mean", "attn_out_rel_err", "topk_overlap"}
    assert (memory["bpe"] <= 4).all()
    assert len(api.budget("attn_kl_mean <= 1e-30")) == 0
    with pytest.raises(kvbudget.ConfigError):
        api.budget("attn_kl_mean < 1e-3")


def assert_budget_is_saved(result, saved):
    """result.budget(query) gives every field of budgets.json's answer `saved` to it: the
    picks, their memory and extrapolation on the memory column used, and their
    uncertainty (rivals as point ids)."""
    answer = result.budget(saved["query"])
    picked = [a for a in saved["answers"] if a["point"] is not None]
    assert len(answer) == len(picked), saved["query"]

    def ids(a, field):
        return None if field not in a else [p["id"] for p in a[field]]

    for (_, row), a in zip(answer.iterrows(), picked):
        where = f"{saved['query']} -> {a['metric']}"
        assert (row["id"], row["budget_metric"], row["key"]) == (a["id"], a["metric"], a["point"]), where
        assert (row["strategy"], row["label"]) == (a["strategy"], a["label"]), where
        for column in ("bpe", "bytes", "bpe_target", "bytes_target", "value"):
            assert row[column] == a[column], (where, column)
        interval = a["interval"] or [float("nan")] * 2
        assert np.array_equal([row["interval_lo"], row["interval_hi"]], interval, equal_nan=True), where
        assert row["memory"] == a["memory"], where
        assert isinstance(row["extrapolated"], (bool, np.bool_)) and row["extrapolated"] == a["extrapolated"], where
        assert row["extrapolation"] == a.get("extrapolation", ""), where
        assert row["meets_bound_for_certain"] == a.get("meets_bound_for_certain"), where
        assert row["cheaper_within_uncertainty"] == ids(a, "cheaper_within_uncertainty"), where
        assert row["least_memory_for_certain"] == (a.get("least_memory_for_certain") or {}).get("id"), where
        assert row["indistinguishable"] == ids(a, "indistinguishable"), where


def test_budget_gives_the_uncertainty_budgets_json_gives(quickstart_runs):
    _, api = quickstart_runs
    for saved in api.budgets:  # the config's queries
        assert_budget_is_saved(api, saved)
    memory_budget = api.budget("bpe <= 4.5")  # the one of them SMALL's points meet
    assert sum(len(ids) for ids in memory_budget["indistinguishable"]) > 0
    for field in ("meets_bound_for_certain", "cheaper_within_uncertainty", "least_memory_for_certain"):
        assert memory_budget[field].isna().all(), field  # an error budget's


def test_budget_from_a_folder_whose_data_moved_gives_the_picks(quickstart_runs, tmp_path):
    # Results copied elsewhere: config.toml's data.path no longer resolves. budget()
    # still answers from points.csv, with a warning, as budgets.json picked.
    _, api = quickstart_runs
    import shutil
    copy = tmp_path / "copied"
    shutil.copytree(api.dir, copy)
    config = (copy / "config.toml").read_text()
    (copy / "config.toml").write_text(config.replace("gpt2-bytes-record.safetensors", "moved-away.safetensors"))
    saved = api.budgets[0]
    with pytest.warns(RuntimeWarning, match="cannot be read here"):
        answer = kvbudget.open_results(copy).budget(saved["query"])
    assert list(answer["id"]) == [a["id"] for a in saved["answers"] if a["point"] is not None]


# Queries the quickstart config does not ask, each leaving something open on SMALL's
# points: an error budget met by its pick's interval or not, with cheaper rivals within
# uncertainty, and memory budgets whose picks others cannot be told from.
OTHER_QUERIES = ["attn_kl_mean <= 1e-2", "attn_out_rel_err <= 0.1", "topk_overlap >= 0.9", "bpe <= 4",
                 "bytes <= 1e9"]


def test_budget_answers_a_query_the_run_did_not_ask_as_the_cli_would(tmp_path, quickstart_runs):
    _, api = quickstart_runs
    asked = {saved["query"] for saved in api.budgets}
    assert not asked & set(OTHER_QUERIES)
    # The same sweep with the queries asked: the same points and intervals (the seed).
    args = [KVB, "run", str(QUICKSTART), "--quiet", "--no-plots", "--out", str(tmp_path)]
    for s in SMALL:
        args += ["--set", s]
    for q in OTHER_QUERIES:
        args += ["--budget", q]
    subprocess.run(args, check=True, capture_output=True)
    saved_answers = [saved for saved in kvbudget.open_results(only_run(tmp_path)).budgets
                     if saved["query"] in OTHER_QUERIES]
    assert len(saved_answers) == len(OTHER_QUERIES)
    for saved in saved_answers:
        assert_budget_is_saved(api, saved)
    given = {field for saved in saved_answers for a in saved["answers"] for field, value in a.items() if value}
    assert {"cheaper_within_uncertainty", "least_memory_for_certain", "indistinguishable"} <= given
    with pytest.raises(kvbudget.ConfigError, match="did not measure ppl_ratio"):
        api.budget("ppl_ratio <= 1.1")


def test_budget_marks_extrapolation_on_the_memory_column_the_query_used(tmp_path):
    # KIVI-2 on 64 tokens: all of its cache is in the fp16 window, so bpe_target (at
    # 32768 tokens) is extrapolated (points.csv: target_context) and bpe is not.
    config = {**TINY, "strategy": [{"type": "uniform", "format": "int{bits}-asym-g32", "vars": {"bits": [2, 4, 8]}},
                                   {"preset": "kivi-2"}],
              "output": {"x": "bpe_target"}}
    queries = ["bpe <= 16", "bpe_target <= 4", "attn_kl_mean <= 1"]
    r = kvbudget.run(config, budgets=queries, out=tmp_path, plots=False, quiet=True)
    kivi = r.points.loc[r.points["strategy"] == "kivi-2", "id"].item()
    assert r.points.loc[r.points["id"] == kivi, "extrapolated"].item() == "target_context"
    for saved in r.budgets:
        assert_budget_is_saved(r, saved)
    on_bpe = r.budget("bpe <= 16")
    assert list(on_bpe["id"]) == [kivi] and not on_bpe["extrapolated"].any() and (on_bpe["memory"] == "bpe").all()
    on_target = r.budget("bpe_target <= 4")
    assert kivi in set(on_target["id"]) and on_target.loc[on_target["id"] == kivi, "extrapolated"].all()
    assert "target_context" in on_target.loc[on_target["id"] == kivi, "extrapolation"].iloc[0]


def test_open_results_refuses_a_folder_without_manifest(tmp_path, quickstart_runs):
    _, api = quickstart_runs
    assert kvbudget.open_results(api.dir).manifest["status"] == "complete"
    assert kvbudget.open_results(api.dir.parent / "latest").points.equals(api.points)
    # The folder above the timestamped runs: names them and says which to give.
    with pytest.raises(kvbudget.ConfigError, match=f"'{api.dir.parent}' has no manifest.json: not a results folder; "
                                                   f"it holds the runs .*{api.dir.name}.*: give "
                                                   f"{api.dir.parent / 'latest'}"):
        kvbudget.open_results(api.dir.parent)
    # The --out base above it: names the experiments it holds.
    with pytest.raises(kvbudget.ConfigError, match=f"results of quickstart: give one run, e.g. "
                                                   f"{api.dir.parent / 'latest'}"):
        kvbudget.open_results(api.dir.parent.parent)
    with pytest.raises(kvbudget.ConfigError, match=f"'{tmp_path / 'nowhere'}' does not exist"):
        kvbudget.open_results(tmp_path / "nowhere")
    with pytest.raises(kvbudget.ConfigError, match="has no manifest.json: not a results folder$"):
        kvbudget.open_results(tmp_path)


def write_results_folder(folder, points_csv, manifest=None, config_toml='name = "model"\n'):
    """A results folder as the runner writes one: manifest.json, config.toml, points.csv."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest or {"status": "complete"}))
    (folder / "config.toml").write_text(config_toml)
    (folder / "points.csv").write_text(points_csv)
    return folder


# A model run measured at one position: its standard errors and the NLL correlation are
# NaN, which the runner writes as "nan".
NAN_POINTS = """id,strategy,type,key,label,plan,bpe,bpe_target,bytes,bytes_target,compression,extrapolated,\
ppl_ratio,ppl_ratio_se,ln_ppl_correlation,seconds
0,uniform,uniform,uniform(format=q4_0),uniform(format=q4_0),K:q4_0 V:q4_0,4.5,4.5,100,1000,3.5,no,1.5,nan,nan,0.1
1,uniform,uniform,uniform(format=q8_0),uniform(format=q8_0),K:q8_0 V:q8_0,8.5,8.5,200,2000,1.9,no,1.01,-nan,0.9,0.1
"""


def test_a_nan_cell_leaves_a_metric_column_numbers(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    r = kvbudget.open_results(write_results_folder(tmp_path / "run", NAN_POINTS,
                                                   config_toml='name = "model"\n[metrics]\npareto = ["ppl_ratio"]\n'))
    points = r.points
    for column in ("ppl_ratio_se", "ln_ppl_correlation"):
        assert points[column].dtype == np.float64, column
    assert np.isnan(points["ppl_ratio_se"]).all() and points["ln_ppl_correlation"][1] == 0.9
    assert points["extrapolated"].tolist() == ["no", "no"]  # text columns stay text
    assert points["ln_ppl_correlation"].mean() == 0.9
    # No results.jsonl: the picks from points.csv, without their uncertainty.
    with pytest.warns(RuntimeWarning, match="no results.jsonl .* without their uncertainty"):
        answer = r.budget("ln_ppl_correlation >= 0.5")
    assert list(answer["id"]) == [1] and answer["extrapolated"].tolist() == [False]
    assert answer["meets_bound_for_certain"].tolist() == [None] and np.isnan(answer["interval_lo"]).all()
    assert r.plot("ppl_ratio").get_ylabel().startswith("perplexity ratio")


TINY = {"name": "tiny", "seed": 0, "data": {"path": str(RECORD), "max_tokens": 64, "layers": [0]},
        "strategy": [{"type": "uniform", "format": "int4-asym-g32"}],
        "metrics": {"pareto": ["attn_kl_mean"]}}


def test_budget_and_plot_use_the_default_pareto_metrics(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    config = {k: v for k, v in TINY.items() if k != "metrics"}  # metrics.pareto left at its default
    r = kvbudget.run(config, budgets="bpe <= 8", out=tmp_path, plots=False, quiet=True)
    assert r.manifest["pareto_metrics"] == ["attn_kl_mean", "attn_out_rel_err"]
    assert r.manifest["memory_axis"] == "bpe" and r.manifest["target_context"] == 32768
    saved = r.budgets[0]
    assert [a["metric"] for a in saved["answers"]] == ["attn_kl_mean", "attn_out_rel_err"]

    def answers(result):
        answer = result.budget("bpe <= 8")
        return list(zip(answer["budget_metric"], answer["id"]))

    expected = [(a["metric"], a["id"]) for a in saved["answers"]]
    assert answers(r) == expected
    assert r.plot().get_ylabel().startswith("attention KL, mean")
    # A folder written before the manifest held the resolved settings: the runner's default.
    manifest = r.manifest
    for key in ("pareto_metrics", "memory_axis", "target_context"):
        del manifest[key]
    (r.dir / "manifest.json").write_text(json.dumps(manifest))
    assert answers(kvbudget.open_results(r.dir)) == expected
    model = kvbudget.open_results(write_results_folder(tmp_path / "model", NAN_POINTS))  # a model run's points
    assert model.plot().get_ylabel().startswith("perplexity ratio")


def test_one_override_or_budget_as_a_str(tmp_path):
    r = kvbudget.run(TINY, overrides="data.max_tokens=32", budgets="bpe <= 8", out=tmp_path, plots=False, quiet=True)
    assert r.config["data"]["max_tokens"] == 32
    assert [b["query"] for b in r.budgets] == ["bpe <= 8"]
    with pytest.raises(TypeError, match="overrides must be a str or a list of str, got int"):
        kvbudget.run(TINY, overrides=3, out=tmp_path)


def test_dict_configs_take_numpy_scalars_and_paths():
    config = {"name": "np", "seed": np.int64(3), "data": {"path": Path("/data/r.safetensors"),
                                                          "max_tokens": np.int32(64)},
              "strategy": [{"type": "uniform", "format": "int{bits}-asym-g32", "vars": {"bits": np.arange(2, 5)}}],
              "metrics": {"topk": np.uint8(8), "weight": np.float32(0.5), "flag": np.bool_(True)}}
    parsed = tomllib.loads(kvbudget._toml.dumps(config))
    assert parsed["seed"] == 3 and parsed["data"] == {"path": "/data/r.safetensors", "max_tokens": 64}
    assert parsed["strategy"][0]["vars"]["bits"] == [2, 3, 4]
    assert parsed["metrics"] == {"topk": 8, "weight": 0.5, "flag": True}
    with pytest.raises(TypeError, match="config x: a object has no TOML form"):
        kvbudget._toml.dumps({"x": object()})


def test_dict_configs_take_any_unicode_text(tmp_path):
    text = "\U0001d6fc=0.5 \u00e9 \"q\" \\ \t\n\x7f\x00 \U0001f600"  # beyond U+FFFF, quotes, controls
    assert tomllib.loads(kvbudget._toml.dumps({"name": text, "\u03b1 key": 1, "k": [text]})) == {
        "name": text, "\u03b1 key": 1, "k": [text]}
    config = {**TINY, "strategy": [{"type": "uniform", "format": "int4-asym-g32", "name": "\U0001d6fc=0.5"}]}
    r = kvbudget.run(config, out=tmp_path, plots=False, quiet=True)
    assert r.points["strategy"].tolist() == ["\U0001d6fc=0.5"]


def test_one_run_at_a_time_per_process(tmp_path):
    # A run in progress in another thread: a second run() is refused at once, before
    # anything is written (it failed deep in the runner, leaving an empty folder).
    started, release = threading.Event(), threading.Event()
    outcome = {}

    def hold_the_run_lock():  # what a run in progress does
        with kvbudget._run_lock:
            started.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_run_lock)
    holder.start()
    started.wait(60)
    try:
        with pytest.raises(kvbudget.Error, match="one kvbudget.run at a time per process: use processes, or shard="):
            kvbudget.run(TINY, out=tmp_path / "second", plots=False, quiet=True)
        assert not (tmp_path / "second").exists()
    finally:
        release.set()
        holder.join()
    # Two real runs from two threads: one finishes, the other is refused or runs after it.
    def run_in_thread(key):
        try:
            outcome[key] = kvbudget.run(TINY, overrides=SMALL[:1], out=tmp_path / key, plots=False, quiet=True)
        except kvbudget.Error as e:
            outcome[key] = e
    threads = [threading.Thread(target=run_in_thread, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, got in outcome.items():
        if isinstance(got, Exception):
            assert "one kvbudget.run at a time" in str(got) and not (tmp_path / key).exists()
        else:
            assert got.manifest["status"] == "complete"
    assert any(not isinstance(got, Exception) for got in outcome.values())
    kvbudget.run(TINY, out=tmp_path / "after", plots=False, quiet=True)  # the lock is free again


def test_bundled_configs_and_data_are_found_from_any_directory(tmp_path, monkeypatch):
    # A notebook copied anywhere: relative configs and data paths fall back to the source tree.
    monkeypatch.chdir(tmp_path)
    assert kvbudget.source_dir().resolve() == SOURCE
    assert kvbudget.data_path("configs/quickstart.toml").resolve() == QUICKSTART
    assert kvbudget.data_path("data", "records").resolve() == SOURCE / "data" / "records"
    with pytest.raises(kvbudget.ConfigError, match="not found \\(looked in .*nowhere.npz"):
        kvbudget.data_path("data/nowhere.npz")
    (tmp_path / "configs").mkdir()  # the working directory comes first
    (tmp_path / "configs" / "quickstart.toml").write_text("mine")
    assert kvbudget.data_path("configs/quickstart.toml") == Path("configs/quickstart.toml")
    (tmp_path / "configs" / "quickstart.toml").unlink()
    r = kvbudget.run("configs/quickstart.toml", overrides=SMALL, out=tmp_path / "r", plots=False, quiet=True)
    assert len(r.points) == 8 and r.manifest["status"] == "complete"
    rec = kvbudget.load_recording(RECORD.relative_to(SOURCE), max_tokens=16)
    assert rec.tokens == 16
    with pytest.raises(kvbudget.ConfigError, match="config file 'configs/nothing.toml' not found"):
        kvbudget.run("configs/nothing.toml")
    # Without .toml: a missing file (not a TOML syntax error), and which file exists.
    with pytest.raises(kvbudget.ConfigError, match="config file 'configs/quickstart' not found .*; did you mean "
                                                   "'configs/quickstart.toml'\\?"):
        kvbudget.run("configs/quickstart")
    with pytest.raises(kvbudget.ConfigError, match="config file 'configs/nothing' not found \\(looked in [^;]*$"):
        kvbudget.run("configs/nothing")


def test_publish_drops_the_timing_column_and_repeats_byte_for_byte(tmp_path, quickstart_runs):
    cli_dir, api = quickstart_runs
    dest = tmp_path / "published" / "quick"
    written = kvbudget.publish(api, dest, ["points.csv", "attribution.csv"], prefix="q_")
    assert written == [dest / "q_points.csv", dest / "q_attribution.csv"]
    points = (dest / "q_points.csv").read_text()
    assert "seconds" not in points.splitlines()[0]
    assert points == without_column(cli_dir / "points.csv", "seconds")  # the CLI's numbers, every other cell as written
    assert (dest / "q_attribution.csv").read_text() == (api.dir / "attribution.csv").read_text()
    first = {p.name: p.read_bytes() for p in dest.iterdir()}
    kvbudget.publish(cli_dir, dest, ["points.csv", "attribution.csv"], prefix="q_")  # another run, the same numbers
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == first
    with pytest.raises(FileNotFoundError, match="missing.csv does not exist"):
        kvbudget.publish(api, dest, ["points.csv", "missing.csv"], prefix="x_")
    assert (dest / "x_points.csv").exists()  # the files before the missing one are kept

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    path = kvbudget.save_figure(fig, dest / "figs", "line.png")
    plt.close(fig)
    assert path == dest / "figs" / "line.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_publish_marks_a_run_that_did_not_complete(tmp_path):
    run = write_results_folder(tmp_path / "run", NAN_POINTS, {"status": "interrupted", "points_total": 28})
    dest = tmp_path / "published"
    with pytest.warns(UserWarning, match=r"status is 'interrupted': 2 of 28 points measured, 0 failed"):
        written = kvbudget.publish(run, dest, ["points.csv"], prefix="m_")
    assert written == [dest / "m_run_status.txt", dest / "m_points.csv"]
    note = (dest / "m_run_status.txt").read_text()
    assert note.startswith(f"published from {run}, a run that did not complete: its status is 'interrupted'")
    # The same folder once complete: no note left behind.
    (run / "manifest.json").write_text(json.dumps({"status": "complete", "points_total": 2}))
    assert kvbudget.publish(run, dest, ["points.csv"], prefix="m_") == [dest / "m_points.csv"]
    assert not (dest / "m_run_status.txt").exists()
    (run / "manifest.json").write_text(json.dumps({"status": "complete", "points_total": 2,
                                                   "shard": {"index": 1, "count": 4}, "sweep_points_total": 8}))
    with pytest.warns(UserWarning, match=r"it is shard 2 of 4 of a sweep of 8 points"):
        kvbudget.publish(run, dest, ["points.csv"], prefix="m_")


def test_plot(quickstart_runs):
    import matplotlib

    matplotlib.use("Agg")
    _, api = quickstart_runs
    ax = api.plot("attn_kl_mean")
    # Named as the CLI's plots name it: the metric table's quantity, unit and direction.
    assert ax.get_ylabel() == "attention KL, mean (nats, lower is better)"
    assert ax.get_xlabel() == "bits per element"
    # One curve per strategy (one here), then the frontier, each with its own style.
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["uniform", "Pareto frontier, all strategies"], labels
    # Error bars from the points' intervals (a vertical segment per point).
    assert len(ax.collections) == 1 and len(ax.collections[0].get_segments()) == len(api.points)
    # The frontier is the Pareto front of the x drawn, not pareto.csv's (on output.x).
    target = api.plot("attn_kl_mean", x="bytes_target")
    assert target.get_xlabel() == "cache size (bytes) at 32768 tokens"
    front = [line for line in target.get_lines() if line.get_label() == "Pareto frontier, all strategies"][0]
    xs, ys = front.get_xdata(), front.get_ydata()
    assert all(a < b for a, b in zip(xs, xs[1:])) and all(a > b for a, b in zip(ys, ys[1:])), (xs, ys)
    pts = api.points
    for cost, value in zip(xs, ys):  # nothing cheaper on bytes_target does as well
        assert not ((pts["bytes_target"] < cost) & (pts["attn_kl_mean"] <= value)).any(), (cost, value)
    with pytest.raises(kvbudget.ConfigError, match="not a memory column"):
        api.plot("attn_kl_mean", x="compression")


def test_config_as_toml_string_and_dict(tmp_path, quickstart_runs):
    cli_dir, _ = quickstart_runs
    config = {
        "name": "quickstart",
        "seed": 0,
        "data": {"path": str(RECORD), "max_tokens": 64},
        "strategy": [{"type": "uniform", "format": "int{bits}-{mode}-g{group}",
                      "vars": {"bits": [3, 4], "mode": ["sym", "asym"], "group": [32, 64]}}],
        "metrics": {"pareto": ["attn_kl_mean", "attn_out_rel_err", "topk_overlap"], "topk": 8},
        "output": {"target_context": 32768, "series": "mode", "marker": "group"},
        "budgets": {"queries": ["attn_kl_mean <= 1e-3", "attn_out_rel_err <= 0.05", "bpe <= 4.5"]},
    }
    from_dict = kvbudget.run(config, out=tmp_path / "dict", plots=False, quiet=True)
    text = QUICKSTART.read_text()
    from_text = kvbudget.run(text, overrides=SMALL, out=tmp_path / "text", plots=False, quiet=True)
    expected = without_column(cli_dir / "points.csv", "seconds")
    assert without_column(from_dict.dir / "points.csv", "seconds") == expected
    assert without_column(from_text.dir / "points.csv", "seconds") == expected


def test_run_errors_carry_the_cli_messages(tmp_path):
    typo = tmp_path / "typo.toml"
    typo.write_text(f'name = "typo"\n[data]\npath = "{RECORD}"\nmax_tokns = 64\n'
                    '[[strategy]]\ntype = "uniform"\nformat = "int4-asym-g32"\n')
    cli = subprocess.run([KVB, "run", str(typo), "--out", str(tmp_path / "r")], capture_output=True, text=True)
    assert cli.returncode == 2
    with pytest.raises(kvbudget.ConfigError) as e:
        kvbudget.run(typo, out=tmp_path / "r")
    assert f"kvbudget run: error: {e.value}" in cli.stderr
    assert "unknown key 'data.max_tokns' (did you mean 'max_tokens'?)" in str(e.value)
    assert not (tmp_path / "r").exists()
    # Points that cannot run on the data (group 48 vs head_dim 64): refused after the
    # load, before the sweep, nothing written (README "Command line conventions").
    with pytest.raises(kvbudget.ConfigError, match="4 of 8 points cannot run on this data"):
        kvbudget.run(QUICKSTART, overrides=SMALL + ["strategy.0.vars.group=[32, 48]"], out=tmp_path / "f",
                     plots=False, quiet=True)
    assert not list((tmp_path / "f").glob("*/2*"))
    # precision = "tf32" is the CUDA backend's fast mode: refused on the CPU backend, as
    # `kvbudget run --precision tf32` refuses it.
    cli = subprocess.run([KVB, "run", str(QUICKSTART), "--precision", "tf32", "--out", str(tmp_path / "p")],
                         capture_output=True, text=True)
    assert cli.returncode == 2
    assert 'precision = "tf32" is the CUDA backend' in cli.stderr
    with pytest.raises(kvbudget.ConfigError, match='precision = "tf32" is the CUDA backend'):
        kvbudget.run(QUICKSTART, precision="tf32", out=tmp_path / "p")
    with pytest.raises(kvbudget.ConfigError, match='precision must be "fp32" or "tf32", got "fp16"'):
        kvbudget.run(QUICKSTART, backend="auto", precision="fp16", out=tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_points_a_full_disk_lost_are_in_the_result(tmp_path, monkeypatch):
    """points.csv not written (a full disk): the rows the runner kept (lost_points_csv,
    which the CLI prints) are error.result.points."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"status": "failed"}))
    outcome = {"dir": str(folder), "status": "failed", "points": 2, "measured": 2, "failed": 0, "interrupted": False,
               "signal": 0, "run_errors": ["points.csv / errors.csv: No space left on device"], "point_errors": [],
               "plot_error": "", "plots_written": False, "frontier": "", "wall_seconds": 1.0,
               "lost_points_csv": NAN_POINTS}
    monkeypatch.setattr(kvbudget._core, "run", lambda *args: outcome)
    with pytest.raises(kvbudget.Error, match="No space left on device\nthe rows points.csv should hold are in "
                                             "error.result.points") as e:
        kvbudget.run(TINY, out=tmp_path)
    points = e.value.result.points
    assert points["id"].tolist() == [0, 1] and points["ppl_ratio"].tolist() == [1.5, 1.01]


def test_ctrl_c_stops_a_run_cleanly(tmp_path):
    script = (f"import kvbudget\n"
              f"try:\n"
              f"    kvbudget.run({str(QUICKSTART)!r}, overrides=['strategy.0.vars.group=[8, 16, 32, 64]'],\n"
              f"                 out={str(tmp_path / 'r')!r}, plots=False, threads=1, quiet=True)\n"
              f"except KeyboardInterrupt as e:\n"
              f"    print('KeyboardInterrupt:', e)\n"
              f"    print('result:', e.result.manifest['status'])\n"
              f"    raise SystemExit(130)\n")
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    deadline = time.time() + 120
    manifest = None
    while time.time() < deadline and proc.poll() is None:
        found = list((tmp_path / "r").glob("quickstart/2*/manifest.json"))
        if found:
            manifest = found[0]
            break
        time.sleep(0.2)
    assert manifest is not None, proc.communicate()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "KeyboardInterrupt: kvbudget.run interrupted" in out and "result: interrupted" in out
    state = json.loads(manifest.read_text())
    assert state["status"] == "interrupted"
    finished = len(Path(manifest.parent / "points.csv").read_text().splitlines()) - 1
    assert 0 <= finished < 56


def run_and_signal(out, sig, prelude=""):
    """A quickstart run() in a child process (`prelude` before it), sent `sig` once its
    manifest exists: (returncode, stdout, stderr, manifest path)."""
    script = (f"import kvbudget, signal, sys\n{prelude}"
              f"kvbudget.run({str(QUICKSTART)!r}, overrides=['strategy.0.vars.group=[8, 16, 32, 64]'],\n"
              f"             out={str(out)!r}, plots=False, threads=1, quiet=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    manifest = None
    while manifest is None and time.time() < deadline and proc.poll() is None:
        found = list(Path(out).glob("quickstart/2*/manifest.json"))
        if found:
            manifest = found[0]
        else:
            time.sleep(0.2)
    assert manifest is not None, proc.communicate()
    time.sleep(1.0)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr, manifest


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_run_cleanly_then_take_their_course(tmp_path, sig):
    # By default: the finished points written, then the process ends as killed by the signal.
    rc, out, err, manifest = run_and_signal(tmp_path / "default", sig)
    assert rc == -sig, (out, err)
    assert json.loads(manifest.read_text())["status"] == "interrupted"
    assert (manifest.parent / "points.csv").read_text().startswith("id,")
    # A Python handler of the signal runs once the files are written; its exception propagates.
    rc, out, err, manifest = run_and_signal(tmp_path / "handled", sig,
                                            f"signal.signal({int(sig)}, lambda s, f: sys.exit(7))\n")
    assert rc == 7, (out, err)
    assert json.loads(manifest.read_text())["status"] == "interrupted"


# ---------------------------------------------------------------------------
# Recordings
# ---------------------------------------------------------------------------

def test_load_recording_and_arrays(tmp_path):
    rec = kvbudget.load_recording(RECORD, max_tokens=32)
    assert (rec.num_layers, rec.q_heads, rec.head_dim, rec.tokens) == (6, 6, 64, 32)
    layer = rec.layer(0)
    assert layer["key"].shape == (6, 32, 64) and layer["key"].dtype == np.float32
    assert not layer["key"].flags.writeable
    # The same tensors as arrays, one dict per layer, in another layout.
    layers = [{part: np.ascontiguousarray(rec.layer(i)[part].transpose(1, 0, 2)) for part in ("query", "key", "value")}
              for i in range(rec.num_layers)]
    again = kvbudget.recording_from_arrays(layers, layout="tokens,heads,head_dim")
    for i in range(rec.num_layers):
        for part in ("query", "key", "value"):
            assert np.array_equal(again.layer(i)[part], rec.layer(i)[part])
    # Anything with __dlpack__ (a torch tensor, say) is read through DLPack.
    class DLPackOnly:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, stream=None):
            return self._a.__dlpack__()

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    one = kvbudget.recording_from_arrays({f"layers.0.{p}": DLPackOnly(rec.layer(0)[p].copy())
                                          for p in ("query", "key", "value")})
    assert np.array_equal(one.layer(0)["key"], rec.layer(0)["key"])
    assert np.array_equal(kvbudget.quantize(DLPackOnly(layer["key"].copy()), "q4_0").values,
                          kvbudget.quantize(layer["key"], "q4_0").values)
    rec.save(tmp_path / "saved.safetensors")
    saved = kvbudget.load_recording(tmp_path / "saved.safetensors")
    assert np.array_equal(saved.layer(5)["value"], rec.layer(5)["value"])
    bad = {"layers.0.query": np.zeros((2, 8, 4)), "layers.0.key": np.zeros((2, 8, 4)),
           "layers.0.value": np.full((2, 8, 4), np.nan)}
    with pytest.raises(kvbudget.Error, match="NaN") as e:
        kvbudget.recording_from_arrays(bad)
    # The loader's messages name recording_from_arrays, not the temporary file it read.
    assert "recording_from_arrays" in str(e.value) and "kvbudget-" not in str(e.value)
    assert one.source == "recording_from_arrays"
    with pytest.raises(kvbudget.Error):
        kvbudget.load_recording(tmp_path / "missing.safetensors")
    # A recording is written as .safetensors (the bytes are safetensors whatever the name).
    with pytest.raises(kvbudget.ConfigError, match="x.npz: a recording is written as .safetensors"):
        rec.save(tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()


def test_recording_from_arrays_names():
    parts = {f"layers.0.{p}": np.ones((2, 8, 4), np.float32) for p in ("query", "key", "value")}
    # A misspelled name was dropped silently (no key_pre_rope in the recording).
    with pytest.raises(kvbudget.ConfigError, match="tensor name 'layers.0.key_prerope' is not one the recording "
                                                   "loader reads; accepted: layers.<i>.query, .*input_ids"):
        kvbudget.recording_from_arrays({**parts, "layers.0.key_prerope": np.ones((2, 8, 4))})
    with pytest.raises(kvbudget.ConfigError, match="layer 0 has a tensor 'keys'; expected query, key, value"):
        kvbudget.recording_from_arrays([{"query": parts["layers.0.query"], "keys": parts["layers.0.key"]}])
    # input_ids, as the docstring lists them: the recording's token ids.
    rec = kvbudget.recording_from_arrays({**parts, "input_ids": np.arange(8)})
    assert rec.token_ids == list(range(8))
    with pytest.raises(kvbudget.ConfigError, match="input_ids has dtype float64"):
        kvbudget.recording_from_arrays({**parts, "input_ids": np.arange(8.0)})
    with pytest.raises(kvbudget.Error, match="recording_from_arrays: token ids tensor 'input_ids' has shape \\[7\\]"):
        kvbudget.recording_from_arrays({**parts, "input_ids": np.arange(7)})


def test_recording_from_arrays_name_is_no_file_name(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the arrays' file goes
    (tmp_path / "tmp").mkdir()
    parts = {f"layers.0.{p}": np.ones((2, 8, 4), np.float32) for p in ("query", "key", "value")}
    for name in ("../escaped", "a/b", "x" * 300):
        rec = kvbudget.recording_from_arrays(parts, name=name)
        assert rec.name == name and rec.source == "recording_from_arrays"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["tmp"]  # nothing written beside or left behind


def test_negative_max_tokens_is_refused():
    with pytest.raises(kvbudget.ConfigError, match=r"^load_recording: max_tokens must be >= 0 \(0 keeps every "
                                                   r"token\), got -3$"):
        kvbudget.load_recording(RECORD, max_tokens=-3)
    parts = {f"layers.0.{p}": np.ones((2, 8, 4), np.float32) for p in ("query", "key", "value")}
    with pytest.raises(kvbudget.ConfigError, match=r"^recording_from_arrays: max_tokens must be >= 0"):
        kvbudget.recording_from_arrays(parts, max_tokens=-1)


# ---------------------------------------------------------------------------
# Models: record and evaluate, as the CLI
# ---------------------------------------------------------------------------

GPT2 = SOURCE / "data" / "models" / "gpt2-bytes"
LLAMA = SOURCE / "data" / "models" / "llama-bytes"
TEXT = SOURCE / "data" / "text" / "eval_kjv_revelation.txt"


def test_record_equals_the_cli(tmp_path):
    subprocess.run([KVB, "record", str(GPT2), "--text", str(TEXT), "--max-tokens", "64", "--dtype", "f32", "--out",
                    str(tmp_path / "cli.safetensors")], check=True, capture_output=True)
    cli = kvbudget.load_recording(tmp_path / "cli.safetensors")
    rec = kvbudget.record(GPT2, text=TEXT, max_tokens=64)
    assert (rec.num_layers, rec.tokens) == (cli.num_layers, 64)
    assert rec.token_ids == cli.token_ids
    for i in range(rec.num_layers):
        for part in ("query", "key", "value", "attn_output"):
            assert np.array_equal(rec.layer(i)[part], cli.layer(i)[part]), (i, part)
    assert float(rec.metadata["nll_mean"]) > 0
    with pytest.raises(kvbudget.ConfigError, match="exactly one of text and tokens"):
        kvbudget.record(GPT2)


def test_evaluate_in_windows_equals_the_cli():
    """ctx windows (and llama.cpp's second_half scoring) as `kvbudget eval --ctx` runs them."""
    out = subprocess.run([KVB, "eval", str(LLAMA), "--text", str(TEXT), "--max-tokens", "96", "--ctx", "32",
                          "--score", "second_half", "--format", "int4-asym-g32", "--json"],
                         check=True, capture_output=True, text=True).stdout
    cli = json.loads(out)
    r = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, ctx=32, score="second_half", format="int4-asym-g32")
    assert r["windows"] == cli["windows"] == 3
    assert len(r["nll"]) == len(r["exact_nll"]) == cli["positions"] == 3 * 15  # positions 16..30 of each window
    assert r["metrics"]["ppl"] == pytest.approx(cli["ppl"], rel=1e-6)
    assert r["metrics"]["next_token_kl_mean"] == pytest.approx(cli["kl_mean"], rel=1e-6)
    assert r["metrics"]["same_top_rate"] == pytest.approx(cli["same_top"], rel=1e-6)
    one = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, ctx=0, format="int4-asym-g32")
    assert one["windows"] == 1 and len(one["nll"]) == 95
    with pytest.raises(kvbudget.ConfigError, match="ctx"):
        kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, ctx=1)
    with pytest.raises(kvbudget.ConfigError):
        kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, score="half")


def test_evaluate_with_the_exact_logits_in_a_file_gives_the_same_metrics():
    """base_memory_mib=0 (`eval --base-memory 0`): the exact logits kept in a temporary file and
    read back a window at a time, neither [T, vocab] returned, the same metrics bit for bit."""
    held = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, ctx=32, format="int4-asym-g32")
    spilled = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, ctx=32, format="int4-asym-g32", base_memory_mib=0)
    assert held["exact_logits"] is not None and held["logits"] is not None
    assert spilled["exact_logits"] is None and spilled["logits"] is None
    assert spilled["metrics"].keys() == held["metrics"].keys()
    for name, value in held["metrics"].items():  # NaN where a metric has no data (no task here)
        assert spilled["metrics"][name] == value or (np.isnan(value) and np.isnan(spilled["metrics"][name])), name
    assert np.array_equal(spilled["nll"], held["nll"]) and np.array_equal(spilled["exact_nll"], held["exact_nll"])
    with pytest.raises(kvbudget.ConfigError, match="base_memory_mib"):
        kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, base_memory_mib=-1)


def write_hybrid_checkpoint(out, window, seed=7, vocab=23, tokens=48):
    """A tiny random-weight Ministral checkpoint, layers sliding, full, sliding over
    `window` tokens (F32 safetensors), and a file of `tokens` token ids beside it."""
    out.mkdir(parents=True)
    L, H, heads, kv, d, inter = 3, 32, 4, 2, 8, 48
    config = {"architectures": ["MinistralForCausalLM"], "hidden_size": H, "num_hidden_layers": L,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d, "intermediate_size": inter,
              "vocab_size": vocab, "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 10000.0,
              "sliding_window": window, "max_position_embeddings": 256, "bos_token_id": 0,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    (out / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    tensors = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, H)), "model.norm.weight": 1 + rng.normal(0, .1, H),
               "lm_head.weight": rng.normal(0, .3, (vocab, H))}
    for l in range(L):
        b = f"model.layers.{l}."
        for name, shape in [("input_layernorm", None), ("post_attention_layernorm", None),
                            ("self_attn.q_proj", (heads * d, H)), ("self_attn.k_proj", (kv * d, H)),
                            ("self_attn.v_proj", (kv * d, H)), ("self_attn.o_proj", (H, heads * d)),
                            ("mlp.gate_proj", (inter, H)), ("mlp.up_proj", (inter, H)), ("mlp.down_proj", (H, inter))]:
            tensors[b + name + ".weight"] = 1 + rng.normal(0, .1, H) if shape is None else rng.normal(0, .25, shape)
    weights = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
    kvbudget._core.write_safetensors(str(out / "model.safetensors"), weights)
    ids = out.parent / (out.name + "-ids.txt")
    ids.write_text(" ".join(str(i) for i in rng.integers(0, vocab, tokens)) + "\n")
    return out, ids


def test_evaluate_quantizes_only_chosen_layers_as_the_cli(tmp_path):
    """quantize_layers / other_layers_format as `eval --layers` / `--other-layers-format`,
    on a hybrid evaluated past its sliding window (48 tokens, W = 8)."""
    model, ids = write_hybrid_checkpoint(tmp_path / "hybrid", window=8)
    cli = json.loads(subprocess.run([KVB, "eval", str(model), "--tokens", str(ids), "--format", "int2-asym-g8",
                                     "--layers", "full", "--json"], check=True, capture_output=True, text=True).stdout)
    r = kvbudget.evaluate(model, tokens=ids, format="int2-asym-g8", quantize_layers="full")
    assert r["plan"] == "uniform(format=int2-asym-g8) on layers 1 (others keep-fp16)"
    assert r["plan_formats"].endswith("sliding:W8(layers 0,2)")
    # Layers 0 and 2 hold their last 8 tokens at 16 bits, layer 1 all 48 at int2-asym-g8 (6 bits).
    assert r["bpe"] == pytest.approx((2 * 8 * 16 + 48 * 6) / (2 * 8 + 48), rel=1e-12) == cli["bpe"]
    assert r["metrics"]["next_token_kl_mean"] == pytest.approx(cli["kl_mean"], rel=1e-6)
    assert r["metrics"]["ppl"] == pytest.approx(cli["ppl"], rel=1e-6)
    by_index = kvbudget.evaluate(model, tokens=ids, format="int2-asym-g8", quantize_layers=[1])
    assert np.array_equal(by_index["logits"], r["logits"])
    every = kvbudget.evaluate(model, tokens=ids, format="int2-asym-g8", quantize_layers="all")
    plain = kvbudget.evaluate(model, tokens=ids, format="int2-asym-g8")
    assert np.array_equal(every["logits"], plain["logits"]) and every["bpe"] == plain["bpe"]
    exact_others = kvbudget.evaluate(model, tokens=ids, format="int2-asym-g8", quantize_layers="1",
                                     other_layers_format="keep-fp32")
    assert exact_others["bpe"] == pytest.approx((2 * 8 * 32 + 48 * 6) / (2 * 8 + 48), rel=1e-12)
    # The errors of a config's quantize_layers and of eval --layers.
    errors = [
        (dict(format="int2-asym-g8", quantize_layers="0,5"),
         "quantize_layers '0,5': layer 5 does not exist: .* has 3 layers"),
        (dict(format="int2-asym-g8", quantize_layers="fulll"), "'fulll' is not a layer index or range"),
        (dict(format="int2-asym-g8", quantize_layers=[]), "quantize_layers: empty"),
        (dict(format="int2-asym-g8", other_layers_format="keep-fp32"),
         "other_layers_format: only used with quantize_layers"),
        (dict(quantize_layers="full"), "quantize_layers needs a plan"),
        (dict(strategy="uniform", params={"budget_bpe": 4, "family": "int{b}-asym-g8"}, quantize_layers="full"),
         "quantize_layers with budget_bpe: the strategy meets its budget over every layer"),
        (dict(format="int2-asym-g8", quantize_layers="full", other_layers_format="keep-fp12"), "other_layers_format"),
    ]
    for kwargs, message in errors:
        with pytest.raises(kvbudget.ConfigError, match=message):
            kvbudget.evaluate(model, tokens=ids, **kwargs)
    with pytest.raises(TypeError, match="quantize_layers must be"):
        kvbudget.evaluate(model, tokens=ids, format="int2-asym-g8", quantize_layers=1)


def test_evaluate_equals_the_cli(tmp_path):
    out = subprocess.run([KVB, "eval", str(LLAMA), "--text", str(TEXT), "--max-tokens", "96", "--format",
                          "int4-asym-g32", "--out", str(tmp_path / "e.safetensors")],
                         check=True, capture_output=True, text=True).stdout
    r = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, format="int4-asym-g32")
    assert r["bpe"] == 5.0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in r["metrics"]:
            assert float(parts[1]) == pytest.approx(r["metrics"][parts[0]], rel=1e-5), parts[0]
    assert f"exact cache: PPL {r['exact_ppl']:.6g}" in out
    assert r["logits"].shape == (96, 257) and len(r["nll"]) == 95
    same = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, strategy="uniform", params={"format": "int4-asym-g32"})
    assert np.array_equal(same["logits"], r["logits"])
    exact = kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96)
    assert "metrics" not in exact and exact["exact_ppl"] == r["exact_ppl"]
    # The task metrics are not computed by eval: left out, as `eval --json` leaves them out.
    assert not {"answer_accuracy", "flips_right_to_wrong", "flips_wrong_to_right"} & set(r["metrics"])
    assert all(np.isfinite(v) for v in r["metrics"].values())
    # A strategy preset given as a format: the CLI's hint, in Python's spelling.
    for kwargs in ({"format": "kivi-2"}, {"key_format": "kivi-2", "value_format": "q8_0"}):
        with pytest.raises(kvbudget.ConfigError, match="'kivi-2' is a strategy preset, not a format: give "
                                                       "strategy=\"kivi-2\""):
            kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, **kwargs)
    with pytest.raises(kvbudget.ConfigError, match="has no parameter 'fromat'"):
        kvbudget.evaluate(LLAMA, text=TEXT, max_tokens=96, strategy="uniform", params={"fromat": "q4_0"})
