#!/usr/bin/env bash
# Strategies end to end: `kvbudget strategies` lists types and presets; a sweep of
# budgeted and composed strategies meets every budget, reports its annotations, an
# impossible budget refuses the run before the sweep with both numbers, attribution shares sum to 1, the
# manifest records calibration and evaluated positions, results are identical for any
# thread count; an unspent optimal budget, one width per kind and a window over the whole
# recording are warnings; an error found on the data names its block; `kvbudget bounds
# --quick` writes its table.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

# 1. The tables.
"$kvb" strategies >"$tmp/list.out" 2>&1 || fail "kvbudget strategies exited $?"
for s in "uniform:" "entropy:" "phase:" "taqg:" "optimal:" "kivi-2" "hf-quanto-int4" "quantcpp-k2-w512" \
         "[key_|value_]window_mode" "budget_bpe"; do
  expect "$tmp/list.out" "$s" "kvbudget strategies"
done

# 2. A sweep of budgets over every type, composed with protections, on 128 tokens.
{
  echo 'name = "s"'
  echo '[data]'
  echo "path = \"$src/data/records/gpt2-bytes-record.safetensors\""
  echo 'max_tokens = 128'
  echo '[[strategy]]'
  echo 'type = "uniform"'
  echo 'budget_bpe = [3.3, 4.0, 5.7]'
  echo 'family = "int{b}-asym-g32"'
  echo '[[strategy]]'
  echo 'type = "entropy"'
  echo 'budget_bpe = [5.0, 6.2]'
  echo 'family = "int{b}-{mode}-g32"'
  echo 'window = 16'
  echo 'sink_tokens = 2'
  echo '[strategy.vars]'
  echo 'mode = ["asym", "sym"]'
  echo '[[strategy]]'
  echo 'type = "optimal"'
  echo 'budget_bpe = 4.5'
  echo 'family = "int{b}-asym-g32"'
  echo 'sink_heads = 1'
  echo '[[strategy]]'
  echo 'type = "phase"'
  echo 'budget_bpe = 4.0'
  echo 'family = "int{b}-asym-g32"'
  echo 'split = [-1, 1]'
  echo '[[strategy]]'
  echo 'preset = "kivi-2"'
  echo 'window = 32'
} >"$tmp/s.toml"
# An impossible budget needs the data (the family's cheapest allocation on it): the
# run refuses after the load, before any point is measured, naming the point.
{
  cat "$tmp/s.toml"
  echo '[[strategy]]'
  echo 'type = "uniform"'
  echo 'budget_bpe = 1.5'
  echo 'family = "int{b}-asym-g32"'
} >"$tmp/impossible.toml"
"$kvb" run "$tmp/impossible.toml" --out "$tmp/r0" --threads 2 --quiet >"$tmp/run0.out" 2>&1
[ $? -eq 2 ] || fail "a run with one impossible budget: expected exit 2 before the sweep"
expect "$tmp/run0.out" "1 of 12 points cannot run on this data" "impossible budget"
expect "$tmp/run0.out" "uniform(budget_bpe=1.5,family=int{b}-asym-g32)" "impossible budget"
expect "$tmp/run0.out" "budget_bpe 1.5 is below the cheapest allocation, 3 bpe" "impossible budget"
[ -z "$(ls -d "$tmp"/r0/s/2* 2>/dev/null)" ] || fail "a refused run wrote a results folder"
"$kvb" run "$tmp/s.toml" --out "$tmp/r1" --threads 2 --quiet >"$tmp/run1.out" 2>&1 || fail "the sweep exited $?"
d1=$(ls -d "$tmp"/r1/s/2*)
[ "$(numbers "$d1/points.csv" | wc -l)" -eq 11 ] || fail "expected 11 measured points"
for c in budget_bpe rho_first rho_second additivity budget_slack_bpe sink_heads_selected; do
  has_column "$d1/points.csv" "$c" || fail "points.csv has no $c column"
done
# budget_bpe is a sweep axis of some blocks and a fixed key of others: one column.
/usr/bin/python3 -c 'import csv, sys
header = next(csv.reader(open(sys.argv[1])))
rows = list(csv.DictReader(open(sys.argv[1])))
budgets = sorted({r["budget_bpe"] for r in rows if r["budget_bpe"]})
sys.exit(len(header) != len(set(header)) or budgets != ["3.3", "4", "4.5", "5", "5.7", "6.2"])' "$d1/points.csv" ||
  fail "points.csv: duplicate column names, or budget_bpe missing for some budgeted points"
/usr/bin/python3 -c 'import csv, sys
bad = [r["key"] for r in csv.DictReader(open(sys.argv[1]))
       if r["budget_bpe"] and float(r["bpe"]) > float(r["budget_bpe"]) + 1e-12]
sys.exit(bool(bad))' "$d1/points.csv" || fail "a point exceeds its budget_bpe"
# Attribution shares sum to 1 for every (point, metric, scope); keys may hold commas,
# so fields are counted from the end.
[ -s "$d1/attribution.csv" ] && [ -s "$d1/concentration.csv" ] || fail "attribution files missing"
awk -F, 'NR > 1 { k = $1 SUBSEP $(NF - 4) SUBSEP $(NF - 3); s[k] += $NF }
         END { for (k in s) if (s[k] < 1 - 1e-6 || s[k] > 1 + 1e-6) { print k, s[k]; bad = 1 }; exit bad }' \
  "$d1/attribution.csv" || fail "attribution shares do not sum to 1"
grep -q ",protection,window," "$d1/attribution.csv" || fail "no window region in attribution.csv"
grep -q ",phase,first_phase," "$d1/attribution.csv" || fail "no phase region in attribution.csv"
expect "$d1/manifest.json" '"rule": "stride 8 from 7"' "manifest calibration"
expect "$d1/manifest.json" '"rule": "all not used for calibration"' "manifest evaluation"
expect "$d1/manifest.json" '"count": 16' "manifest calibration count"

# 3. Determinism across thread counts, statistics and distortion tables included.
"$kvb" run "$tmp/s.toml" --out "$tmp/r2" --threads 1 --quiet --no-plots >/dev/null 2>&1
d2=$(ls -d "$tmp"/r2/s/2*)
diff <(numbers "$d1/points.csv") <(numbers "$d2/points.csv") >/dev/null || fail "points differ between thread counts"
diff "$d1/attribution.csv" "$d2/attribution.csv" >/dev/null || fail "attribution differs between thread counts"

# 4. Config errors name the key.
sed 's/^mode = \["asym", "sym"\]/b = [2]/' "$tmp/s.toml" >"$tmp/b.toml"
"$kvb" run "$tmp/b.toml" --out "$tmp/r3" >"$tmp/b.out" 2>&1
[ $? -eq 2 ] || fail "{b} as a variable: expected exit 2"
expect "$tmp/b.out" "{b} is reserved for the allocator's width" "reserved {b}"
"$kvb" run "$tmp/s.toml" --set 'strategy.4.preset=kivi-3' --out "$tmp/r3" >"$tmp/p.out" 2>&1
[ $? -eq 2 ] || fail "unknown preset: expected exit 2"
expect "$tmp/p.out" "unknown preset 'kivi-3' (did you mean" "unknown preset"

# 5. What a plan that can run must say, on stderr and in manifest.json's warnings: an
# optimal budget left unspent (value widths do not change attn_kl_mean; keys stop at
# int8), one width per kind, and a window holding every token of the recording.
{
  echo 'name = "w"'
  echo '[data]'
  echo "path = \"$src/data/records/gpt2-bytes-record.safetensors\""
  echo 'max_tokens = 64'
  echo '[[strategy]]'
  echo 'type = "optimal"'
  echo 'budget_bpe = 8.0'
  echo 'family = "int{b}-asym-g32"'
  echo 'candidate_windows = [8]'
  echo '[[strategy]]'
  echo 'type = "uniform"'
  echo 'format = "int4-asym-g32"'
  echo 'window = 100'
  echo '[attribution]'
  echo 'points = "none"'
} >"$tmp/w.toml"
"$kvb" run "$tmp/w.toml" --out "$tmp/r4" --threads 2 --quiet --no-plots >"$tmp/w.out" 2>&1 ||
  fail "the run with warnings exited $?"
dw=$(ls -d "$tmp"/r4/w/2*)
for f in "$tmp/w.out" "$dw/manifest.json"; do
  expect "$f" "budget_bpe 8 is not spent: the allocation reaches" "the unspent budget's warning"
  expect "$f" "since no candidate that fits lowers attn_kl_mean further" "the unspent budget's reason"
  expect "$f" "value widths do not change the attention weights" "the unspent budget's reason"
  expect "$f" "the allocation gives one width per kind, K:" "the one-width-per-kind warning"
  expect "$f" "uniform(format=int4-asym-g32,window=100): a window covers all of the recording's 64 tokens" \
    "the whole-recording window's warning"
done
grep -q "the allocation is uniform" "$tmp/w.out" && fail "K and V of different widths called uniform"
/usr/bin/python3 -c 'import csv, math, sys
row = [r for r in csv.DictReader(open(sys.argv[1])) if r["key"].startswith("optimal")][0]
sys.exit(not (float(row["budget_slack_bpe"]) > 1.5 and row["budget_step_bpe"] in ("", "nan", "NaN")))' \
  "$dw/points.csv" || fail "the optimal point does not report its unspent budget in points.csv"

# 6. An error found once the data loads names the block's file, line and name.
{
  echo 'name = "e"'
  echo '[data]'
  echo "path = \"$src/data/records/gpt2-bytes-record.safetensors\""
  echo 'max_tokens = 64'
  echo '[[strategy]]'
  echo 'name = "b"'
  echo 'type = "entropy"'
  echo 'budget_bpe = 4.0'
  echo 'family = "int{b}-asym-g32"'
  echo 'sink_tokens = 80'
} >"$tmp/e.toml"
"$kvb" run "$tmp/e.toml" --out "$tmp/r5" --quiet >"$tmp/e.out" 2>&1
[ $? -eq 2 ] || fail "sink_tokens over the recording's tokens: expected exit 2"
expect "$tmp/e.out" "$tmp/e.toml:5: [strategy[0]] (name \"b\"): point entropy(" "the plan error's location"
expect "$tmp/e.out" "sink_tokens 80 exceeds the recording's 64 tokens" "the plan error"
[ -e "$tmp/r5/e" ] && fail "a refused run wrote $tmp/r5/e"

# 7. The bounds report.
"$kvb" bounds --quick --out "$tmp/b" >"$tmp/bounds.out" 2>&1 || fail "kvbudget bounds exited $?"
db=$(ls -d "$tmp"/b/bounds/2*)
for f in bounds.csv bounds.md manifest.json; do [ -s "$db/$f" ] || fail "bounds results lack $f"; done
expect "$db/bounds.csv" "shannon b=2 lloyd-max" "bounds.csv"
expect "$db/bounds.csv" "bound as written (research rho)" "bounds.csv"
expect "$tmp/bounds.out" "rows hold" "bounds console"

exit $status
