#!/usr/bin/env bash
# Paired comparisons against metrics.baseline (docs/methods.md §4, "Uncertainty"):
# comparisons.csv and the console say "better"/"worse" only when the paired interval
# of the difference excludes zero; each point meets the baseline point nearest in
# memory; merged shards give the same comparisons; a misspelt baseline is an error.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

rec="$src/data/records/gpt2-bytes-record.safetensors"
# gpt2-bytes (512 tokens, 64 evaluated positions): uniform int2..int4 against itself at
# each width (the baseline), the same widths with 8-bit keys (better in KL at more
# memory), and an exact copy of the baseline under another name.
cat >"$tmp/cmp.toml" <<TOML
name = "cmp"
[data]
path = "$rec"
max_tokens = 256
[[strategy]]
name = "uniform"
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = "2..4"
[[strategy]]
name = "same as uniform"
type = "uniform"
format = "int3-asym-g32"
[[strategy]]
name = "8-bit keys"
type = "uniform"
key_format = "int8-asym-g32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = "2..3"
[metrics]
report = ["attn_kl_mean", "attn_kl_p99", "attn_out_rel_fro", "topk_overlap"]
baseline = "uniform"
[output]
plots = false
TOML

"$kvb" run "$tmp/cmp.toml" --out "$tmp/r" >"$tmp/r.out" 2>&1 || fail "run exited $?: $(cat "$tmp/r.out")"
d="$tmp/r/cmp/latest"
[ -f "$d/comparisons.csv" ] || fail "no comparisons.csv"
csv_ok "$d/comparisons.csv" || fail "comparisons.csv has ragged rows"
expect "$tmp/r.out" "against the baseline 'uniform'" "the console"
# The primary metric (default: the first Pareto one) leads each line and is in the manifest.
expect "$tmp/r.out" "attn_kl_mean (primary) " "the console"
# 8-bit keys cost more than any uniform point: compared at unequal memory, said so.
expect "$tmp/r.out" ": at unequal memory, " "the console (8-bit keys against the nearest baseline)"
expect "$d/manifest.json" '"primary_metric": "attn_kl_mean"' "the manifest"
expect "$d/manifest.json" '"paired_comparison"' "the manifest"
/usr/bin/python3 - "$d/comparisons.csv" "$d/points.csv" <<'PY' || fail "comparisons.csv is wrong"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
points = {r["id"]: r for r in csv.DictReader(open(sys.argv[2]))}
assert rows, "no comparisons"
# The baseline's own points are not compared; p99 (a quantile) is not pairable.
assert all(r["strategy"] != "uniform" for r in rows), rows
assert all(r["metric"] != "attn_kl_p99" for r in rows), rows
# The reported metrics (attn_out_rel_err joins as a default Pareto metric) but p99.
assert {r["metric"] for r in rows} == {"attn_kl_mean", "attn_out_rel_err", "attn_out_rel_fro", "topk_overlap"}, rows
for r in rows:
    lo, hi, diff = float(r["difference_lo"]), float(r["difference_hi"]), float(r["difference"])
    assert lo <= diff <= hi, r
    # Values are the points' own, and so is the memory beside them.
    assert r["value"] == points[r["id"]][r["metric"]], r
    assert r["memory_axis"] == "bpe", r
    assert float(r["memory"]) == float(points[r["id"]]["bpe"]), r
    assert float(r["baseline_memory"]) == float(points[r["baseline_id"]]["bpe"]), r
    assert r["baseline_value"] == points[r["baseline_id"]][r["metric"]], r
    excludes = lo > 0 or hi < 0
    assert (r["verdict"] in ("better", "worse")) == excludes, r
    assert r["verdict"] in ("better", "worse", "no measurable difference"), r
    if excludes:
        lower_better = r["metric"] != "topk_overlap"  # the only higher-is-better one here
        assert (r["verdict"] == "better") == ((diff < 0) == lower_better), r
same = [r for r in rows if r["strategy"] == "same as uniform"]
assert len(same) == 4, same  # one point, four pairable metrics
for r in same:  # the same plan as uniform int3 (the nearest in memory): zero difference
    assert "bits=3" in r["baseline_label"], r
    assert float(r["difference"]) == 0 and r["verdict"] == "no measurable difference", r
keys8 = [r for r in rows if r["strategy"] == "8-bit keys" and r["metric"] == "attn_kl_mean"]
assert len(keys8) == 2 and all(r["verdict"] == "better" for r in keys8), keys8
PY

# Merged shards compare the same way (the block sums travel in results.jsonl).
for i in 0 1; do
  "$kvb" run "$tmp/cmp.toml" --quiet --shard "$i/2" --out "$tmp/sh" >"$tmp/sh$i.out" 2>&1 \
    || fail "shard $i/2 exited $?: $(cat "$tmp/sh$i.out")"
done
"$kvb" merge "$tmp"/sh/cmp/*-shard* --merged-dir "$tmp/merged" >"$tmp/merge.out" 2>&1 || fail "merge exited $?: $(cat "$tmp/merge.out")"
cmp -s "$d/comparisons.csv" "$tmp/merged/comparisons.csv" || fail "merged comparisons.csv differs from the single run's"

# metrics.primary picks another one.
"$kvb" run "$tmp/cmp.toml" --out "$tmp/p" --set metrics.primary=attn_out_rel_fro >"$tmp/p.out" 2>&1 \
  || fail "run with metrics.primary exited $?: $(cat "$tmp/p.out")"
expect "$tmp/p.out" "attn_out_rel_fro (primary) " "the console with metrics.primary"

# One evaluated position is one block of positions (fewer than 5): no bootstrap
# intervals, no paired verdicts, nothing "for certain" in budgets.json or pareto.csv,
# and one warning on stderr and in the manifest.
"$kvb" run "$tmp/cmp.toml" --out "$tmp/one" --set 'metrics.positions=[255]' --set calibration.overlap=true \
  --budget 'attn_kl_mean <= 1' --budget 'bpe <= 4' >"$tmp/one.out" 2>&1 || fail "run at one position exited $?: $(cat "$tmp/one.out")"
d1="$tmp/one/cmp/latest"
expect "$tmp/one.out" "kvbudget run: warning: 1 block of evaluated positions (fewer than 5): no bootstrap intervals or paired verdicts; evaluate more positions (metrics.positions)" "stderr at one position"
[ "$(grep -c 'fewer than 5' "$tmp/one.out")" -eq 1 ] || fail "the too-few-blocks warning is not said once"
/usr/bin/python3 - "$d1" <<'PY' || fail "one evaluated position: an interval or a verdict that the run cannot give"
import csv, json, sys
d = sys.argv[1]
manifest = json.load(open(f"{d}/manifest.json"))
assert manifest["uncertainty"]["attention_interval"]["blocks"] == 1, manifest["uncertainty"]
assert [w for w in manifest["warnings"] if w.startswith("1 block of evaluated positions (fewer than 5)")], manifest["warnings"]
points = list(csv.DictReader(open(f"{d}/points.csv")))
assert all(r[f"{m}_{e}"] == "nan" for r in points for m in ("attn_kl_mean", "attn_kl_p99") for e in ("lo", "hi")), points
comparisons = list(csv.DictReader(open(f"{d}/comparisons.csv")))
assert comparisons and all(r["verdict"] == "not comparable" and r["difference_lo"] == "nan" for r in comparisons), comparisons
assert any(float(r["difference"]) != 0 for r in comparisons), comparisons  # the measured difference stays
error_budget, memory_budget = json.load(open(f"{d}/budgets.json"))
pick = error_budget["answers"][0]
assert pick["point"] and pick["interval"] is None, pick
assert pick["meets_bound_for_certain"] is None and pick["cheaper_within_uncertainty"] is None, pick
assert all(a["indistinguishable"] is None for a in memory_budget["answers"] if a["point"]), memory_budget
pareto = list(csv.DictReader(open(f"{d}/pareto.csv")))
assert pareto and all(r["within_uncertainty"] == "" and r["value_lo"] == "nan" for r in pareto), pareto
PY
sed -n '/^against the baseline/,$p' "$tmp/one.out" | grep -E ' (better|worse)(;|,|$)' \
  && fail "a verdict from one block on the console"

# A baseline that names no strategy: exit 2, with the closest name.
"$kvb" run "$tmp/cmp.toml" --quiet --out "$tmp/x" --set metrics.baseline=unifrom >"$tmp/bad.out" 2>&1
[ $? -eq 2 ] || fail "a misspelt baseline: expected exit 2"
expect "$tmp/bad.out" "names no [[strategy]] block" "the misspelt baseline's error"
expect "$tmp/bad.out" "uniform" "the misspelt baseline's suggestion"

exit $status
