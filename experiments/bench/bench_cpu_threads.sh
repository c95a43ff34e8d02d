#!/usr/bin/env bash
# bench_cpu_threads: parallel efficiency of the CPU backend from 1 to N threads (issue 20,
# goal 5: >= 70 % from 1 to 16 threads on the Llama-3-8B shape), one process per thread
# count, side by side in one run.
#
#   bash experiments/bench/bench_cpu_threads.sh KVBUDGET [THREADS...] [-- LAYERS Q_HEADS KV_HEADS TOKENS HEAD_DIM]
#
# Defaults: threads 1 2 4 8 16 (those above this machine's cores are skipped) and 4
# layers of the Llama-3-8B shape (32 query / 8 KV heads, 2048 tokens, head_dim 128):
# 32 (layer, KV head) tasks, two for each of 16 threads (16 layers took 81 s on one
# thread of the GPU machine's host, too long for a device call). One point (uniform int4-asym-g32, every attention
# metric at every position), `kvbudget run --backend cpu --threads N`; the time is the
# manifest's wall_seconds (the whole run: the synthetic recording's generation, layer
# after layer, each in parallel inside; the point, parallel over (layer, KV head) tasks,
# its exact pass inline since one point measures each layer once; its merge, metrics and
# bootstrap intervals on one thread). Efficiency at N threads = time(1) / (N x time(N)). Prints a Markdown table; identical numbers at every thread
# count are checked (points.csv, the timing columns aside).
set -euo pipefail
kvb=$1
shift
threads=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do threads+=("$1"); shift; done
[ $# -gt 0 ] && shift
L=${1:-4} QH=${2:-32} KVH=${3:-8} T=${4:-2048} D=${5:-128}
[ ${#threads[@]} -gt 0 ] || threads=(1 2 4 8 16)
cores=$(nproc)
work=$(mktemp -d /tmp/kvb-threads.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/threads.toml" <<TOML
name = "threads"
seed = 0
[data.synthetic]
layers = $L
q_heads = $QH
kv_heads = $KVH
head_dim = $D
tokens = $T
entropy_mean = 9.0
entropy_spread = 4.0
[[strategy]]
type = "uniform"
format = "int4-asym-g32"
[calibration]
overlap = true
[metrics]
positions = "all"
TOML
echo "shape: $L layers x $QH query / $KVH KV heads x $T tokens x head_dim $D; $cores cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| threads | wall s | speed-up | efficiency |"
echo "|---:|---:|---:|---:|"
base=""
for n in "${threads[@]}"; do
  if [ "$n" -gt "$cores" ]; then echo "| $n | (skipped: $cores cores) | | |"; continue; fi
  "$kvb" run "$work/threads.toml" --backend cpu --threads "$n" --out "$work/t$n" --no-plots -q >"$work/t$n.log" 2>&1 ||
    { cat "$work/t$n.log"; exit 1; }
  wall=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["wall_seconds"])' \
    "$work/t$n/threads/latest/manifest.json")
  /usr/bin/python3 - "$work/t$n/threads/latest/points.csv" >"$work/t$n.numbers" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print({k: v for k, v in r.items() if "second" not in k})
PY
  [ -z "$base" ] && { base=$wall; first=$n; cp "$work/t$n.numbers" "$work/first.numbers"; }
  cmp -s "$work/first.numbers" "$work/t$n.numbers" || { echo "the numbers differ between $first and $n threads"; exit 1; }
  awk -v b="$base" -v w="$wall" -v n="$n" -v f="$first" \
    'BEGIN { s = b / w; printf "| %d | %.2f | %.2f | %.0f %% |\n", n, w, s, 100 * s * f / n }'
done
