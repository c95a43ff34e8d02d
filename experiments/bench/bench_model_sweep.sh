#!/usr/bin/env bash
# bench_model_sweep: a model-level sweep at a long context (issue 21's target: 20 points
# at 4096 tokens on a Llama-3-8B-shaped model in under 2 minutes on one H100), timed as a
# user runs it: `kvbudget run` of a config whose data is the model's own forward pass.
#
#   bash experiments/bench/bench_model_sweep.sh KVBUDGET CHECKPOINT_DIR [TOKENS] [BACKEND] [PRECISION]
#
# CHECKPOINT_DIR: a Hugging Face checkpoint without a tokenizer is fine (random-weight
# ones from experiments/bench/make_checkpoint.py or scripts/check_logits_hf.py --keep):
# the text is TOKENS deterministic token ids (default 4096; one window, n_ctx 0). The
# sweep: 20 points, uniform int{2..6}-{sym,asym}-g{32,64}, teacher-forced next-token
# metrics (PPL, KL, same-top) against the exact run, no continuations. Prints the whole
# command's wall time (load, exact run, 20 points, reports) and peak RSS, the manifest's
# wall time, the wall time per point after the first (from the times its progress lines
# arrive) and each point's `seconds` from points.csv.
set -euo pipefail
kvb=$1 dir=$2 T=${3:-4096} backend=${4:-cuda} precision=${5:-fp32}
work=$(mktemp -d /tmp/kvb-model-sweep.XXXXXX)
trap 'rm -rf "$work"' EXIT
vocab=$(/usr/bin/env python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$dir/config.json")
awk -v n="$T" -v v="$vocab" 'BEGIN { for (i = 0; i < n; ++i) printf "%d ", (i * 7919 + 13) % v; print "" }' >"$work/ids.txt"
cat >"$work/sweep.toml" <<TOML
name = "model_sweep"
seed = 0
backend = "$backend"
precision = "$precision"
[data]
source = "model"
model = "$dir"
token_file = "$work/ids.txt"
max_tokens = 0
continuations = 0
[[strategy]]
type = "uniform"
format = "int{bits}-{mode}-g{group}"
[strategy.vars]
bits = "2..6"
mode = ["sym", "asym"]
group = [32, 64]
[metrics]
report = ["ppl", "ppl_ratio", "next_token_kl_mean", "same_top_rate"]
TOML
[ "$backend" = cpu ] && sed -i '/^precision = /d' "$work/sweep.toml"
echo "model sweep: $dir, $T tokens, backend $backend, precision $precision; load $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
# Progress lines ("point i/n done ...") stamped as they arrive: the wall time per point.
/usr/bin/time -o "$work/time.log" -f "%e s wall, %M KiB peak RSS" "$kvb" run "$work/sweep.toml" --out "$work/results" \
  --no-plots 2>&1 >"$work/run.log" | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done \
  >"$work/progress" || { cat "$work/run.log" "$work/progress" "$work/time.log"; exit 1; }
wall=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
tail -1 "$work/time.log"
/usr/bin/env python3 - "$work/results/model_sweep/latest" "$wall" "$work/progress" <<'PY'
import csv, json, re, sys
d, wall = sys.argv[1], float(sys.argv[2])
stamps = [float(l.split()[0]) for l in open(sys.argv[3]) if re.match(r"\S+ point \d+/\d+ done", l)]
m = json.load(open(f"{d}/manifest.json"))
rows = list(csv.DictReader(open(f"{d}/points.csv")))
secs = [float(r["seconds"]) for r in rows]
print(f"{len(rows)} points in {wall:.1f} s wall (manifest wall_seconds {m.get('wall_seconds', float('nan')):.1f}); "
      f"points' seconds: sum {sum(secs):.1f}, mean {sum(secs) / len(secs):.2f}, min {min(secs):.2f}, max {max(secs):.2f}")
if len(stamps) > 1:
    print(f"wall per point after the first: {(stamps[-1] - stamps[0]) / (len(stamps) - 1):.2f} s "
          f"(between the first and last points' progress lines); before the first point's line: "
          f"load, exact run and first point")
print("| point | seconds | ppl_ratio | next_token_kl_mean | same_top_rate |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['plan'].split()[0].removeprefix('K:')} | {float(r['seconds']):.2f} | {float(r['ppl_ratio']):.4f} | "
          f"{float(r['next_token_kl_mean']):.4g} | {float(r['same_top_rate']):.4f} |")
PY
