#!/usr/bin/env bash
# The optimal allocator calibrated on other data (calibration_data) and its protections
# as choices, end to end: points.csv reports objective_calibration (in-sample) beside the
# evaluated metric (out-of-sample) and protections_chosen; the plan is the one the
# calibration data gives; a missing file, a value of the wrong form and data of another
# shape are errors that name the value, with nothing written.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

# column CSV NAME LABEL: the NAME field of the row whose label is LABEL.
column() {
  /usr/bin/python3 -c 'import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r["label"] == sys.argv[3]: print(r[sys.argv[2]])' "$1" "$2" "$3"
}

synthetic() {  # synthetic data of seed $1, tokens $2
  echo "[data.synthetic]"
  echo "seed = $1"
  echo 'layers = 2'
  echo 'q_heads = 4'
  echo 'kv_heads = 2'
  echo 'head_dim = 32'
  echo "tokens = $2"
  echo 'sink_heads = 1'
  echo 'sink_tokens = 1'
  echo 'sink_mass = 0.7'
}
optimal() {  # an optimal block named $1, extra lines after
  echo '[[strategy]]'
  echo "name = \"$1\""
  echo 'type = "optimal"'
  echo 'budget_bpe = 3.5'
  echo 'family = "int{b}-asym-g32"'
  echo 'widths = [2, 3, 4, 6]'
  echo 'candidate_sink_tokens = [1]'
  echo 'candidate_windows = [8]'
}

# 1. Evaluated on seed 1, calibrated on seed 2; and in-sample runs on each seed.
{
  echo 'name = "cal"'
  synthetic 1 128
  optimal "calibrated"
  echo 'calibration_data = "seed 2"'
  optimal "in-sample"
  echo '[metrics]'
  echo 'report = ["attn_kl_mean"]'
} >"$tmp/cal.toml"
"$kvb" run "$tmp/cal.toml" --out "$tmp/cal" --threads 2 --quiet >"$tmp/cal.out" 2>&1 || fail "calibrated run exited $?"
{
  echo 'name = "on2"'
  synthetic 2 128
  optimal "in-sample"
  echo '[metrics]'
  echo 'report = ["attn_kl_mean"]'
} >"$tmp/on2.toml"
"$kvb" run "$tmp/on2.toml" --out "$tmp/on2" --threads 2 --quiet >"$tmp/on2.out" 2>&1 || fail "seed 2 run exited $?"
p="$tmp/cal/cal/latest/points.csv"
on2="$tmp/on2/on2/latest/points.csv"
for c in objective_calibration calibration_data protections_chosen objective_joint; do
  has_column "$p" "$c" || fail "points.csv has no column $c"
done
[ "$(column "$p" calibration_data calibrated)" = "synthetic seed 2" ] || fail "calibration_data is not 'synthetic seed 2'"
[ -z "$(column "$p" calibration_data in-sample)" ] || fail "the in-sample point names calibration data"
case "$(column "$p" protections_chosen calibrated)" in *sink_tokens=1x*|*window=8x*) ;; *) fail "no protection chosen" ;; esac
# The same plan as in-sample on seed 2 ...
[ "$(column "$p" plan calibrated)" = "$(column "$on2" plan in-sample)" ] ||
  fail "the calibrated plan differs from the in-sample plan on seed 2"
[ "$(column "$p" objective_joint calibrated)" = "$(column "$on2" objective_joint in-sample)" ] ||
  fail "objective_joint of the calibrated point is not seed 2's"
# ... evaluated on seed 1: other numbers than on seed 2, and than in-sample on seed 1.
/usr/bin/python3 -c 'import sys
cal_in, cal_out, on2_out = map(float, sys.argv[1:4])
assert cal_in > 0 and cal_out > 0, (cal_in, cal_out)
assert abs(cal_out - on2_out) > 1e-6 * on2_out, (cal_out, on2_out)
' "$(column "$p" objective_calibration calibrated)" "$(column "$p" attn_kl_mean calibrated)" \
  "$(column "$on2" attn_kl_mean in-sample)" || fail "calibrated and evaluated numbers are not distinct"
[ "$(column "$p" bpe calibrated)" = "$(column "$on2" bpe in-sample)" ] || fail "the plans' memory differs"

# 2. Errors, each naming the value, nothing written.
bad() {  # bad NAME VALUE EXPECTED [data lines...]: a run with calibration_data = VALUE fails with EXPECTED
  local name="$1" value="$2" expected="$3"
  shift 3
  {
    echo 'name = "bad"'
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; else synthetic 1 128; fi
    optimal "calibrated"
    echo "calibration_data = \"$value\""
  } >"$tmp/$name.toml"
  if "$kvb" run "$tmp/$name.toml" --out "$tmp/$name" --threads 2 --quiet >"$tmp/$name.out" 2>&1; then
    fail "$name: a run with calibration_data = \"$value\" exited 0"
  fi
  expect "$tmp/$name.out" "$expected" "$name"
  [ -z "$(ls -A "$tmp/$name" 2>/dev/null)" ] || fail "$name: results written"
}
bad notseed "2" 'calibration_data "2": [data] is synthetic'
bad badseed "seed two" 'calibration data is named by its seed, as "seed 7"'
# A misspelt key is an unknown parameter, with the right name suggested.
{
  echo 'name = "typo"'
  synthetic 1 128
  optimal "calibrated"
  echo 'calibration_dta = "seed 2"'
} >"$tmp/typo.toml"
"$kvb" run "$tmp/typo.toml" --out "$tmp/typo" --quiet >"$tmp/typo.out" 2>&1 && fail "a misspelt calibration_data exited 0"
expect "$tmp/typo.out" "calibration_data" "the misspelt key's message"
rec="$src/data/records/gpt2-bytes-record.safetensors"
if [ -f "$rec" ]; then
  filedata=('[data]' "path = \"$rec\"" 'max_tokens = 64')
  bad missing "$tmp/nowhere.safetensors" "calibration_data \"$tmp/nowhere.safetensors\": data path" "${filedata[@]}"
  bad seedforfile "seed 3" "a seed names synthetic data, but [data]" "${filedata[@]}"
  bad shape "$src/data/records/llama-bytes-record.safetensors" \
    "but the evaluated recording has" "${filedata[@]}"
  # The evaluated recording itself as calibration data: the in-sample plan.
  {
    echo 'name = "same"'
    printf '%s\n' "${filedata[@]}"
    optimal "calibrated"
    echo "calibration_data = \"$rec\""
    optimal "in-sample"
  } >"$tmp/same.toml"
  "$kvb" run "$tmp/same.toml" --out "$tmp/same" --threads 2 --quiet >"$tmp/same.out" 2>&1 || fail "same-file run exited $?"
  [ "$(column "$tmp/same/same/latest/points.csv" plan calibrated)" = "$(column "$tmp/same/same/latest/points.csv" plan in-sample)" ] ||
    fail "calibrated on the evaluated file itself, the plan differs from the in-sample one"
fi

# 3. A model on one text, calibrated on another text run through the same model.
gpt2="$src/data/models/gpt2-bytes"
if [ -d "$gpt2" ]; then
  {
    echo 'name = "texts"'
    echo '[data]'
    echo 'source = "model"'
    echo "model = \"$gpt2\""
    echo "text = \"$src/data/text/eval_kjv_revelation.txt\""
    echo 'max_tokens = 64'
    echo 'continuations = 0'
    optimal "calibrated"
    echo "calibration_data = \"$src/data/text/eval_fortunes_science_work.txt\""
    echo '[metrics]'
    echo 'report = ["attn_kl_mean", "ppl_ratio"]'
    echo '[output]'
    echo 'plots = false'
  } >"$tmp/texts.toml"
  "$kvb" run "$tmp/texts.toml" --out "$tmp/texts" --threads 2 --quiet >"$tmp/texts.out" 2>&1 ||
    fail "model run calibrated on another text exited $?: $(tail -3 "$tmp/texts.out")"
  t="$tmp/texts/texts/latest/points.csv"
  case "$(column "$t" calibration_data calibrated)" in
    *eval_fortunes_science_work.txt) ;;
    *) fail "the model point's calibration_data does not name the other text" ;;
  esac
  /usr/bin/python3 -c 'import sys; a, b = map(float, sys.argv[1:3]); sys.exit(not (a > 0 and b > 0 and a != b))' \
    "$(column "$t" objective_calibration calibrated)" "$(column "$t" attn_kl_mean calibrated)" ||
    fail "the model point's calibration and evaluation numbers are not both there and distinct"
fi
exit $status
