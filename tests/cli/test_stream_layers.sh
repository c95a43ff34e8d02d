#!/usr/bin/env bash
# data.stream_layers (experiments/streaming.h): a run holding one layer of its synthetic
# recording at a time says so, and gives the held run's numbers and data identity (a
# taqg point's ρ computed in the first pass among them); a run that cannot stream (an
# optimal point measures distortion tables on the layers while planning) is refused with
# the reason when stream_layers = true, before anything is written; points that plan on
# no statistics stream in one pass, with the held run's numbers and identity. (The memory bound
# is counted in tests/experiments/test_streaming.cpp; peak RSS is measured by
# experiments/bench/bench_long_context.sh, not asserted.)
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

cat >"$tmp/stream.toml" <<TOML
name = "stream"
[data.synthetic]
layers = 4
q_heads = 4
kv_heads = 2
head_dim = 32
tokens = 4096
entropy_mean = 7.0
recency = 1.0
sink_heads = 1
rope = true
rho_first = 0.02
calibration_queries = 16
[[strategy]]
type = "uniform"
key_format = "int{bits}-asym-ch32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4]
[[strategy]]
type = "entropy"
budget_bpe = 4.0
family = "int{b}-asym-g32"
[[strategy]]
type = "taqg"
budget_bpe = 4.0
family = "int{b}-asym-g32"
rho_layers = [3, 1]
[calibration]
positions = "3900..3995:8"
[metrics]
positions = "3996..4095:4"
[output]
plots = false
TOML

for mode in true false; do
  "$kvb" run "$tmp/stream.toml" --out "$tmp/$mode" --backend cpu --set data.stream_layers=$mode \
    >/dev/null 2>"$tmp/$mode.err" || fail "stream_layers = $mode exited non-zero: $(tail -3 "$tmp/$mode.err")"
done
[ $status -eq 0 ] || exit $status
expect "$tmp/true.err" "layers streamed, one held at a time" "the streamed run's recording line"
grep -q "layers streamed" "$tmp/false.err" && fail "stream_layers = false streamed the layers"

numbers "$tmp/true/stream/latest/points.csv" >"$tmp/true.numbers"
numbers "$tmp/false/stream/latest/points.csv" >"$tmp/false.numbers"
[ "$(wc -l <"$tmp/true.numbers")" -eq 4 ] || fail "expected 4 points, got $(cat "$tmp/true.numbers")"
cmp -s "$tmp/true.numbers" "$tmp/false.numbers" || fail "streaming changed the numbers:
$(diff "$tmp/true.numbers" "$tmp/false.numbers" | head -6)"
identity() { grep -o '"data_identity": "[0-9a-f]*"' "$1/stream/latest/manifest.json"; }
[ -n "$(identity "$tmp/true")" ] && [ "$(identity "$tmp/true")" = "$(identity "$tmp/false")" ] ||
  fail "data identity differs: $(identity "$tmp/true") streamed, $(identity "$tmp/false") held"

# Only points whose plans read no statistics or rho (uniform, KIVI-2): one pass, each
# layer generated once; the held run's numbers and identity.
sed -n '1,/^\[\[strategy\]\]/p' "$tmp/stream.toml" | sed '$d' >"$tmp/flat.toml"
cat >>"$tmp/flat.toml" <<TOML
[[strategy]]
type = "uniform"
key_format = "int{bits}-asym-ch32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4]
[[strategy]]
preset = "kivi-2"
[metrics]
positions = "3996..4095:4"
[output]
plots = false
TOML
for mode in true false; do
  "$kvb" run "$tmp/flat.toml" --out "$tmp/flat_$mode" --backend cpu --set data.stream_layers=$mode \
    >/dev/null 2>"$tmp/flat_$mode.err" || fail "flat, stream_layers = $mode exited non-zero: $(tail -3 "$tmp/flat_$mode.err")"
done
[ $status -eq 0 ] || exit $status
expect "$tmp/flat_true.err" "layers streamed, one held at a time, in one pass" "the one-pass run's recording line"
grep -q "in one pass" "$tmp/true.err" && fail "a run with an entropy point streamed in one pass"
numbers "$tmp/flat_true/stream/latest/points.csv" >"$tmp/flat_true.numbers"
numbers "$tmp/flat_false/stream/latest/points.csv" >"$tmp/flat_false.numbers"
[ "$(wc -l <"$tmp/flat_true.numbers")" -eq 3 ] || fail "expected 3 points, got $(cat "$tmp/flat_true.numbers")"
cmp -s "$tmp/flat_true.numbers" "$tmp/flat_false.numbers" || fail "streaming in one pass changed the numbers:
$(diff "$tmp/flat_true.numbers" "$tmp/flat_false.numbers" | head -6)"
[ -n "$(identity "$tmp/flat_true")" ] && [ "$(identity "$tmp/flat_true")" = "$(identity "$tmp/flat_false")" ] ||
  fail "data identity differs: $(identity "$tmp/flat_true") streamed in one pass, $(identity "$tmp/flat_false") held"
grep -q '"status": "complete"' "$tmp/flat_true/stream/latest/manifest.json" || fail "the one-pass run is not complete"

# An optimal point: refused with stream_layers = true, nothing written.
cat "$tmp/stream.toml" - >"$tmp/optimal.toml" <<TOML
[[strategy]]
type = "optimal"
budget_bpe = 4.0
family = "int{b}-asym-g32"
TOML
if "$kvb" run "$tmp/optimal.toml" --out "$tmp/optimal" --backend cpu --set data.stream_layers=true \
  >/dev/null 2>"$tmp/optimal.err"; then
  fail "a streamed run with an optimal point succeeded"
fi
expect "$tmp/optimal.err" "data.stream_layers: stream_layers = true, but this run cannot stream its layers" \
  "the refusal"
expect "$tmp/optimal.err" "strategy type 'optimal' reads the recording's tensors" "the refusal's reason"
[ -e "$tmp/optimal/stream" ] && fail "the refused run wrote $tmp/optimal/stream"
exit $status
