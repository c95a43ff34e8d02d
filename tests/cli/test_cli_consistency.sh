#!/usr/bin/env bash
# One command line (README "Command line conventions"): --out is a results base
# directory for run, bounds and merge and a file for record and eval (quantize's
# prefix is --prefix, the old --out still works with a warning); --json on every
# command that prints results, parsed with its documented keys; "did you mean" for
# commands, presets, strategies and formats, wherever they are named; `--set key value`
# explained; data-dependent checks (group size vs head_dim, an impossible budget)
# before the sweep; a warning when an allocation is uniform.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

rec="$src/data/records/gpt2-bytes-record.safetensors"
model="$src/data/models/llama-bytes"
text="$src/data/text/eval_kjv_revelation.txt"
# One point of quickstart (int4-asym-g32) on 32 tokens.
one=(--set data.max_tokens=32 --set 'strategy.0.vars.bits=[4]' --set 'strategy.0.vars.mode=["asym"]'
     --set 'strategy.0.vars.group=[32]' --no-plots --quiet)

# keys FILE KEY...: FILE is JSON whose top-level object (or each element of a
# top-level array) has every KEY.
keys() {
  /usr/bin/python3 -c 'import json, sys
doc = json.load(open(sys.argv[1]))
objs = doc if isinstance(doc, list) else [doc]
missing = [k for o in objs for k in sys.argv[2:] if k not in o]
sys.exit(1 if missing or not objs else 0)' "$@"
}
# refused WHAT EXPECTED_STRING CMD...: CMD exits 2 and says EXPECTED_STRING.
refused() {
  local what="$1" want="$2"
  shift 2
  "$@" >"$tmp/refused.out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "$what: expected exit 2, got $rc"
  expect "$tmp/refused.out" "$want" "$what"
}

# 1. "Did you mean": commands, presets and strategies, formats named as presets.
refused "a mistyped command" "unknown command 'statsu' (did you mean 'status'?)" "$kvb" statsu
refused "--strategy kivi-3" "unknown strategy type or preset 'kivi-3' (did you mean 'kivi-2'?)" \
  "$kvb" eval "$model" --text "$text" --strategy kivi-3
refused "--strategy naming a format" "'q4_0' is a format, not a strategy: give --format q4_0" \
  "$kvb" eval "$model" --text "$text" --strategy q4_0
refused "--format naming a preset" "'kivi-2' is a strategy preset, not a format: give --strategy kivi-2" \
  "$kvb" eval "$model" --text "$text" --format kivi-2
refused "--key-format naming a preset" "give --strategy kivi-4" \
  "$kvb" eval "$model" --text "$text" --key-format kivi-4 --value-format q4_0
refused "quantize --format naming a preset" "'kivi-2' is a strategy preset, not a format" \
  "$kvb" quantize "$rec" -t layers.0.key --format kivi-2
refused "a mistyped format" "did you mean 'q4_0'" "$kvb" quantize "$rec" -t layers.0.key --format q4_00
/usr/bin/python3 -c 'import numpy as np, sys; np.save(sys.argv[1], np.arange(64, dtype=np.int32).reshape(2, 32))' \
  "$tmp/ids.npy" || fail "writing an integer .npy"
refused "quantize on an integer tensor" "holds integers (I32), not keys or values" \
  "$kvb" quantize "$tmp/ids.npy" --format q4_0
refused "a config format naming a preset" "select it with preset = \"kivi-2\"" \
  "$kvb" run "$src/configs/quickstart.toml" --set 'strategy.0.format="kivi-2"' --out "$tmp/x"
refused "a config type naming a preset" "'kivi-2' is a preset: select it with preset = \"kivi-2\"" \
  "$kvb" run "$src/configs/quickstart.toml" --set 'strategy.0.type="kivi-2"' --out "$tmp/x"
refused "a mistyped table option" "did you mean '--json'" "$kvb" metrics --jsno
# The argument at fault is named: not the first one, when that one is fine.
refused "an extra table argument" "kvbudget metrics: unexpected argument 'x' (the only option is --json)" \
  "$kvb" metrics --json x
refused "a repeated --json" "kvbudget strategies: --json given twice" "$kvb" strategies --json --json
"$kvb" metrics --json --help >"$tmp/help.out" 2>&1 || fail "metrics --json --help exited $?"
expect "$tmp/help.out" "kvbudget metrics: prints" "metrics --json --help"

# 2. --set key value (and eval --param) without '=': the fix is in the message.
refused "--set key value" "write --set data.max_tokens=128, not --set data.max_tokens 128" \
  "$kvb" run "$src/configs/quickstart.toml" --set data.max_tokens 128
refused "--set key value before CONFIG" "write --set seed=3" \
  "$kvb" run --set seed 3 "$src/configs/quickstart.toml"
refused "--set without a value" "--set data.max_tokens: expected key=value as one argument" \
  "$kvb" run "$src/configs/quickstart.toml" --set data.max_tokens
refused "--param key value" "write --param format=int4-asym-g32" \
  "$kvb" eval "$model" --text "$text" --strategy uniform --param format int4-asym-g32
[ ! -e "$tmp/x" ] || fail "a refused command wrote $tmp/x"

# 3. Checks that need the data, before the sweep: nothing measured, nothing written.
refused "a group that does not divide head_dim" "2 of 2 points cannot run on this data" \
  "$kvb" run "$src/configs/quickstart.toml" "${one[@]}" --set 'strategy.0.vars.group=[48, 96]' --out "$tmp/g"
expect "$tmp/refused.out" "group size 48 does not divide head_dim 64" "the group check"
expect "$tmp/refused.out" "nothing was measured or written" "the group check"
[ -z "$(ls -d "$tmp"/g/quickstart/2* 2>/dev/null)" ] || fail "a refused run wrote a results folder"
{
  echo 'name = "alloc"'
  echo '[data]'
  echo "path = \"$rec\""
  echo 'max_tokens = 64'
  echo '[[strategy]]'
  echo 'type = "entropy"'
  echo 'budget_bpe = [3.0, 4.5]'
  echo 'family = "int{b}-asym-g32"'
  echo '[output]'
  echo 'plots = false'
} >"$tmp/alloc.toml"
refused "an impossible budget" "budget_bpe 1.5 is below the cheapest allocation, 3 bpe" \
  "$kvb" run "$tmp/alloc.toml" --set 'strategy.0.budget_bpe=[1.5, 4.5]' --out "$tmp/b" --quiet
[ -z "$(ls -d "$tmp"/b/alloc/2* 2>/dev/null)" ] || fail "a refused run wrote a results folder"

# 4. An allocation that degenerates to uniform is a warning (3 bpe = int2 everywhere).
"$kvb" run "$tmp/alloc.toml" --out "$tmp/a" --quiet >"$tmp/alloc.out" 2>"$tmp/alloc.err" ||
  fail "the entropy sweep exited $?"
expect "$tmp/alloc.err" ": point entropy(budget_bpe=3,family=int{b}-asym-g32): the allocation is uniform, K:int2-asym-g32 V:int2-asym-g32" "the uniform warning"
[ "$(grep -c "the allocation is uniform" "$tmp/alloc.err")" -eq 1 ] || fail "4.5 bpe is not a uniform allocation"
expect "$tmp/alloc.err" "kvbudget run: warning: $tmp/alloc.toml:" "the uniform warning's location (the block's file:line)"

# 5. --json on every command that prints results, with the documented keys.
"$kvb" formats --json >"$tmp/formats.json" || fail "formats --json exited $?"
keys "$tmp/formats.json" head_dim tokens families presets || fail "formats --json keys"
/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
ex = {e["name"]: e for f in d["families"] for e in f["examples"]}
sys.exit(not (abs(ex["int4-asym-g32"]["bpe"] - 5.0) < 1e-12 and {"name", "format", "reproduces"} <= set(d["presets"][0])))' \
  "$tmp/formats.json" || fail "formats --json: int4-asym-g32 is not 5 bpe, or presets lack keys"
# Groups along tokens: a causal cache holds its open group in fp16 (methods.md §3). At 512
# tokens, int2-asym-ch32 keeps its last 32 tokens at 16 bits (3 + 13/16 bpe); int3-asym-ch's
# one group never closes (16 bpe); formats quantizing token by token have no cache_bpe.
"$kvb" formats --json --head-dim 64 --tokens 512 >"$tmp/formats512.json" || fail "formats --json --tokens 512 exited $?"
/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
ex = {e["name"]: e for f in d["families"] for e in f["examples"]}
sys.exit(not (ex["int2-asym-ch32"]["cache_bpe"] == 3.8125 and ex["int3-asym-ch"]["cache_bpe"] == 16.0
              and "cache_bpe" not in ex["int4-asym-g32"]))' \
  "$tmp/formats512.json" || fail "formats --json: cache_bpe of groups along tokens"
refused "formats --tokens whose bits overflow" "--tokens 10000000000000000 x head_dim 128 is over" \
  "$kvb" formats --tokens 10000000000000000 --head-dim 128
expect "$tmp/refused.out" "the span's bit count would overflow a 64-bit integer" "formats --tokens overflow"
"$kvb" metrics --json >"$tmp/metrics.json" || fail "metrics --json exited $?"
keys "$tmp/metrics.json" name level better uncertainty unit description || fail "metrics --json keys"
"$kvb" strategies --json >"$tmp/strategies.json" || fail "strategies --json exited $?"
keys "$tmp/strategies.json" protections budget types presets || fail "strategies --json keys"
/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
kivi = [p for p in d["presets"] if p["name"] == "kivi-2"]
sys.exit(not (kivi and kivi[0]["type"] == "uniform" and any(t["name"] == "entropy" for t in d["types"])))' \
  "$tmp/strategies.json" || fail "strategies --json: no kivi-2 preset or entropy type"
"$kvb" inspect "$rec" --positions 16 --json >"$tmp/inspect.json" || fail "inspect --json exited $?"
keys "$tmp/inspect.json" file tensors metadata recording || fail "inspect --json keys"
/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
r = d["recording"]
sys.exit(not (len(r["entropy"]) == len(r["layers"]) * r["q_heads"] and d["tensors"][0]["stats"]["nan"] == 0))' \
  "$tmp/inspect.json" || fail "inspect --json: entropy or stats incomplete"

"$kvb" run "$src/configs/quickstart.toml" "${one[@]}" --budget 'bpe <= 6' --out "$tmp/r" --json >"$tmp/run.json" \
  2>"$tmp/run.err" || fail "run --json exited $?"
keys "$tmp/run.json" command dir status points_total points_measured points_failed wall_seconds files budgets errors ||
  fail "run --json keys"
d=$(ls -d "$tmp"/r/quickstart/2*)
/usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
ok = (j["dir"] == sys.argv[2] and j["status"] == "complete" and j["points_measured"] == 1
      and [q["answers"][0]["point"] for q in j["budgets"] if q["query"] == "bpe <= 6"] == ["uniform(format=int4-asym-g32)"]
      and j["files"]["plots"] is None and j["files"]["points"] == sys.argv[2] + "/points.csv")
sys.exit(not ok)' "$tmp/run.json" "$d" || { fail "run --json: wrong summary"; cat "$tmp/run.json" >&2; }
"$kvb" status "$d" --json >"$tmp/status.json" || fail "status --json exited $?"
keys "$tmp/status.json" dir status running stale points_done points_total shard || fail "status --json keys"
expect "$tmp/status.json" '"status": "complete"' "status --json"

# merge: --out is a base directory as for run (BASE/<name>/<timestamp>-merged/).
for i in 0 1; do
  "$kvb" run "$src/configs/quickstart.toml" "${one[@]}" --set 'strategy.0.vars.bits=[3, 4]' --shard "$i/2" \
    --out "$tmp/sh" >/dev/null 2>&1 || fail "shard $i/2 exited $?"
done
"$kvb" merge "$tmp"/sh/quickstart/*-shard* --out "$tmp/m" --json >"$tmp/merge.json" 2>"$tmp/merge.err" ||
  fail "merge --json exited $?: $(cat "$tmp/merge.err")"
m=$(ls -d "$tmp"/m/quickstart/*-merged 2>/dev/null)
[ -n "$m" ] && [ -s "$m/points.csv" ] || fail "merge --out BASE did not write BASE/quickstart/<timestamp>-merged/"
keys "$tmp/merge.json" command dir status points_total points_measured shards files budgets errors || fail "merge --json keys"
expect "$tmp/merge.json" "\"dir\": \"$m\"" "merge --json"
"$kvb" merge "$tmp"/sh/quickstart/*-shard* --merged-dir "$tmp/m2" --quiet || fail "merge --merged-dir exited $?"
[ -s "$tmp/m2/points.csv" ] || fail "merge --merged-dir did not write the folder itself"
diff <(numbers "$m/points.csv") <(numbers "$tmp/m2/points.csv") >/dev/null || fail "--out and --merged-dir differ"
refused "merge with --out and --merged-dir" "not both" "$kvb" merge "$tmp"/sh/quickstart/*-shard* --out "$tmp/m" --merged-dir "$tmp/m3"

"$kvb" bounds --quick --out "$tmp/bounds" --json >"$tmp/bounds.json" 2>/dev/null || fail "bounds --json exited $?"
keys "$tmp/bounds.json" command dir rows_total rows_holding rows || fail "bounds --json keys"
/usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
sys.exit(not (j["rows_total"] == len(j["rows"]) > 0 and j["dir"].startswith(sys.argv[2] + "/bounds/")))' \
  "$tmp/bounds.json" "$tmp/bounds" || fail "bounds --json: rows or dir"

# 6. quantize: --prefix; the old --out PREFIX still works, with a deprecation warning.
"$kvb" quantize "$rec" -t layers.0.key -f q4_0 --prefix "$tmp/qp" >/dev/null 2>"$tmp/qp.err" || fail "quantize --prefix exited $?"
[ -s "$tmp/qp.dequant.safetensors" ] && [ -s "$tmp/qp.codes.bin" ] || fail "quantize --prefix wrote no files"
[ ! -s "$tmp/qp.err" ] || fail "quantize --prefix warned: $(cat "$tmp/qp.err")"
"$kvb" quantize "$rec" -t layers.0.key -f q4_0 -o "$tmp/qo" >/dev/null 2>"$tmp/qo.err" || fail "quantize -o exited $?"
cmp -s "$tmp/qp.codes.bin" "$tmp/qo.codes.bin" || fail "quantize -o PREFIX wrote other codes than --prefix"
expect "$tmp/qo.err" "--out PREFIX is deprecated; write --prefix" "quantize -o"

exit $status
