#!/usr/bin/env bash
# bench_cpu_threads: parallel efficiency of the CPU backend from 1 to N threads (issue 20,
# goal 5: >= 70 % from 1 to 16 threads on the Llama-3-8B shape), one process per thread
# count, side by side in one run, whole run and phase by phase.
#
#   bash experiments/bench/bench_cpu_threads.sh KVBUDGET [THREADS...] [-- LAYERS Q_HEADS KV_HEADS TOKENS HEAD_DIM]
#
# Defaults: threads 1 2 4 8 16 (those above this machine's cores are skipped) and 4
# layers of the Llama-3-8B shape (32 query / 8 KV heads, 2048 tokens, head_dim 128):
# 32 (layer, KV head) tasks, two for each of 16 threads (16 layers took 81 s on one
# thread of the GPU machine's host, too long for a device call). One point (uniform
# int4-asym-g32, every attention metric at every position), `kvbudget run --backend cpu
# --threads N`; the time is the manifest's wall_seconds (the whole run: the synthetic
# recording's generation, layer after layer, each in parallel inside; the point,
# parallel over (layer, KV head) tasks, its exact pass inline since one point measures
# each layer once; its merge, metrics and bootstrap intervals on one thread).
# Efficiency at N threads = time(1) / (N x time(N)) (time(1): the first count's time x
# that count). Prints two Markdown tables: the whole run, then each phase of the
# manifest's phase_seconds (README.md: data = generation and validation, identity,
# plans, exact_pass, points = the task loop, finalize = the point's merge, metrics and
# intervals, inside points; rest = wall time outside the phases) with its seconds and
# efficiency at every count, so the phase that does not scale is read off (a binary
# without phase_seconds prints the first table only). Identical numbers at every thread
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
ran=()
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
  ran+=("$n")
done
[ ${#ran[@]} -gt 0 ] || exit 0
# Phase by phase: seconds and efficiency against the first count, per phase.
/usr/bin/python3 - "$work" "${ran[@]}" <<'PY'
import json, sys
work, counts = sys.argv[1], [int(n) for n in sys.argv[2:]]
manifests = [json.load(open(f"{work}/t{n}/threads/latest/manifest.json")) for n in counts]
if any("phase_seconds" not in m for m in manifests):
    print("\n(no phase_seconds in this binary's manifest: no phase table)")
    sys.exit(0)
order = ["data", "identity", "plans", "exact_pass", "points", "finalize", "reports"]
phases = [p for p in order if p in manifests[0]["phase_seconds"]]
phases += sorted(set(manifests[0]["phase_seconds"]) - set(order))
rows = []
for m in manifests:
    ph = dict(m["phase_seconds"])
    ph["rest"] = m["wall_seconds"] - sum(v for k, v in ph.items() if k != "finalize")
    rows.append(ph)
cols = phases + ["rest"]
print()
print("| threads | " + " | ".join(f"{c} s (eff.)" for c in cols) + " |")
print("|---:|" + "---:|" * len(cols))
first = counts[0]
for n, ph in zip(counts, rows):
    cells = []
    for c in cols:
        base, t = rows[0][c] * first, ph[c]
        eff = f" ({100 * base / (n * t):.0f} %)" if n != first and t > 0.005 and base > 0.005 else ""
        cells.append(f"{t:.2f}{eff}")
    print(f"| {n} | " + " | ".join(cells) + " |")
# Serial share of the first count's time that each phase adds at the last count: its
# time there beyond a perfect split of its first-count time (seconds), i.e. what keeps
# the whole run from N-fold speed-up.
if len(counts) > 1:
    n = counts[-1]
    lost = {c: rows[-1][c] - rows[0][c] * first / n for c in cols if c != "finalize"}
    total = sum(lost.values())
    print(f"\nSeconds lost at {n} threads to imperfect scaling (time({n}) - time({first}) x {first}/{n}), by phase: " +
          ", ".join(f"{c} {v:.2f}" for c, v in sorted(lost.items(), key=lambda kv: -kv[1])) + f"; total {total:.2f}")
PY
