#!/usr/bin/env bash
# Memory at one context, error at another (docs/methods.md §1, "extrapolated"): points,
# frontiers, budget answers and plots say when a point's memory is taken at a longer
# context than its error was measured on, and never when it is not; output.x picks the
# memory axis; configs/long_context.toml measures both on one cache.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

rec="$src/data/records/gpt2-bytes-record.safetensors"
# column CSV NAME KEY_SUBSTRING: the NAME field of the first row whose key contains KEY_SUBSTRING.
column() {
  /usr/bin/python3 -c 'import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if sys.argv[3] in r["key"]:
        print(r[sys.argv[2]]); break' "$1" "$2" "$3"
}

# gpt2-bytes (512 tokens): uniform int2..4 and KIVI-2 (a 128-token fp16 window).
cat >"$tmp/kivi.toml" <<TOML
name = "kivi"
[data]
path = "$rec"
[[strategy]]
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = "2..4"
[[strategy]]
preset = "kivi-2"
[metrics]
pareto = ["attn_kl_mean"]
TOML

# 1. A memory budget at the 32K target context picks KIVI-2, whose 3.05 bpe there pairs
# with an error measured at 512 tokens (where it is 6.25 bpe): it says so everywhere.
"$kvb" run "$tmp/kivi.toml" --out "$tmp/r1" --quiet --budget 'bpe_target <= 4' --budget 'bpe <= 4' \
  >"$tmp/r1.out" 2>&1 || fail "run 1 exited $?"
d1="$tmp/r1/kivi/latest"
has_column "$d1/points.csv" extrapolated || fail "points.csv has no extrapolated column"
has_column "$d1/pareto.csv" extrapolated || fail "pareto.csv has no extrapolated column"
[ "$(column "$d1/points.csv" extrapolated kivi-2)" = target_context ] || fail "kivi-2 not extrapolated in points.csv"
[ "$(column "$d1/points.csv" extrapolated int3-asym-g32)" = no ] || fail "uniform int3 extrapolated in points.csv"
[ "$(column "$d1/points.csv" bpe kivi-2)" = 6.25 ] || fail "kivi-2 is not 6.25 bpe at 512 tokens"
# Its error averages caches of 1..512 tokens, a quarter of them wholly in the window:
# bpe_read says so, and the run warns; uniform int3 reads the same memory at every length.
[ "$(column "$d1/points.csv" bpe_read int3-asym-g32)" = 4 ] || fail "uniform int3's bpe_read is not its bpe"
/usr/bin/python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 1.05 * 6.25)' "$(column "$d1/points.csv" bpe_read kivi-2)" \
  || fail "kivi-2's bpe_read is not above its 6.25 bpe at 512 tokens"
expect "$tmp/r1.out" "warning: 1 point(s) have their error averaged over caches whose memory differs from their bpe at 512 tokens" \
  "the run's warning"
/usr/bin/python3 -c 'import json, sys; sys.exit(not any("bpe_read" in w for w in json.load(open(sys.argv[1]))["warnings"]))' \
  "$d1/manifest.json" || fail "manifest.json's warnings lack the bpe_read note"
grep -F 'bpe_target <= 4 -> best attn_kl_mean: kivi-2' "$tmp/r1.out" >"$tmp/r1.line" \
  || fail "bpe_target <= 4 did not answer kivi-2"
expect "$tmp/r1.line" "extrapolated: memory at target_context 32768 tokens, error measured on 512" "kivi-2's answer"
# The same question at the recorded context is measured: no word of extrapolation.
grep -F 'bpe <= 4 -> best attn_kl_mean:' "$tmp/r1.out" >"$tmp/r1b.line" || fail "bpe <= 4 not answered"
grep -q extrapolated "$tmp/r1b.line" && fail "bpe <= 4's answer says extrapolated: $(cat "$tmp/r1b.line")"
/usr/bin/python3 - "$d1/budgets.json" <<'PY' || fail "budgets.json does not carry the extrapolated flags"
import json, sys
target, recorded = json.load(open(sys.argv[1]))
pick = target["answers"][0]
assert pick["point"].startswith("kivi-2") and pick["extrapolated"] is True and pick["memory"] == "bpe_target", pick
assert "error measured on 512" in pick["extrapolation"], pick
assert recorded["answers"][0]["extrapolated"] is False and "extrapolation" not in recorded["answers"][0]
PY
# On the default axis (bpe) the frontier is measured: nothing marked.
grep -q '(extrapolated)' "$tmp/r1.out" && fail "the bpe frontier marks a point extrapolated"
/usr/bin/python3 -c 'import csv,sys; sys.exit(any(r["extrapolated"] != "false" for r in csv.DictReader(open(sys.argv[1]))))' \
  "$d1/pareto.csv" || fail "pareto.csv on bpe marks a point extrapolated"

# 2. output.x = "bpe_target": the frontier is drawn on memory at 32K, KIVI-2 on it is
# marked (pareto.csv, console, plot); the plot's axis says which memory.
"$kvb" run "$tmp/kivi.toml" --out "$tmp/r2" --quiet --set output.x=bpe_target --budget 'attn_kl_mean <= 0.02' \
  >"$tmp/r2.out" 2>&1 || fail "run 2 exited $?"
d2="$tmp/r2/kivi/latest"
expect "$tmp/r2.out" "vs bits per element at target_context 32768 tokens" "console frontier title"
expect "$tmp/r2.out" "kivi-2() (extrapolated)" "console frontier row"
expect "$tmp/r2.out" "  extrapolated: memory at target_context 32768 tokens, error measured on 512 (docs/methods.md §1)" \
  "console frontier note"
expect "$d2/pareto.csv" 'attn_kl_mean,0,' "pareto.csv"
/usr/bin/python3 - "$d2/pareto.csv" <<'PY' || fail "pareto.csv on bpe_target: wrong flags or order"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert all(r["memory"] == "bpe_target" for r in rows)
assert [float(r["bpe_target"]) for r in rows] == sorted(float(r["bpe_target"]) for r in rows)
assert all((r["extrapolated"] == "true") == r["key"].startswith("kivi-2") for r in rows), rows
assert any(r["key"].startswith("kivi-2") for r in rows), rows
PY
# An error budget minimizes output.x's memory: KIVI-2 (3.05 at 32K) beats int3 (4.0), marked.
expect "$tmp/r2.out" "attn_kl_mean <= 0.02 -> least memory: kivi-2" "error budget on bpe_target"
grep -F 'attn_kl_mean <= 0.02 -> least memory:' "$tmp/r2.out" | grep -q extrapolated \
  || fail "the error budget's extrapolated answer does not say so"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  expect "$d2/plots/attn_kl_mean.svg" "hollow: extrapolated" "plot legend"
  expect "$d2/plots/attn_kl_mean.svg" "Hollow: 1 of 4 points extrapolated" "plot caption"
  expect "$d2/plots/attn_kl_mean.svg" "bits per element at 32768 tokens" "plot x label"
  grep -q "Hollow:" "$tmp/r1/kivi/latest/plots/attn_kl_mean.svg" && fail "the bpe plot has an extrapolation caption"
fi

# The note is derived from the folder's points as a whole: two shards merged carry the
# whole run's one note, not each shard's.
for i in 0 1; do
  "$kvb" run "$tmp/kivi.toml" --out "$tmp/r1s" --quiet --no-plots --shard $i/2 >/dev/null 2>&1 || fail "shard $i exited $?"
done
"$kvb" merge "$tmp"/r1s/kivi/*-shard* --merged-dir "$tmp/r1s/merged" >"$tmp/r1s.out" 2>&1 || fail "merge exited $?"
/usr/bin/python3 - "$d1/manifest.json" "$tmp/r1s/merged/manifest.json" <<'PY' || fail "merge does not derive the bpe_read note again"
import json, sys
whole, merged = ([w for w in json.load(open(f))["warnings"] if "bpe_read" in w] for f in sys.argv[1:])
assert len(whole) == 1 and merged == whole, (whole, merged)
PY

# 2b. Comparisons against a baseline, and the points a budget answer names, on
# bpe_target: KIVI-2's memory there is extrapolated, and each says so (comparisons.csv's
# extrapolated / baseline_extrapolated, the console's mark and note; budgets.json's
# rival with its memory column and flag, the console naming bpe_target beside bpe).
# int2 (3.0 at 32K) meets KL <= 0.25 by its value only; the least memory whose whole
# interval meets it is KIVI-2 (3.05 at 32K, 6.25 at 512).
"$kvb" run "$tmp/kivi.toml" --out "$tmp/r2b" --quiet --no-plots --set output.x=bpe_target \
  --set strategy.0.name=flat --set metrics.baseline=flat --budget 'attn_kl_mean <= 0.25' \
  >"$tmp/r2b.out" 2>&1 || fail "run 2b exited $?"
d2b="$tmp/r2b/kivi/latest"
has_column "$d2b/comparisons.csv" extrapolated || fail "comparisons.csv has no extrapolated column"
has_column "$d2b/comparisons.csv" baseline_extrapolated || fail "comparisons.csv has no baseline_extrapolated column"
/usr/bin/python3 - "$d2b/comparisons.csv" <<'PY' || fail "comparisons.csv on bpe_target: wrong extrapolated flags"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert rows and all(r["memory_axis"] == "bpe_target" and r["baseline_extrapolated"] == "false" for r in rows), rows
assert all((r["extrapolated"] == "true") == r["key"].startswith("kivi-2") for r in rows), rows
assert any(r["key"].startswith("kivi-2") for r in rows), rows
PY
sed -n '/^against the baseline/,$p' "$tmp/r2b.out" >"$tmp/r2b.cmp"
expect "$tmp/r2b.cmp" "kivi-2() (extrapolated) vs flat(bits=2) (bpe_target 3.051 vs 3" "console comparison line"
expect "$tmp/r2b.cmp" "  extrapolated: memory at target_context 32768 tokens, error measured on 512 (docs/methods.md §1)" \
  "console comparison note"
grep -F 'attn_kl_mean <= 0.25 -> least memory: flat(bits=2)' "$tmp/r2b.out" >/dev/null || fail "KL <= 0.25 did not pick int2"
expect "$tmp/r2b.out" "the least memory whose whole interval meets it: kivi-2() (bpe 6.25, bpe_target 3.051 extrapolated, " \
  "the console's rival on bpe_target"
expect "$tmp/r2b.out" "      extrapolated: memory at target_context 32768 tokens, error measured on 512 (docs/methods.md §1)" \
  "the console's note for the rival"
/usr/bin/python3 - "$d2b/budgets.json" <<'PY' || fail "budgets.json's rival lacks its memory column or extrapolation"
import json, sys
pick = json.load(open(sys.argv[1]))[0]["answers"][0]
assert pick["point"].startswith("uniform") and pick["extrapolated"] is False and pick["meets_bound_for_certain"] is False, pick
rival = pick["least_memory_for_certain"]
assert rival["point"].startswith("kivi-2") and rival["memory"] == "bpe_target" and rival["memory_value"] == 3.05078125, rival
assert rival["extrapolated"] is True and "error measured on 512" in rival["extrapolation"], rival
PY

# 2c. output.x = "bpe_read": the frontier and an error budget on the memory the errors
# were measured at; KIVI-2 there costs more than its 6.25 bpe at 512 tokens.
"$kvb" run "$tmp/kivi.toml" --out "$tmp/r2c" --quiet --set output.x=bpe_read --budget 'bpe_read <= 20' \
  >"$tmp/r2c.out" 2>&1 || fail "run 2c exited $?"
expect "$tmp/r2c.out" "vs bits per element of the caches the evaluated queries read (bpe_read)" "the bpe_read frontier"
/usr/bin/python3 - "$tmp/r2c/kivi/latest" <<'PY' || fail "pareto.csv / budgets.json on bpe_read"
import csv, json, os, sys
d = sys.argv[1]
points = {r["id"]: r for r in csv.DictReader(open(os.path.join(d, "points.csv")))}
rows = list(csv.DictReader(open(os.path.join(d, "pareto.csv"))))
assert rows and all(r["memory"] == "bpe_read" for r in rows), rows
read = [float(points[r["id"]]["bpe_read"]) for r in rows]
assert read == sorted(read), read  # the front in order of bpe_read
answer = json.load(open(os.path.join(d, "budgets.json")))[0]["answers"][0]
assert answer["memory"] == "bpe_read" and answer["extrapolated"] is False, answer
assert answer["memory_value"] == float(points[str(answer["id"])]["bpe_read"]), answer
assert all(r["bpe_read"] == points[r["id"]]["bpe_read"] for r in rows), rows
PY
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then  # the plot draws the frontier on bpe_read
  grep -q "frontier over all strategies (0 points" "$tmp/r2c/kivi/latest/plots/attn_kl_mean.caption.txt" \
    && fail "the bpe_read plot has no frontier"
fi

# 3. A budget met at budget_context 32768 > 512 tokens: the allocation itself is for an
# unmeasured cache, so every memory column is extrapolated for that point.
cat >"$tmp/sized.toml" <<TOML
name = "sized"
[data]
path = "$rec"
max_tokens = 256
[[strategy]]
type = "uniform"
budget_bpe = 4.0
family = "int{b}-asym-g32"
key_window = 32
budget_context = 32768
[[strategy]]
name = "at the recording"
type = "uniform"
budget_bpe = 4.0
family = "int{b}-asym-g32"
key_window = 32
[[strategy]]
name = "alike"
type = "uniform"
budget_bpe = 4.0
family = "int{b}-asym-g32"
budget_context = 32768
[metrics]
pareto = ["attn_kl_mean"]
TOML
"$kvb" run "$tmp/sized.toml" --out "$tmp/r3" --quiet --no-plots --budget 'bpe <= 16' \
  --set output.target_context=256 >"$tmp/r3.out" 2>&1 || fail "run 3 exited $?"
d3="$tmp/r3/sized/latest"
[ "$(column "$d3/points.csv" extrapolated budget_context=32768)" = budget_context ] \
  || fail "a budget at 32768 tokens is not extrapolated in points.csv"
[ "$(/usr/bin/python3 -c 'import csv,sys; print([r["extrapolated"] for r in csv.DictReader(open(sys.argv[1]))][1])' \
  "$d3/points.csv")" = no ] || fail "a budget met at the recording's length is extrapolated"
expect "$tmp/r3.out" "allocated for budget_context 32768 tokens, error measured on 256" "console (budget_context)"
# Without the window the cache is stored alike at every length: the same plan at any
# budget_context, measured as it is, so not extrapolated.
[ "$(/usr/bin/python3 -c 'import csv,sys; print([r["extrapolated"] for r in csv.DictReader(open(sys.argv[1]))][2])' \
  "$d3/points.csv")" = no ] || fail "a plan stored alike, sized at 32768, is marked extrapolated"

# 4. output.x is validated like every key: file:line, the key, a suggestion; exit 2.
printf '[output]\nx = "bpe_targt"\n' >>"$tmp/kivi.toml"
"$kvb" run "$tmp/kivi.toml" --out "$tmp/r4" >"$tmp/r4.out" 2>&1
[ $? -eq 2 ] || fail "output.x typo: expected exit 2"
expect "$tmp/r4.out" "kivi.toml:14: output.x: 'bpe_targt' is not a memory column (did you mean 'bpe_target'?)" \
  "output.x typo"
[ ! -e "$tmp/r4" ] || fail "output.x typo created results"

# 5. configs/long_context.toml: memory and error on one 32768-token cache, nothing
# extrapolated, whole, quickly.
"$kvb" run "$src/configs/long_context.toml" --out "$tmp/r5" --quiet --threads 2 >"$tmp/r5.out" 2>&1 \
  || fail "long_context.toml exited $?"
d5="$tmp/r5/long_context/latest"
[ "$(wc -l <"$d5/points.csv")" -eq 4 ] || fail "long_context.toml: expected 3 points"
/usr/bin/python3 - "$d5/points.csv" <<'PY' || fail "long_context.toml: a point is extrapolated or bpe_target != bpe"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert all(r["extrapolated"] == "no" and r["bpe"] == r["bpe_target"] for r in rows), rows
PY
grep -q extrapolated "$tmp/r5.out" && fail "long_context.toml's console mentions extrapolation"
expect "$tmp/r5.out" "bpe_target <= 3.1 -> best attn_kl_mean:" "long_context.toml budget"

exit $status
