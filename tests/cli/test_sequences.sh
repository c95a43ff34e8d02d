#!/usr/bin/env bash
# Several sequences in one config (configs/README.md "Several sequences", docs/methods.md
# §4): two recordings of two texts, every point measured on each; points.csv holds the
# mean over them with intervals from the two-level bootstrap, points_by_sequence.csv
# each sequence's rows, comparisons.csv verdicts paired within sequences; a list of one
# recording gives the single form's numbers; a missing file names its entry; sequences
# of different lengths are refused until max_tokens cuts them alike, and so are points
# whose memory differs by sequence.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
gpt2="$src/data/models/gpt2-bytes"

# Two recordings of 160 tokens of two texts, and a shorter one.
"$kvb" record "$gpt2" --text "$src/data/text/eval_kjv_revelation.txt" --max-tokens 160 --out "$tmp/a.safetensors" \
  >"$tmp/rec.out" 2>&1 || fail "record a: $(cat "$tmp/rec.out")"
"$kvb" record "$gpt2" --text "$src/data/text/eval_fortunes_science_work.txt" --max-tokens 160 \
  --out "$tmp/b.safetensors" >"$tmp/rec.out" 2>&1 || fail "record b: $(cat "$tmp/rec.out")"
"$kvb" record "$gpt2" --text "$src/data/text/eval_fortunes_science_work.txt" --max-tokens 96 \
  --out "$tmp/short.safetensors" >"$tmp/rec.out" 2>&1 || fail "record short: $(cat "$tmp/rec.out")"

config() {  # config NAME DATA_LINE
  cat >"$tmp/$1.toml" <<TOML
name = "$1"
[data]
$2
[[strategy]]
name = "uniform"
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 3, 4]
[[strategy]]
name = "8-bit keys"
type = "uniform"
key_format = "int8-asym-g32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 3]
[metrics]
report = ["attn_kl_mean", "attn_kl_p99", "attn_out_rel_err", "topk_overlap"]
baseline = "uniform"
[output]
plots = false
TOML
}

config two "recordings = [\"$tmp/a.safetensors\", \"$tmp/b.safetensors\"]"
"$kvb" run "$tmp/two.toml" --out "$tmp/r" >"$tmp/two.out" 2>&1 || fail "two-recording run exited $?: $(cat "$tmp/two.out")"
config a "path = \"$tmp/a.safetensors\""
config b "path = \"$tmp/b.safetensors\""
for n in a b; do
  "$kvb" run "$tmp/$n.toml" --quiet --out "$tmp/r" >"$tmp/$n.out" 2>&1 || fail "run $n exited $?: $(cat "$tmp/$n.out")"
done
d="$tmp/r/two/latest"
for f in points.csv points_by_sequence.csv comparisons.csv; do
  [ -f "$d/$f" ] || fail "no $f"
  csv_ok "$d/$f" || fail "$f has ragged rows"
done
expect "$d/manifest.json" '"sequences"' "the manifest"
expect "$d/manifest.json" "two-level (hierarchical) percentile bootstrap" "the manifest's interval method"
/usr/bin/python3 - "$d" "$tmp/r/a/latest" "$tmp/r/b/latest" <<'PY' || fail "the aggregate over two recordings is wrong"
import csv, sys
d, a, b = sys.argv[1:]
rows = lambda p: list(csv.DictReader(open(p)))
points, pa, pb = rows(f"{d}/points.csv"), rows(f"{a}/points.csv"), rows(f"{b}/points.csv")
by_seq = rows(f"{d}/points_by_sequence.csv")
assert len(points) == len(pa) == len(pb) == 5, (len(points), len(pa), len(pb))
assert len(by_seq) == 10 and {r["sequence"] for r in by_seq} == {"0", "1"}, by_seq
assert by_seq[0]["source"].endswith("a.safetensors") and by_seq[-1]["source"].endswith("b.safetensors")
metrics = ["attn_kl_mean", "attn_kl_p99", "attn_out_rel_err", "topk_overlap"]
for p, x, y in zip(points, pa, pb):
    assert p["key"] == x["key"] == y["key"]
    assert p["bpe"] == x["bpe"] == y["bpe"]  # memory is the same on both
    for m in metrics:
        # The mean over the two recordings of each one's own run.
        mean = (float(x[m]) + float(y[m])) / 2
        assert abs(float(p[m]) - mean) <= 1e-12 * max(1.0, abs(mean)), (p["key"], m, p[m], mean)
        # Each sequence's row is that recording's own run.
        seq = [r for r in by_seq if r["id"] == p["id"]]
        assert [float(r[m]) for r in seq] == [float(x[m]), float(y[m])], (p["key"], m)
        # The interval over sequences and blocks holds the per-sequence noise and the
        # spread between the two texts: at least as wide as either one's own.
        lo, hi = float(p[m + "_lo"]), float(p[m + "_hi"])
        assert lo <= hi, (p["key"], m)
        if m != "topk_overlap" and float(x[m]) != float(y[m]):
            assert hi - lo >= 0.5 * min(float(x[m + "_hi"]) - float(x[m + "_lo"]),
                                        float(y[m + "_hi"]) - float(y[m + "_lo"])), (p["key"], m)
comparisons = rows(f"{d}/comparisons.csv")
assert comparisons, "no comparisons"
for r in comparisons:
    lo, hi = float(r["difference_lo"]), float(r["difference_hi"])
    excludes = lo > 0 or hi < 0
    assert (r["verdict"] in ("better", "worse")) == excludes, r
    assert r["verdict"] in ("better", "worse", "no measurable difference"), r
    assert r["value"] == next(p for p in points if p["id"] == r["id"])[r["metric"]], r
# 8-bit keys are measurably better in attention KL than the same value width with
# 3-bit or fewer keys, on both texts.
keys8 = [r for r in comparisons if r["strategy"] == "8-bit keys" and r["metric"] == "attn_kl_mean"]
assert len(keys8) == 2 and all(r["verdict"] == "better" for r in keys8), keys8
PY

# Shards of the two-recording run merge into the same comparisons (the per-sequence
# block sums travel in results.jsonl).
for i in 0 1; do
  "$kvb" run "$tmp/two.toml" --quiet --shard "$i/2" --out "$tmp/sh" >"$tmp/sh$i.out" 2>&1 \
    || fail "shard $i/2 exited $?: $(cat "$tmp/sh$i.out")"
done
"$kvb" merge "$tmp"/sh/two/*-shard* --merged-dir "$tmp/merged" >"$tmp/merge.out" 2>&1 || fail "merge exited $?: $(cat "$tmp/merge.out")"
cmp -s "$d/comparisons.csv" "$tmp/merged/comparisons.csv" || fail "merged comparisons.csv differs from the single run's"
/usr/bin/python3 - "$d/points_by_sequence.csv" "$tmp/merged/points_by_sequence.csv" <<'PY' || fail "merged points_by_sequence.csv differs from the single run's"
import csv, sys
rows = lambda p: [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(open(p))]
assert rows(sys.argv[1]) == rows(sys.argv[2])
PY

# A model on two texts: the model-level metrics aggregate too.
cat >"$tmp/texts.toml" <<TOML
name = "texts"
[data]
source = "model"
model = "$gpt2"
texts = ["$src/data/text/eval_kjv_revelation.txt", "$src/data/text/eval_fortunes_science_work.txt"]
max_tokens = 64
continuations = 0
[[strategy]]
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4]
[metrics]
report = ["ppl_ratio", "next_token_kl_mean", "attn_kl_mean"]
[output]
plots = false
TOML
"$kvb" run "$tmp/texts.toml" --quiet --out "$tmp/t" >"$tmp/texts.out" 2>&1 || fail "two texts exited $?: $(cat "$tmp/texts.out")"
/usr/bin/python3 - "$tmp/t/texts/latest" <<'PY' || fail "the model run over two texts is wrong"
import csv, math, sys
d = sys.argv[1]
points = list(csv.DictReader(open(f"{d}/points.csv")))
seq = list(csv.DictReader(open(f"{d}/points_by_sequence.csv")))
assert len(points) == 2 and len(seq) == 4, (len(points), len(seq))
for p in points:
    mine = [r for r in seq if r["id"] == p["id"]]
    for m in ["ppl_ratio", "next_token_kl_mean"]:
        mean = (float(mine[0][m]) + float(mine[1][m])) / 2
        assert abs(float(p[m]) - mean) <= 1e-12 * max(1.0, mean), (m, p[m], mean)
        # The sum of the two texts' variances.
        se = math.sqrt(float(mine[0][m + "_se"]) ** 2 + float(mine[1][m + "_se"]) ** 2) / 2
        assert abs(float(p[m + "_se"]) - se) <= 1e-9 * se, (m, p[m + "_se"], se)
PY

# A list of one recording is the single form: the same numbers and comparisons.
config one "recordings = [\"$tmp/a.safetensors\"]"
"$kvb" run "$tmp/one.toml" --quiet --out "$tmp/r" >"$tmp/one.out" 2>&1 || fail "one-recording list exited $?: $(cat "$tmp/one.out")"
[ "$(numbers "$tmp/r/one/latest/points.csv")" = "$(numbers "$tmp/r/a/latest/points.csv")" ] \
  || fail "a list of one recording changed points.csv"
cmp -s "$tmp/r/one/latest/comparisons.csv" "$tmp/r/a/latest/comparisons.csv" || fail "a list of one recording changed comparisons.csv"
[ ! -f "$tmp/r/one/latest/points_by_sequence.csv" ] || fail "one sequence wrote points_by_sequence.csv"

# A missing file: exit 2, naming the entry and the file; nothing written.
config missing "recordings = [\"$tmp/a.safetensors\", \"$tmp/nope.safetensors\"]"
"$kvb" run "$tmp/missing.toml" --quiet --out "$tmp/m" >"$tmp/missing.out" 2>&1
[ $? -eq 2 ] || fail "a missing recording: expected exit 2"
expect "$tmp/missing.out" "data.recordings[1]: data path '$tmp/nope.safetensors' not found" "the missing file's error"
[ ! -d "$tmp/m/missing" ] || fail "a missing recording wrote results"

# Different lengths: refused, naming both; max_tokens cuts them alike.
config short "recordings = [\"$tmp/a.safetensors\", \"$tmp/short.safetensors\"]"
"$kvb" run "$tmp/short.toml" --quiet --out "$tmp/s" >"$tmp/short.out" 2>&1
[ $? -eq 2 ] || fail "recordings of different lengths: expected exit 2"
expect "$tmp/short.out" "sequence 1 ($tmp/short.safetensors) has" "the length error"
expect "$tmp/short.out" "96 tokens" "the length error"
expect "$tmp/short.out" "data.max_tokens" "the length error"
"$kvb" run "$tmp/short.toml" --quiet --out "$tmp/s" --set data.max_tokens=96 >"$tmp/short2.out" 2>&1 \
  || fail "recordings cut to 96 tokens exited $?: $(cat "$tmp/short2.out")"

# Memory that differs by sequence (sink heads chosen by each text's entropies): refused
# before anything is measured, naming the points and the sequences.
cat >"$tmp/sinks.toml" <<TOML
name = "sinks"
[data]
recordings = ["$tmp/a.safetensors", "$tmp/b.safetensors"]
[[strategy]]
type = "uniform"
format = "int3-asym-g32"
sink_head_threshold = [2.0, 2.5, 3.0, 3.5]
[output]
plots = false
TOML
"$kvb" run "$tmp/sinks.toml" --quiet --out "$tmp/k" >"$tmp/sinks.out" 2>&1
[ $? -eq 2 ] || fail "memory that differs by sequence: expected exit 2"
expect "$tmp/sinks.out" "would cost different memory on different sequences" "the memory error"
expect "$tmp/sinks.out" "on sequence 0 ($tmp/a.safetensors) but" "the memory error"
[ ! -d "$tmp/k/sinks" ] || fail "memory that differs by sequence wrote results"

# Synthetic seeds: two sequences of one spec.
cat >"$tmp/seeds.toml" <<TOML
name = "seeds"
[data.synthetic]
layers = 1
q_heads = 2
head_dim = 32
tokens = 96
seeds = [1, 2]
[[strategy]]
type = "uniform"
format = "int3-asym-g32"
[output]
plots = false
TOML
"$kvb" run "$tmp/seeds.toml" --quiet --out "$tmp/sd" >"$tmp/seeds.out" 2>&1 || fail "synthetic seeds exited $?: $(cat "$tmp/seeds.out")"
expect "$tmp/sd/seeds/latest/points_by_sequence.csv" "synthetic seed 2" "points_by_sequence.csv of two seeds"

exit $status
