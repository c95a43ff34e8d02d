#!/usr/bin/env bash
# Long contexts with sampled query positions (configs/long_context_128k.toml scaled down
# to one layer of small heads): a 131072-token synthetic recording whose run keeps the
# queries of its calibration and evaluated positions only, and no pre-RoPE keys. Its
# numbers equal those of the same run keeping every query (calibration positions set to
# every position: neither strategy calibrates, so the numbers stay), and its peak memory
# is lower by at least a quarter of what it did not keep. Peak memory is the kernel's count for each run
# (getrusage of the finished child), not a timing. The two peaks need not fall in the
# same phase of their runs: a CUDA-enabled build adds 160 to 215 MiB to each (the CUDA
# libraries, unequally), and there the difference was 69 MiB of the 144 not kept,
# against 127 without CUDA (2026-11-26, this machine).
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail, 77 skipped.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

T=131072
cat >"$tmp/long.toml" <<TOML
name = "long"
[data.synthetic]
layers = 1
q_heads = 8
kv_heads = 1
head_dim = 32
tokens = $T
entropy_mean = 9.0
entropy_spread = 2.0
recency = 2.0
rope = true
rho_first = 0.01
calibration_queries = 8
[[strategy]]
type = "uniform"
key_format = "int4-asym-ch32"
value_format = "int4-asym-g32"
[[strategy]]
preset = "kivi-2"
[calibration]
positions = "130944..131007:8"
[metrics]
positions = "131008..131071:8"
[output]
target_context = $T
plots = false
TOML

# run NAME [OPTION...]: kvbudget run (CPU backend) into $tmp/NAME; prints the child's
# peak RSS in KiB.
run() {
  /usr/bin/python3 -c 'import resource, subprocess, sys
with open(sys.argv[1], "w") as err:
    r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=err)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(r.returncode)' "$tmp/$1.err" "$kvb" run "$tmp/long.toml" --out "$tmp/$1" --backend cpu "${@:2}"
}

kept_kib=$(run kept) || fail "the sampled run exited non-zero: $(tail -3 "$tmp/kept.err")"
all_kib=$(run all --set 'calibration.positions="0..131071"' --set calibration.overlap=true) ||
  fail "the run reading every position exited non-zero: $(tail -3 "$tmp/all.err")"
[ $status -eq 0 ] || exit $status

# What each run kept, as the console says: 16 sampled positions (8 + 8), no pre-RoPE keys.
expect "$tmp/kept.err" "131072 tokens, post-RoPE (theta 10000), queries at 16 positions" "the cpu run's recording"
grep -q "pre-RoPE keys" "$tmp/kept.err" && fail "the cpu run kept pre-RoPE keys no point reads"
grep -q "queries at" "$tmp/all.err" && fail "the run reading every position kept only sampled queries"

# The same numbers, every column but the timing.
numbers "$tmp/kept/long/latest/points.csv" >"$tmp/kept.numbers"
numbers "$tmp/all/long/latest/points.csv" >"$tmp/all.numbers"
[ "$(wc -l <"$tmp/kept.numbers")" -eq 2 ] || fail "expected 2 points, got $(cat "$tmp/kept.numbers")"
cmp -s "$tmp/kept.numbers" "$tmp/all.numbers" || fail "sampled queries changed the numbers:
$(diff "$tmp/kept.numbers" "$tmp/all.numbers" | head -6)"

# Not kept: 8 query heads x (T - 16) positions x 32 dims and T x 32 pre-RoPE keys, fp32.
dropped_kib=$(( (8 * (T - 16) * 32 + T * 32) * 4 / 1024 ))
echo "peak RSS: $kept_kib KiB keeping sampled queries, $all_kib KiB keeping every query; $dropped_kib KiB not kept"
[ $((all_kib - kept_kib)) -ge $((dropped_kib / 4)) ] ||
  fail "peak RSS $kept_kib KiB with sampled queries is not below $all_kib KiB by a quarter of the $dropped_kib KiB not kept"
exit $status
