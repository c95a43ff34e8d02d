#!/usr/bin/env bash
# `kvbudget bounds` on inputs too small to decide a row (methods.md §5, "Verdicts"):
# --samples below 5 rows of 32 is refused; on a short --data recording the first-order
# rows, whose bootstrap has fewer than 5 blocks, are "within uncertainty" with no
# interval (not a firm verdict on a zero-width one); on a recording too short for the
# report's fixed calibration rule (every 8th position from 7) the entropy-rule rows are
# "not tested", saying why, and every other row is still written; so are the rows whose
# formats cannot store the recording's head_dim. Refused before the report is computed:
# an --out where no run folder can be made, and a sliding-window model's recording past
# its window (as `kvbudget run` refuses it).
# The summary counts the violated rows (text, --json, manifest.json).
# --data takes a config of [data] alone, or an experiment config.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
rec="$src/data/records/gpt2-bytes-record.safetensors"

# 1. Too few Gaussian samples for an interval: a usage error naming the minimum.
"$kvb" bounds --quick --samples 100 --out "$tmp/s" >/dev/null 2>"$tmp/samples.err"
rc=$?
[ $rc -eq 2 ] || fail "bounds --samples 100: expected exit 2, got $rc"
expect "$tmp/samples.err" "--samples must be >= 160, got 100" "bounds --samples 100"

# 2. An --out where no run folder can be made: refused before the report is computed
# (it was computed, then lost), naming --out.
touch "$tmp/afile"
"$kvb" bounds --quick --out "$tmp/afile" >"$tmp/out.txt" 2>"$tmp/out.err"
rc=$?
[ $rc -eq 2 ] || fail "bounds --out FILE: expected exit 2, got $rc"
expect "$tmp/out.err" "--out: cannot create directory $tmp/afile/bounds: $tmp/afile is not a directory" "bounds --out FILE"
[ -s "$tmp/out.txt" ] && fail "bounds --out FILE: printed a report: $(head -3 "$tmp/out.txt")"

# config N: a --data config keeping the first N tokens of gpt2-bytes.
config() {
  printf 'name = "short"\n[data]\npath = "%s"\nmax_tokens = %s\n[[strategy]]\ntype = "uniform"\nbudget_bpe = 4.0\nfamily = "int{b}-asym-g32"\n' \
    "$rec" "$1" >"$tmp/short$1.toml"
}
# verdicts JSON: "name<TAB>verdict<TAB>interval<TAB>interval_of" per row of a --json report.
verdicts() {
  /usr/bin/python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["name"], r["verdict"], json.dumps(r["interval"]), r["interval_of"], sep="\t")' "$1"
}

# 3. 9 tokens: first-order rows on 2 query positions (one bootstrap block).
config 9
"$kvb" bounds --quick --data "$tmp/short9.toml" --json --out "$tmp/b9" >"$tmp/b9.json" 2>"$tmp/b9.err" ||
  fail "bounds --data (9 tokens) exited $?: $(tail -3 "$tmp/b9.err")"
verdicts "$tmp/b9.json" >"$tmp/b9.tsv"
grep -P '^value error int4-asym-g32 renyi2\twithin uncertainty\tnull\tnone: fewer than 5 blocks' "$tmp/b9.tsv" \
  >/dev/null || fail "9 tokens: the renyi2 row should be within uncertainty without an interval: $(grep renyi2 "$tmp/b9.tsv")"
/usr/bin/python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
bad = [r["name"] for r in rows if r["interval_of"] != "exact" and r["interval"] is None and r["verdict"] != "within uncertainty"]
sys.exit(bool(bad) and print("firm verdicts without an interval:", bad) is None)' "$tmp/b9.json" ||
  fail "9 tokens: a sampled row without an interval has a firm verdict"

# 4. 5 tokens: no calibration position under the fixed rule; the report is still written.
config 5
"$kvb" bounds --quick --data "$tmp/short5.toml" --json --out "$tmp/b5" >"$tmp/b5.json" 2>"$tmp/b5.err" ||
  fail "bounds --data (5 tokens) exited $?: $(tail -3 "$tmp/b5.err")"
verdicts "$tmp/b5.json" >"$tmp/b5.tsv"
[ "$(grep -c $'^alpha .*\tnot tested\tnull\tnone: the bounds report calibrates on every 8th position from 7' "$tmp/b5.tsv")" = 6 ] ||
  fail "5 tokens: the 6 entropy-rule rows should be not tested, naming the fixed rule: $(grep '^alpha' "$tmp/b5.tsv")"
expect "$tmp/b5.tsv" "the recording has only 5 tokens (at least 8 needed)" "5 tokens: entropy-rule reason"
for row in "shannon b=2 lloyd-max" "value error int4-asym-g32" "bound as written (research rho)" \
           "4/3 vs 3/3 (unequal budgets)"; do
  grep -qF "$row"$'\t' "$tmp/b5.tsv" || fail "5 tokens: row '$row' missing"
done
/usr/bin/python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(j["rows_not_tested"] != 6)' \
  "$tmp/b5.json" || fail "5 tokens: rows_not_tested should be 6"
db=$(ls -d "$tmp"/b5/bounds/2*)
expect "$db/bounds.md" "| not tested |" "5 tokens: bounds.md"

# 5. head_dim 80, which the rows' g32 formats cannot store: the first-order and
# entropy-rule rows are not tested, naming the format and head_dim, and the rest of the
# report is written (it was measured on a shape the format refuses, or lost mid-report).
printf '[data.synthetic]\nlayers = 2\nq_heads = 4\nhead_dim = 80\ntokens = 64\n[[strategy]]\ntype = "uniform"\nformat = "keep-fp16"\n' \
  >"$tmp/hd80.toml"
"$kvb" bounds --quick --data "$tmp/hd80.toml" --json --out "$tmp/h80" >"$tmp/h80.json" 2>"$tmp/h80.err" ||
  fail "bounds --data (head_dim 80) exited $?: $(tail -3 "$tmp/h80.err")"
verdicts "$tmp/h80.json" >"$tmp/h80.tsv"
[ "$(grep -cP '^(value|key) error int\d-asym-g32.*\tnot tested\tnull\tnone: format int\d-asym-g32: group size 32 does not divide head_dim 80 of the recording$' "$tmp/h80.tsv")" = 6 ] ||
  fail "head_dim 80: the 6 first-order rows should be not tested, naming the format: $(grep error "$tmp/h80.tsv")"
[ "$(grep -cP '^alpha .*\tnot tested\tnull\tnone: format int2-asym-g32: group size 32 does not divide head_dim 80' "$tmp/h80.tsv")" = 6 ] ||
  fail "head_dim 80: the 6 entropy-rule rows should be not tested, naming the format: $(grep '^alpha' "$tmp/h80.tsv")"
/usr/bin/python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(j["rows_not_tested"] != 12)' \
  "$tmp/h80.json" || fail "head_dim 80: rows_not_tested should be 12"
grep -qP '^shannon b=2 lloyd-max\tholds' "$tmp/h80.tsv" || fail "head_dim 80: the Gaussian rows should still be measured"

# 6. A sliding-window model recorded past its window (llama-bytes as Mistral, W = 16, 64
# tokens): refused before any row is computed, as `kvbudget run` refuses attention-level
# metrics on it (the rows measured full causal attention the model never computes).
mistral="$tmp/mistral"
mkdir -p "$mistral"
for f in "$src"/data/models/llama-bytes/*; do ln -s "$f" "$mistral/"; done
rm "$mistral/config.json"
/usr/bin/python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=16)
json.dump(c, open(sys.argv[2], "w"))' "$src/data/models/llama-bytes/config.json" "$mistral/config.json"
sw_config() {  # sw_config TOKENS
  printf '[data]\nsource = "model"\nmodel = "%s"\ntext = "%s"\nmax_tokens = %s\ncontinuations = 0\n[[strategy]]\ntype = "uniform"\nformat = "keep-fp16"\n' \
    "$mistral" "$src/data/text/eval_kjv_revelation.txt" "$1" >"$tmp/sw$1.toml"
}
sw_config 64
"$kvb" bounds --quick --data "$tmp/sw64.toml" --out "$tmp/sw" >"$tmp/sw.out" 2>"$tmp/sw.err"
rc=$?
[ $rc -eq 2 ] || fail "bounds --data past a sliding window: expected exit 2, got $rc"
expect "$tmp/sw.err" "the first-order and entropy-rule rows measure attention, but" "bounds past the window"
expect "$tmp/sw.err" "slides over the last W = 16 tokens (layers 0,1,2,3,4,5) and 64 tokens are evaluated" \
  "bounds past the window"
expect "$tmp/sw.err" "evaluate at most 16 tokens (data.max_tokens, or data.n_ctx)" "bounds past the window"
[ -e "$tmp/sw/bounds/latest" ] && fail "bounds past the window: wrote a run folder"
# Within the window (16 tokens) the same model is measured.
sw_config 16
"$kvb" bounds --quick --data "$tmp/sw16.toml" --json --out "$tmp/sw" >"$tmp/sw16.json" 2>"$tmp/sw16.err" ||
  fail "bounds --data within the window exited $?: $(tail -3 "$tmp/sw16.err")"

# 7. The summary counts every verdict, violated included: rows_violated in --json and
# manifest.json and ", N violated" in the text summary, each equal to the rows whose
# verdict is violated, and the four counts add up to the rows.
"$kvb" bounds --quick --out "$tmp/v" >"$tmp/v.out" 2>"$tmp/v.err" || fail "bounds exited $?: $(tail -3 "$tmp/v.err")"
dv=$(ls -d "$tmp"/v/bounds/2*)
/usr/bin/python3 -c 'import collections, csv, json, re, sys
n = collections.Counter(r["verdict"] for r in csv.DictReader(open(sys.argv[1] + "/bounds.csv")))
m = json.load(open(sys.argv[1] + "/manifest.json"))
want = {"rows_holding": n["holds"], "rows_violated": n["violated"], "rows_within_uncertainty": n["within uncertainty"],
        "rows_not_tested": n["not tested"], "rows": sum(n.values())}
assert {k: m.get(k) for k in want} == want, (m, want)
line = open(sys.argv[2]).read().strip().splitlines()[-1]
assert line.startswith("%d of %d rows hold, %d violated, %d within uncertainty;" % (
    n["holds"], sum(n.values()), n["violated"], n["within uncertainty"])), line
j = json.load(open(sys.argv[3]))
k = collections.Counter(r["verdict"] for r in j["rows"])
assert j["rows_violated"] == k["violated"], j["rows_violated"]
assert j["rows_holding"] + j["rows_violated"] + j["rows_within_uncertainty"] + j["rows_not_tested"] == j["rows_total"]
' "$dv" "$tmp/v.out" "$tmp/b5.json" || fail "bounds: the violated rows are not counted in the summary"

# 8. --data with a config of [data] alone (the report reads nothing else): the same rows
# as the experiment config of the same [data] (it was refused: "no [[strategy]] blocks");
# a key the report does not read is unknown there.
printf '[data]\npath = "%s"\nmax_tokens = 9\n' "$rec" >"$tmp/data9.toml"
"$kvb" bounds --quick --data "$tmp/data9.toml" --json --out "$tmp/d9" >"$tmp/d9.json" 2>"$tmp/d9.err" ||
  fail "bounds --data with [data] alone exited $?: $(tail -3 "$tmp/d9.err")"
/usr/bin/python3 -c 'import json, sys
a, b = (json.load(open(f))["rows"] for f in sys.argv[1:])
sys.exit(a != b)' "$tmp/b9.json" "$tmp/d9.json" 2>/dev/null ||
  fail "bounds --data: [data] alone and the experiment config of the same [data] give different rows"
printf '[data]\npath = "%s"\n[calibration]\nstride = 4\n' "$rec" >"$tmp/cal.toml"
"$kvb" bounds --quick --data "$tmp/cal.toml" --out "$tmp/cal" >/dev/null 2>"$tmp/cal.err"
rc=$?
[ $rc -eq 2 ] || fail "bounds --data with [calibration] and no [[strategy]]: expected exit 2, got $rc"
expect "$tmp/cal.err" "$tmp/cal.toml:3: unknown key 'calibration'" "bounds --data with [calibration]"
exit $status
