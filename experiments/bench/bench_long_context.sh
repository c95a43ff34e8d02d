#!/usr/bin/env bash
# bench_long_context: what a sampled-position run costs as the recording grows. For each
# context length T, `kvbudget run` on a seeded synthetic recording of T tokens with a
# fixed number of evaluated and calibration query positions (near the end, so each reads
# a cache of about T tokens); wall time and peak resident memory (GNU time) per T, and
# the sum of the points' `seconds` (points.csv: plans and measurements, CPU time).
# CPU seconds (user + system, summed over threads) are less sensitive to a loaded
# machine than wall time. Cost linear in T shows as a constant CPU us/token column;
# memory bounded by what the run reads shows as peak RSS growing with the keys and values
# kept (2 x layers x kv_heads x T x head_dim fp32), not with the queries. On a VM whose
# page faults are slow, GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc >= 2.35: huge pages
# for malloc's blocks of 32 MiB and more) takes the first-touch faults of the large
# buffers out of the comparison; the script prints it when set.
#
#   bash experiments/bench/bench_long_context.sh KVBUDGET [T ...]
#
# Environment: LAYERS (2), Q_HEADS (8), KV_HEADS (2), HEAD_DIM (64), POSITIONS (16
# evaluated), CALIBRATION (16 positions), THREADS (0 = all cores), STREAM (data.stream_layers:
# true = one layer held at a time, false = every layer held; unset = automatic, which
# streams from 1 GiB of keys and values, experiments/streaming.h).
set -euo pipefail
kvb=$1
shift
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(8192 16384 32768 65536 131072)
layers=${LAYERS:-2} q_heads=${Q_HEADS:-8} kv_heads=${KV_HEADS:-2} head_dim=${HEAD_DIM:-64}
positions=${POSITIONS:-16} calibration=${CALIBRATION:-16} threads=${THREADS:-0} stream=${STREAM:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf 'kvbudget %s; %s layers, %s/%s q/kv heads, head_dim %s; %s evaluated + %s calibration positions; threads %s; stream_layers %s\n' \
  "$kvb" "$layers" "$q_heads" "$kv_heads" "$head_dim" "$positions" "$calibration" "$threads" "${stream:-auto}"
printf 'machine: %s, %s cores; load average at start: %s; GLIBC_TUNABLES=%s\n' \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "${GLIBC_TUNABLES:-}"
printf '%9s %9s %9s %14s %12s %14s %16s\n' "tokens" "wall (s)" "CPU (s)" "CPU us/token" "points (s)" \
  "peak RSS (MiB)" "K+V fp32 (MiB)"
for T in "${sizes[@]}"; do
  # Evaluated: the last `positions` tokens, every 4th; calibration: the `calibration`
  # before them, every 4th (disjoint from the evaluated ones).
  e0=$((T - 4 * positions))
  c0=$((e0 - 4 * calibration))
  cfg=$work/long_$T.toml
  cat >"$cfg" <<EOF
name = "bench_long_$T"
seed = 0
threads = $threads
$([ -n "$stream" ] && printf '\n[data]\nstream_layers = %s\n' "$stream")

[data.synthetic]
layers = $layers
q_heads = $q_heads
kv_heads = $kv_heads
head_dim = $head_dim
tokens = $T
entropy_mean = 9.0
entropy_spread = 2.0
recency = 2.0
outlier_channels = 2
rope = true
rho_first = 0.01
calibration_queries = 64

[[strategy]]
name = "flat"
type = "uniform"
key_format = "int4-asym-ch32"
value_format = "int4-asym-g32"

[[strategy]]
preset = "kivi-2"

[[strategy]]
name = "entropy"
type = "entropy"
budget_bpe = 4.0
family = "int{b}-asym-g32"
alpha = 0.25

[calibration]
positions = "$c0..$((e0 - 1)):4"

[metrics]
positions = "$e0..$((T - 1)):4"

[output]
dir = "$work/results"
plots = false
target_context = $T
EOF
  out=$(/usr/bin/time -f "%e %U %S %M" "$kvb" run "$cfg" 2>&1 >/dev/null | tail -1)
  read -r wall user sys rss_kib <<<"$out"
  csv=$(ls -d "$work"/results/bench_long_"$T"/*/ | tail -1)points.csv
  point_s=$(/usr/bin/python3 -c 'import csv,sys; print(sum(float(r["seconds"]) for r in csv.DictReader(open(sys.argv[1]))))' "$csv")
  awk -v T="$T" -v w="$wall" -v c="$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" -v p="$point_s" \
    -v k="$rss_kib" -v L="$layers" -v G="$kv_heads" -v d="$head_dim" \
    'BEGIN { printf "%9d %9.2f %9.2f %14.1f %12.2f %14.1f %16.1f\n", T, w, c, c * 1e6 / T, p, k / 1024, 2 * L * G * T * d * 4 / 2^20 }'
done
printf 'load average at end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
