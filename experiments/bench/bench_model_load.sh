#!/usr/bin/env bash
# bench_model_load: how long a checkpoint takes to load and how much memory it holds,
# against reading its files (the disk's limit), side by side in one run.
#
#   bash experiments/bench/bench_model_load.sh CHECKPOINT_DIR KVBUDGET [KVBUDGET ...]
#
# CHECKPOINT_DIR: a Hugging Face checkpoint (experiments/bench/make_checkpoint.py writes
# random-weight ones with real models' shapes). Each KVBUDGET binary (e.g. the current
# build and an older one) runs `eval` on 2 tokens, which is all loading: wall time and
# peak resident memory (GNU time) are reported against the checkpoint's size and the
# time `cat` takes to read its files. Run it twice: the first read may come from the disk,
# later ones from the page cache; the report says which the peer saw by its rate.
set -euo pipefail
dir=$1
shift
files=("$dir"/*.safetensors)
bytes=$(cat "${files[@]}" | wc -c)
tokens=$(mktemp)
echo "1 2" >"$tokens"
t0=$(date +%s.%N)
cat "${files[@]}" >/dev/null
read_s=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
printf 'checkpoint %s: %.2f GiB in %d file(s); load average %s\n' "$dir" "$(awk -v b="$bytes" 'BEGIN { print b / 2^30 }')" \
  "${#files[@]}" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-40s %9s %12s %14s %12s\n' "what" "wall (s)" "x read time" "peak RSS (GiB)" "x checkpoint"
printf '%-40s %9.2f %12s %14s %12s\n' "cat (read the files)" "$read_s" "1.00" "-" "-"
for kvb in "$@"; do
  out=$(/usr/bin/time -f "%e %M" "$kvb" eval "$dir" --tokens "$tokens" --max-tokens 2 2>&1 >/dev/null | tail -1)
  wall=${out% *}
  rss_kib=${out#* }
  awk -v w="$wall" -v r="$read_s" -v k="$rss_kib" -v b="$bytes" -v n="$kvb eval (2 tokens)" \
    'BEGIN { printf "%-40s %9.2f %12.2f %14.2f %12.2f\n", n, w, w / r, k / 2^20, k * 1024 / b }'
done
rm -f "$tokens"
