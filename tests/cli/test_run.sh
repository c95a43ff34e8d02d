#!/usr/bin/env bash
# `kvbudget run` end to end: results layout, determinism across runs and thread
# counts, bad input of every kind (clear message, non-zero exit, nothing lost), and
# Ctrl-C. $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

rec="$src/data/records/gpt2-bytes-record.safetensors"
small=(--set data.max_tokens=64 --set 'strategy.0.vars.bits=[3, 4]' --quiet)

# 1. The quickstart config on a 64-token prefix: every file of the results layout.
"$kvb" run "$src/configs/quickstart.toml" "${small[@]}" --out "$tmp/r1" >"$tmp/run1.out" 2>&1 || fail "run 1 exited $?"
d1=$(ls -d "$tmp"/r1/quickstart/2*)
for f in config.toml manifest.json points.csv pareto.csv budgets.json; do
  [ -s "$d1/$f" ] || fail "results lack $f"
done
[ -L "$tmp/r1/quickstart/latest" ] || fail "no latest link"
[ "$(wc -l <"$d1/points.csv")" -eq 9 ] || fail "expected 8 points + header in points.csv"
csv_ok "$d1/points.csv" || fail "points.csv rows have differing field counts"
expect "$d1/manifest.json" '"status": "complete"' "manifest"
expect "$d1/manifest.json" '"git_commit"' "manifest"
expect "$d1/manifest.json" '"seed": 0' "manifest"
# Uncertainty: each attention metric is followed by its bootstrap interval, lo <= hi,
# around the mean metrics' values; the manifest says how it was computed.
/usr/bin/python3 -c 'import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
for m in ["logit_rmse", "logit_err_max", "attn_kl_mean", "attn_kl_p99", "attn_kl_max", "topk_overlap",
          "attn_out_rel_err", "attn_out_rel_err_p99", "attn_out_rel_fro"]:
    i = head.index(m)
    assert head[i + 1 : i + 3] == [m + "_lo", m + "_hi"], (m, head[i + 1 : i + 3])
    for r in rows[1:]:
        v, lo, hi = (float(x) for x in r[i : i + 3])
        assert lo <= hi, (m, r[0], lo, hi)
        if m in ("attn_kl_mean", "attn_out_rel_err", "topk_overlap"):
            assert lo <= v <= hi, (m, r[0], lo, v, hi)
assert "k_rel_mse_lo" not in head and "attn_kl_mean_se" not in head
' "$d1/points.csv" || fail "points.csv: an attention metric without its _lo/_hi interval columns, or a bad interval"
expect "$d1/manifest.json" '"attention_interval"' "manifest (uncertainty)"
expect "$d1/manifest.json" '"level": 0.95' "manifest (uncertainty)"
expect "$d1/manifest.json" '"resamples": 200' "manifest (uncertainty)"
expect "$d1/manifest.json" '"block_positions": 4' "manifest (uncertainty: 4 = ceil(cbrt(56 evaluated positions)) per block)"
expect "$d1/config.toml" 'max_tokens = 64' "resolved config"
expect "$d1/config.toml" "dir = '$tmp/r1'" "resolved config (--out)"
expect "$tmp/run1.out" "Pareto frontier: attn_kl_mean" "console"
expect "$tmp/run1.out" "Budget queries:" "console"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  for m in attn_kl_mean attn_out_rel_err topk_overlap; do
    [ -s "$d1/plots/$m.png" ] && [ -s "$d1/plots/$m.svg" ] && [ -s "$d1/plots/$m.pdf" ] || fail "plot $m missing"
    [ -s "$d1/plots/$m.caption.txt" ] || fail "caption of plot $m missing"
  done
  # Each axis says the metric table's quantity, unit and direction (SVG text is text).
  expect "$d1/plots/topk_overlap.svg" "top-k attention overlap, fraction of k (higher is better)" "plot label"
  expect "$d1/plots/attn_kl_mean.svg" "attention KL, mean (nats, lower is better)" "plot label"
  # output.series = "mode" and output.marker = "group" (quickstart.toml): both in the legend.
  expect "$d1/plots/attn_kl_mean.svg" "mode=asym" "plot legend (series)"
  expect "$d1/plots/attn_kl_mean.svg" "group=32" "plot legend (marker)"
  expect "$d1/plots/attn_kl_mean.svg" "95 % interval" "plot legend (bootstrap interval bars)"
fi

# 2. Determinism across thread counts: tests/experiments/test_runner.cpp (in process).

# 2b. The saved config.toml reruns the experiment: --out, --threads, --no-plots and
# --budget were folded in (the config's own queries kept), and the name is kept.
"$kvb" run "$src/configs/quickstart.toml" "${small[@]}" --out "$tmp/r2b" --threads 1 --no-plots \
  --budget 'bpe <= 3.25' >/dev/null 2>&1 || fail "run 2b exited $?"
d2b=$(ls -d "$tmp"/r2b/quickstart/2*)
expect "$d2b/config.toml" "threads = 1" "resolved config (--threads)"
expect "$d2b/config.toml" "'bpe <= 3.25'" "resolved config (--budget)"
expect "$d2b/config.toml" "'attn_kl_mean <= 1e-3'" "resolved config (the config's own queries)"
(cd "$tmp" && "$kvb" run "$d2b/config.toml" --quiet >"$tmp/rerun.out" 2>&1) || fail "rerunning config.toml exited $?"
d2c=$(ls -d "$tmp"/r2b/quickstart/2* | grep -v "^$d2b\$")
[ -n "$d2c" ] || fail "the rerun did not write under --out's directory"
[ ! -e "$d2c/plots" ] || fail "the rerun drew plots despite --no-plots"
diff <(numbers "$d1/points.csv") <(numbers "$d2c/points.csv") >/dev/null || fail "the rerun's points differ"
diff "$d2b/budgets.json" "$d2c/budgets.json" >/dev/null || fail "the rerun's budget answers differ"

# 3. Config errors: exit 2, file:line and the key, before any results are written.
cat >"$tmp/typo.toml" <<EOF
name = "typo"
[data]
path = "$rec"
max_tokns = 64
[[strategy]]
type = "uniform"
format = "int4-asym-g32"
EOF
"$kvb" run "$tmp/typo.toml" --out "$tmp/r3" >"$tmp/typo.out" 2>&1
[ $? -eq 2 ] || fail "misspelled key: expected exit 2"
expect "$tmp/typo.out" "typo.toml:4: unknown key 'data.max_tokns' (did you mean 'max_tokens'?)" "misspelled key"
[ ! -e "$tmp/r3" ] || fail "a config error created results"

"$kvb" run "$src/configs/quickstart.toml" --set 'metrics.pareto=["attn_kl_maen"]' --out "$tmp/r3" >"$tmp/m.out" 2>&1
[ $? -eq 2 ] || fail "unknown metric: expected exit 2"
expect "$tmp/m.out" "unknown metric 'attn_kl_maen' (did you mean 'attn_kl_mean'?)" "unknown metric"

sed '/\[\[strategy\]\]/,$d' "$tmp/typo.toml" | sed '/max_tokns/d' >"$tmp/empty.toml"
"$kvb" run "$tmp/empty.toml" --out "$tmp/r3" >"$tmp/e.out" 2>&1
[ $? -eq 2 ] || fail "empty sweep: expected exit 2"
expect "$tmp/e.out" "the sweep is empty" "empty sweep"

"$kvb" run "$src/configs/quickstart.toml" --set 'strategy.0.vars.bits=[9]' --out "$tmp/r3" >"$tmp/b.out" 2>&1
[ $? -eq 2 ] || fail "bad format: expected exit 2"
expect "$tmp/b.out" "bits must be 1..8" "bad format"

"$kvb" run "$src/configs/quickstart.toml" --threads x --out "$tmp/r3" >"$tmp/o.out" 2>&1
[ $? -eq 2 ] || fail "bad option value: expected exit 2"
expect "$tmp/o.out" "kvbudget run: error: the argument ('x') for option '--threads' is invalid" "bad option value"
expect "$tmp/o.out" "(kvbudget run --help lists the options)" "bad option value"

"$kvb" run "$src/configs/quickstart.toml" --set output.series=modee --out "$tmp/r3" >"$tmp/s.out" 2>&1
[ $? -eq 2 ] || fail "misspelled output.series: expected exit 2"
expect "$tmp/s.out" "--set output.series: 'modee' is not a points.csv column of this sweep (did you mean 'mode'?)" \
  "misspelled output.series"
[ -e "$tmp/r3" ] && fail "misspelled output.series: a run directory was created before the error"

touch "$tmp/a_file"
"$kvb" run "$src/configs/quickstart.toml" --out "$tmp/a_file" >"$tmp/f.out" 2>&1
[ $? -eq 2 ] || fail "--out naming a file: expected exit 2"
expect "$tmp/f.out" "--out: cannot create directory $tmp/a_file/quickstart: $tmp/a_file is not a directory" "--out a file"

# Input that would measure nothing: one token; position 0 alone; a top-k that covers
# every key. Exit 2 naming the key and the value, before any results are written.
"$kvb" run "$src/configs/quickstart.toml" --set data.max_tokens=1 --out "$tmp/r3n" >"$tmp/one.out" 2>&1
[ $? -eq 2 ] || fail "max_tokens = 1: expected exit 2"
expect "$tmp/one.out" "--set data.max_tokens: 1 keeps a single token, whose query attends to itself alone" "max_tokens = 1"
"$kvb" run "$src/configs/quickstart.toml" --set data.max_tokens=4 --out "$tmp/r3n" >"$tmp/topk.out" 2>&1
[ $? -eq 2 ] || fail "topk above the context: expected exit 2"
expect "$tmp/topk.out" "quickstart.toml:33: metrics.topk = 8, but the context has 4 tokens" "topk above the context"
"$kvb" run "$src/configs/quickstart.toml" --set data.max_tokens=2 --set 'metrics.positions=[0]' \
  --set 'metrics.report=["attn_kl_mean"]' --set 'metrics.pareto=["attn_kl_mean"]' --out "$tmp/r3n" >"$tmp/pos0.out" 2>&1
[ $? -eq 2 ] || fail "position 0 alone: expected exit 2"
expect "$tmp/pos0.out" "--set metrics.positions: the evaluated positions (list) of the 2-token context are position 0 alone" \
  "position 0 alone"
[ ! -e "$tmp/r3n" ] || fail "input that measures nothing created results"
# A config or a recording that is a FIFO is refused, not waited on.
mkfifo "$tmp/fifo.toml" "$tmp/fifo.safetensors"
"$kvb" run "$tmp/fifo.toml" --out "$tmp/r3n" >"$tmp/fifo.out" 2>&1
[ $? -eq 2 ] || fail "a FIFO config: expected exit 2"
expect "$tmp/fifo.out" "fifo.toml: is a FIFO (named pipe), not a regular file; a config must be a regular file" "a FIFO config"
"$kvb" run "$src/configs/quickstart.toml" --set "data.path=$tmp/fifo.safetensors" --out "$tmp/r3n" >"$tmp/fifo.out" 2>&1
[ $? -eq 1 ] || fail "a FIFO recording: expected exit 1"
expect "$tmp/fifo.out" "fifo.safetensors: is a FIFO (named pipe), not a regular file" "a FIFO recording"
# Seeds: -1 is refused at every level, not wrapped to 2^64 - 1.
"$kvb" run "$src/configs/quickstart.toml" --set seed=-1 --out "$tmp/r3n" >"$tmp/seed.out" 2>&1
[ $? -eq 2 ] || fail "seed = -1: expected exit 2"
expect "$tmp/seed.out" "--set seed: must be >= 0" "seed = -1"

# Synthetic targets the generator cannot reach are warned about and kept in the manifest.
printf '%s\n' 'name = "unreachable"' '[data.synthetic]' 'layers = 1' 'q_heads = 2' 'kv_heads = 2' 'head_dim = 16' \
  'tokens = 64' 'entropy_mean = 100' '[[strategy]]' 'type = "uniform"' 'format = "int4-asym-g16"' >"$tmp/unreachable.toml"
"$kvb" run "$tmp/unreachable.toml" --out "$tmp/ru" --no-plots >"$tmp/u.out" 2>&1 || fail "unreachable synthetic targets: exit $?"
expect "$tmp/u.out" "warning: the synthetic data misses 2 of its targets" "unreachable synthetic targets"
expect "$tmp/ru/unreachable/latest/manifest.json" "entropy target 98.5 bits exceeds the 4.698 bits" "manifest warnings"
"$kvb" run "$tmp/unreachable.toml" --set data.synthetic.seed=-1 --out "$tmp/r3n" >"$tmp/sseed.out" 2>&1
[ $? -eq 2 ] || fail "data.synthetic.seed = -1: expected exit 2"
expect "$tmp/sseed.out" "--set data.synthetic.seed: must be >= 0" "data.synthetic.seed = -1"

# 4. Bad data: exit 1 and a message naming the file / tensor and index.
head -c 5000 "$rec" >"$tmp/truncated.safetensors"
"$kvb" run "$src/configs/quickstart.toml" --set "data.path=$tmp/truncated.safetensors" --out "$tmp/r4" >"$tmp/t.out" 2>&1
[ $? -eq 1 ] || fail "truncated file: expected exit 1"
expect "$tmp/t.out" "truncated.safetensors" "truncated file"

# A hand-made safetensors file with a NaN in layer 0's key at [0, 1, 0].
le64() { local n=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done; }
one='\x00\x00\x80\x3f'
nan='\x00\x00\xc0\x7f'
header='{"layers.0.query":{"dtype":"F32","shape":[1,2,2],"data_offsets":[0,16]},"layers.0.key":{"dtype":"F32","shape":[1,2,2],"data_offsets":[16,32]},"layers.0.value":{"dtype":"F32","shape":[1,2,2],"data_offsets":[32,48]}}'
{
  le64 ${#header}
  printf '%s' "$header"
  printf "$one$one$one$one"   # query
  printf "$one$one$nan$one"   # key: element [0, 1, 0] is NaN
  printf "$one$one$one$one"   # value
} >"$tmp/nan.safetensors"
"$kvb" run "$src/configs/quickstart.toml" --set "data.path=$tmp/nan.safetensors" --out "$tmp/r4" >"$tmp/n.out" 2>&1
[ $? -eq 1 ] || fail "NaN: expected exit 1"
expect "$tmp/n.out" "key[0, 1, 0] is NaN" "NaN in a tensor"

# 5. A point that cannot run beside good ones: tests/experiments/test_runner.cpp (in process).

# 6. Ctrl-C: finished points are written whole, the manifest says interrupted, exit 130.
"$kvb" run "$src/configs/quickstart.toml" --set 'strategy.0.vars.group=[8, 16, 32, 64]' --out "$tmp/r6" \
  --no-plots --threads 1 >"$tmp/i.out" 2>&1 &
pid=$!
# Wait for the first finished point (a header and one row), then interrupt.
for _ in $(seq 1200); do
  [ "$(cat "$tmp"/r6/quickstart/2*/points.csv 2>/dev/null | wc -l)" -ge 2 ] && break
  sleep 0.1
done
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "interrupted run: expected exit 130, got $rc"
d6=$(ls -d "$tmp"/r6/quickstart/2*)
csv_ok "$d6/points.csv" || fail "interrupted points.csv has a truncated row"
rows=$(($(wc -l <"$d6/points.csv") - 1))
[ "$rows" -ge 1 ] && [ "$rows" -lt 56 ] || fail "interrupted run wrote $rows points (expected some, not all)"
expect "$d6/manifest.json" '"status": "interrupted"' "manifest of an interrupted run"
ls "$d6" | grep -q '\.tmp\.' && fail "temporary files left behind"

# Starts a long sweep into $tmp/$1 in the background (through launcher $3, e.g. nohup),
# waits for its manifest (written once the data is loaded), sends signal $2 and waits:
# sets rc and run_dir.
signal_run() {
  local out="$tmp/$1" sig="$2" launcher="${3:-}"
  $launcher "$kvb" run "$src/configs/quickstart.toml" --set 'strategy.0.vars.group=[8, 16, 32, 64]' --out "$out" \
    --no-plots --threads 1 --quiet >"$out.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    ls "$out"/quickstart/2*/manifest.json >/dev/null 2>&1 && break
    sleep 0.1
  done
  kill -"$sig" $pid
  wait $pid
  rc=$?
  run_dir=$(ls -d "$out"/quickstart/2*)
}

# 6b. A fatal signal (a crash, std::terminate's abort): the manifest says "crashed" and
# names the signal instead of claiming "running"; the process still dies of it.
signal_run r6b SEGV
[ $rc -eq 139 ] || fail "a run killed by SIGSEGV: expected exit 139, got $rc"
expect "$run_dir/manifest.json" '"status": "crashed"' "manifest of a crashed run"
expect "$run_dir/manifest.json" '"signal": "SIGSEGV"' "manifest of a crashed run"
[ ! -f "$run_dir/points.csv" ] || csv_ok "$run_dir/points.csv" || fail "crashed run's points.csv has a truncated row"

# 6c. A hangup stops the sweep like Ctrl-C (exit 128 + 1, status "interrupted").
signal_run r6c HUP
[ $rc -eq 129 ] || fail "a run sent SIGHUP: expected exit 129, got $rc"
expect "$run_dir/manifest.json" '"status": "interrupted"' "manifest of a hung-up run"

# 6d. Under nohup (SIGHUP ignored) a hangup does not stop the run.
signal_run r6d HUP nohup
[ $rc -eq 0 ] || fail "a nohup run sent SIGHUP: expected exit 0, got $rc"
expect "$run_dir/manifest.json" '"status": "complete"' "manifest of a nohup run"

# 6e. Ctrl-C while the data loads (a long synthetic generation; a background job
# starts with SIGINT ignored): the run ends at once, exit 130, nothing written.
printf '%s\n' 'name = "slow_load"' '[data.synthetic]' 'layers = 1' 'q_heads = 2' 'head_dim = 64' 'tokens = 60000' \
  '[[strategy]]' 'type = "uniform"' 'format = "int4-asym-g32"' >"$tmp/slow_load.toml"
"$kvb" run "$tmp/slow_load.toml" --out "$tmp/r6e" --no-plots >"$tmp/slow_load.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "loading data" "$tmp/slow_load.out" && break; sleep 0.1; done
start=$(date +%s)
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C while loading: expected exit 130, got $rc"
[ $(($(date +%s) - start)) -le 5 ] || fail "Ctrl-C while loading took $(($(date +%s) - start)) s to stop the run"
expect "$tmp/slow_load.out" "kvbudget run: interrupted while loading the data; nothing was written" "Ctrl-C while loading"
[ ! -e "$tmp/r6e" ] || fail "a run interrupted while loading created results"

# 6f. Ctrl-C during a long layer (8 heads of 12000 tokens take tens of seconds on one
# thread): the sweep stops within a few blocks of query rows, not at the layer's end.
printf '%s\n' 'name = "long_layer"' '[data.synthetic]' 'layers = 1' 'q_heads = 8' 'kv_heads = 1' 'head_dim = 64' \
  'tokens = 12000' 'calibration_queries = 16' '[[strategy]]' 'type = "uniform"' 'format = "int4-asym-g32"' \
  >"$tmp/long_layer.toml"
"$kvb" run "$tmp/long_layer.toml" --out "$tmp/r6f" --no-plots --threads 1 >"$tmp/long_layer.out" 2>&1 &
pid=$!
for _ in $(seq 1200); do ls "$tmp"/r6f/long_layer/2*/manifest.json >/dev/null 2>&1 && break; sleep 0.1; done
start=$(date +%s)
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C during a long layer: expected exit 130, got $rc"
[ $(($(date +%s) - start)) -le 5 ] || fail "Ctrl-C during a long layer took $(($(date +%s) - start)) s to stop the run"
expect "$(ls -d "$tmp"/r6f/long_layer/2*)/manifest.json" '"status": "interrupted"' "manifest of a run stopped mid-layer"

# 7. Backends: auto says in the manifest what it chose and why; cuda runs on a device,
# and without one (or in a build without nvcc) fails before writing any results.
"$kvb" run "$src/configs/quickstart.toml" "${small[@]}" --backend auto --out "$tmp/r7" --no-plots >"$tmp/a.out" 2>&1 \
  || fail "backend auto exited $?"
d7=$(ls -d "$tmp"/r7/quickstart/2*)
expect "$d7/manifest.json" '"backend_requested": "auto"' "manifest of an auto run"
expect "$d7/manifest.json" '"backend_reason": "auto: ' "manifest of an auto run"
grep -Eq '"backend": "(cpu|cuda)"' "$d7/manifest.json" || fail "manifest of an auto run names no backend"
"$kvb" run "$src/configs/quickstart.toml" "${small[@]}" --backend cuda --out "$tmp/r8" --no-plots >"$tmp/c.out" 2>&1
rc=$?
if grep -q '"backend": "cuda"' "$d7/manifest.json"; then  # a device is present
  [ $rc -eq 0 ] || fail "backend cuda with a device exited $rc"
  expect "$(ls -d "$tmp"/r8/quickstart/2*)/manifest.json" '"backend": "cuda"' "manifest of a cuda run"
elif grep -q "built without CUDA" "$tmp/c.out"; then
  [ $rc -eq 2 ] || fail "backend cuda in a build without CUDA: expected exit 2, got $rc"
else
  [ $rc -eq 2 ] || fail "backend cuda without a device: expected exit 2 (as eval's), got $rc"
  expect "$tmp/c.out" 'backend = "cuda": no usable CUDA device' "backend cuda without a device"
  [ ! -e "$tmp/r8" ] || fail "backend cuda without a device created results"
fi
# Which backends measured a folder's points (manifest `point_backends`): the run's own,
# recorded as its first point finishes. A --resume where `auto` chose another backend
# (another machine) keeps both and warns that they mix, and so does a merge of such a
# shard (shards whose last runs used different backends are refused, below); here the
# other backend is written into the manifests by hand.
used7=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["backend"])' "$d7/manifest.json")
other7=$([ "$used7" = cpu ] && echo cuda || echo cpu)
# as_if_measured_on DIR "BACKEND..." [KEEP]: DIR's manifest says those backends measured
# its points, the last one in its last run; with KEEP, results.jsonl keeps its first
# KEEP points (the rest to be resumed).
as_if_measured_on() {
  /usr/bin/python3 - "$@" <<'PY' || fail "as_if_measured_on $*"
import json, sys
d, backends = sys.argv[1], sys.argv[2].split()
m = json.load(open(d + "/manifest.json"))
m["point_backends"], m["backend"] = backends, backends[-1]
json.dump(m, open(d + "/manifest.json", "w"), indent=2)
if len(sys.argv) > 3:
    lines = open(d + "/results.jsonl").read().splitlines()[: int(sys.argv[3])]
    open(d + "/results.jsonl", "w").write("\n".join(lines) + "\n")
PY
}
# manifest_backends DIR EXPECTED WHAT: point_backends is EXPECTED (space-separated) and a
# warning about mixed backends is in the manifest exactly when there are several.
manifest_backends() {
  /usr/bin/python3 - "$1/manifest.json" "$2" <<'PY' || fail "$3: the manifest's point_backends"
import json, sys
m = json.load(open(sys.argv[1]))
want = sys.argv[2].split()
assert m.get("point_backends") == want, (m.get("point_backends"), want)
mixed = [w for w in m.get("warnings", []) if "points were measured on backends" in w]
assert bool(mixed) == (len(want) > 1), m.get("warnings")
PY
}
manifest_backends "$d7" "$used7" "an auto run"
cp -r "$d7" "$tmp/r7mix"
as_if_measured_on "$tmp/r7mix" "$other7" 3
"$kvb" run --resume "$tmp/r7mix" >"$tmp/mix.out" 2>&1 || fail "--resume of points measured on another backend exited $?"
expect "$tmp/mix.out" "points were measured on backends $other7 and $used7" "--resume onto another backend"
manifest_backends "$tmp/r7mix" "$other7 $used7" "--resume onto another backend"
same_numbers() { diff <(numbers "$1") <(numbers "$2") >/dev/null || fail "$3: points.csv differs"; }
same_numbers "$d7/points.csv" "$tmp/r7mix/points.csv" "--resume onto another backend"
for i in 0 1; do
  "$kvb" run "$src/configs/quickstart.toml" "${small[@]}" --backend auto --shard "$i/2" --out "$tmp/r7sh" \
    || fail "shard $i/2 exited $?"
done
sh0=$(ls -d "$tmp"/r7sh/quickstart/*-shard0of2) sh1=$(ls -d "$tmp"/r7sh/quickstart/*-shard1of2)
manifest_backends "$sh1" "$used7" "shard 1/2"
as_if_measured_on "$sh1" "$other7 $used7"  # resumed on another machine
"$kvb" merge "$sh0" "$sh1" --merged-dir "$tmp/r7merged" --quiet >"$tmp/merge_mix.out" 2>&1 \
  || fail "merging shards measured on two backends exited $?"
expect "$tmp/merge_mix.out" "points were measured on backends $used7 and $other7" "merge of shards on two backends"
manifest_backends "$tmp/r7merged" "$used7 $other7" "merge of shards on two backends"
/usr/bin/python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
assert "phase_seconds" not in m, "the merged manifest copies a shard'"'"'s phase_seconds"
assert all("phase_seconds" in s and s["backend"] for s in m["merged_from"]), m["merged_from"]' \
  "$tmp/r7merged/manifest.json" || fail "the merged manifest's per-shard phase_seconds and backend"
as_if_measured_on "$sh1" "$other7"
"$kvb" merge "$sh0" "$sh1" --merged-dir "$tmp/r7merged2" --quiet >"$tmp/merge_other.out" 2>&1
[ $? -eq 1 ] || fail "merging shards whose runs used different backends: expected exit 1"
expect "$tmp/merge_other.out" "backend differs (measured by different backends" "merge of shards on two backends"
"$kvb" run "$src/configs/quickstart.toml" --backend gpu --out "$tmp/r9" >"$tmp/g.out" 2>&1
[ $? -eq 2 ] || fail "unknown backend: expected exit 2"
expect "$tmp/g.out" '--backend: backend must be "cpu", "cuda" or "auto", got "gpu"' "unknown backend"

# Warnings survive merge and --resume: a point whose window covers every token is warned
# of (by the plans of the process that measures it); the merged manifest holds every
# shard's warnings (the union, each once), and a resumed one those of the points it keeps.
cat >"$tmp/warned.toml" <<TOML
name = "warned"
[data]
path = "$rec"
max_tokens = 64
[[strategy]]
name = "u"
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 3, 4, 5]
[[strategy]]
name = "w"
type = "uniform"
format = "int4-asym-g32"
window = 128
[metrics]
pareto = ["attn_kl_mean"]
[output]
plots = false
TOML
# warnings_of DIR: manifest.json's warnings, one a line, sorted.
warnings_of() { /usr/bin/python3 -c 'import json, sys; print("\n".join(sorted(json.load(open(sys.argv[1]))["warnings"])))' "$1/manifest.json"; }
"$kvb" run "$tmp/warned.toml" --quiet --out "$tmp/warned" >"$tmp/warned.out" 2>&1 || fail "the warned run exited $?"
warned=$(ls -d "$tmp"/warned/warned/2*)
expect "$warned/manifest.json" "a window covers all of the recording's 64 tokens" "the warned run's manifest"
for i in 0 1 2; do
  "$kvb" run "$tmp/warned.toml" --quiet --shard "$i/3" --out "$tmp/warned_shards" >/dev/null 2>&1 || fail "warned shard $i/3 exited $?"
done
"$kvb" merge "$tmp"/warned_shards/warned/*-shard*of3 --merged-dir "$tmp/warned_merged" --quiet \
  >"$tmp/warned_merge.out" 2>&1 || fail "merging the warned shards exited $?: $(cat "$tmp/warned_merge.out")"
[ "$(warnings_of "$tmp/warned_merged")" = "$(warnings_of "$warned")" ] \
  || fail "merged warnings '$(warnings_of "$tmp/warned_merged")' are not the single run's '$(warnings_of "$warned")'"
# A resume that keeps only the window's point (the others run again): its warning stays.
cp -r "$warned" "$tmp/warned_resumed"
grep -F 'window=128' "$warned/results.jsonl" >"$tmp/warned_resumed/results.jsonl" || fail "no window point in results.jsonl"
"$kvb" run "$tmp/warned.toml" --resume "$tmp/warned_resumed" --quiet >"$tmp/warned_resume.out" 2>&1 \
  || fail "resuming the warned run exited $?: $(cat "$tmp/warned_resume.out")"
expect "$tmp/warned_resumed/manifest.json" '"points_resumed": 1' "the resumed warned run"
[ "$(warnings_of "$tmp/warned_resumed")" = "$(warnings_of "$warned")" ] \
  || fail "resumed warnings '$(warnings_of "$tmp/warned_resumed")' are not the single run's '$(warnings_of "$warned")'"

exit $status
