#!/usr/bin/env bash
# bench_generate: `kvbudget generate` as a user runs it, timed per cache format, for one or
# more kvbudget binaries side by side (rounds alternate between them, so that a before /
# after pair meets the same load).
#
#   bash experiments/bench/bench_generate.sh [-n TOKENS] [-r ROUNDS] [-m MODEL_DIR] [-f "FORMAT ..."]
#                                           KVBUDGET [KVBUDGET ...]
#
# Each run: greedy continuations of TOKENS new tokens (default 1500, --ignore-eos) after a
# short prompt, the exact cache beside a cache in the format (generate always decodes
# both), on the bundled reasoning-bytes model unless -m names another; OMP_NUM_THREADS=1
# unless the caller's environment sets it (one thread: the other core's load matters
# less). Formats: int4-asym-g32 (per-token groups), int2-asym-ch32 (groups of 32 tokens
# along tokens), the kivi-2 strategy (KIVI: ch32 keys, a 128-token fp16 residual window)
# and nvfp4 (a tensor scale fitted to the whole span: the history is re-quantized only
# when a new token moves it); -f replaces the list (format names or strategy presets).
# Prints each run's wall seconds and, per binary and format, the fastest and the
# median, with the load average before each round, and checks that every binary printed
# the same continuations.
set -euo pipefail
tokens=1500 rounds=3 model=
formats=(int4-asym-g32 int2-asym-ch32 kivi-2 nvfp4)
while getopts "n:r:m:f:" opt; do
  case $opt in
    n) tokens=$OPTARG ;;
    r) rounds=$OPTARG ;;
    m) model=$OPTARG ;;
    f) read -r -a formats <<<"$OPTARG" ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,20p' "$0"; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${model:-$root/data/models/reasoning-bytes}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
work=$(mktemp -d /tmp/kvb-generate.XXXXXX)
trap 'rm -rf "$work"' EXIT
# A strategy preset (a name `kvbudget strategies` lists under its presets: kivi-2,
# hf-quanto-int4, ...) goes to --strategy, anything else to --format.
presets=$("$1" strategies | awk '/^Presets/ { p = 1; next } p && /^  [^ ]/ { print $1 }')
plan_args() { if grep -qxF -- "$1" <<<"$presets"; then echo --strategy "$1"; else echo --format "$1"; fi; }
prompt="Q: Start with 21. Then add 52, add 11, halve. What are the values along the way?
<think>"
echo "generate: $model, $tokens new tokens, OMP_NUM_THREADS=$OMP_NUM_THREADS, $rounds rounds; $(getconf _NPROCESSORS_ONLN) CPUs"
for ((r = 1; r <= rounds; ++r)); do
  echo "round $r: load $(cut -d' ' -f1-3 /proc/loadavg)"
  for f in "${formats[@]}"; do
    for ((b = 1; b <= $#; ++b)); do
      kvb=${!b}
      t0=$(date +%s.%N)
      "$kvb" generate "$model" --prompt "$prompt" -n "$tokens" --ignore-eos $(plan_args "$f") --json >"$work/out.$b.$f.json"
      secs=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')
      echo "$b $f $secs" >>"$work/times"
      printf '  %-16s binary %d (%s): %6.2f s\n' "$f" "$b" "$kvb" "$secs"
    done
  done
done
echo "per binary and format: fastest / median of $rounds (s)"
for f in "${formats[@]}"; do
  for ((b = 1; b <= $#; ++b)); do
    awk -v b="$b" -v f="$f" '$1 == b && $2 == f { print $3 }' "$work/times" | sort -n |
      awk -v b="$b" -v f="$f" '{ t[NR] = $1 } END { printf "  %-16s binary %d: %6.2f / %6.2f\n", f, b, t[1], t[int((NR + 1) / 2)] }'
  done
done
# The continuations must not depend on the binary (the JSON holds no timings).
for f in "${formats[@]}"; do
  for ((b = 2; b <= $#; ++b)); do
    cmp -s "$work/out.1.$f.json" "$work/out.$b.$f.json" || echo "  DIFFERENT output for $f: binary 1 and $b"
  done
done
