#!/usr/bin/env bash
# points_by_sequence.csv of resumed and merged runs over several sequences
# (configs/README.md "Several sequences"): the file is rebuilt from results.jsonl, whose
# lines carry each point's per-sequence results, so
#   - a run killed (kill -9) after some points and resumed has every point's rows, the
#     kept ones' included, as a single run does;
#   - shards whose points annotate different columns (a `format` block and a
#     `budget_bpe` block) merge, with the union of the columns; so does a resume whose
#     kept points are of one block and new ones of the other;
#   - results.jsonl lines of an older build (no per-sequence results): the resume says
#     which points' rows are unavailable instead of dropping them silently.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

cat >"$tmp/ms.toml" <<TOML
name = "ms"
seed = 1
[data.synthetic]
layers = 2
q_heads = 4
kv_heads = 2
head_dim = 64
tokens = 256
seeds = [1, 2]
[[strategy]]
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 3, 4, 5]
[[strategy]]
type = "uniform"
family = "int{b}-asym-g32"
budget_bpe = [3.0, 4.0, 5.0, 6.0]
[metrics]
pareto = ["attn_kl_mean", "attn_out_rel_err"]
[output]
plots = false
TOML

# by_sequence A B WHAT: two points_by_sequence.csv hold the same rows (timing aside).
by_sequence() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "$3: points_by_sequence.csv differs from the single run's"
import csv, sys
rows = lambda p: [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(open(p))]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert len(a) == 16, len(a)
assert a == b, (len(a), len(b), [r["id"] for r in b if r["sequence"] == "0"])
PY
}

# The reference: one run.
"$kvb" run "$tmp/ms.toml" --quiet --out "$tmp/single" >"$tmp/single.out" 2>&1 || fail "single run exited $?: $(cat "$tmp/single.out")"
single=$(ls -d "$tmp"/single/ms/2*)
has_column "$single/points_by_sequence.csv" budget_bpe || fail "no budget_bpe column in points_by_sequence.csv"
grep -q '"sequences":\[' "$single/results.jsonl" || fail "results.jsonl holds no per-sequence results"

# Eight shards (each of one strategy block, so of its annotation columns): merged.
for i in $(seq 0 7); do
  "$kvb" run "$tmp/ms.toml" --quiet --shard "$i/8" --out "$tmp/sh" >"$tmp/sh$i.out" 2>&1 \
    || fail "shard $i/8 exited $?: $(cat "$tmp/sh$i.out")"
done
"$kvb" merge "$tmp"/sh/ms/*-shard* --merged-dir "$tmp/merged" --quiet >"$tmp/merge.out" 2>&1 \
  || fail "merging shards with different annotation columns exited $?: $(cat "$tmp/merge.out")"
by_sequence "$single/points_by_sequence.csv" "$tmp/merged/points_by_sequence.csv" "eight shards merged"
csv_ok "$tmp/merged/points_by_sequence.csv" || fail "the merged points_by_sequence.csv has ragged rows"

# killed KEEP DIR: DIR as kill -9 leaves it after KEEP points (their results.jsonl lines;
# no points_by_sequence.csv, the manifest still "running" with a process that is gone).
killed() {
  rm -rf "$2"
  cp -r "$single" "$2"
  head -n "$1" "$single/results.jsonl" >"$2/results.jsonl"
  rm -f "$2/points_by_sequence.csv" "$2/points.csv"
  /usr/bin/python3 - "$2/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["status"] = "running"
m["pid"] = 2**22 + 7  # above pid_max's default: no such process
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
}
for keep in 1 5; do
  killed "$keep" "$tmp/k$keep"
  "$kvb" run --resume "$tmp/k$keep" --quiet >"$tmp/resume$keep.out" 2>&1 \
    || fail "resume after $keep point(s) exited $?: $(cat "$tmp/resume$keep.out")"
  expect "$tmp/k$keep/manifest.json" '"status": "complete"' "the resumed manifest"
  by_sequence "$single/points_by_sequence.csv" "$tmp/k$keep/points_by_sequence.csv" "killed after $keep point(s), resumed"
done
# A second resume of the finished folder: still every row.
"$kvb" run --resume "$tmp/k1" --quiet >"$tmp/again.out" 2>&1 || fail "a second resume exited $?: $(cat "$tmp/again.out")"
by_sequence "$single/points_by_sequence.csv" "$tmp/k1/points_by_sequence.csv" "resumed twice"

# Kept lines of an older build: their rows are unavailable, and the run says so.
killed 5 "$tmp/old"
/usr/bin/python3 - "$tmp/old/results.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for l in lines:
    l.pop("sequences")
open(sys.argv[1], "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
"$kvb" run --resume "$tmp/old" --quiet >"$tmp/old.out" 2>&1 || fail "resume of an older log exited $?: $(cat "$tmp/old.out")"
expect "$tmp/old.out" "points_by_sequence.csv has no rows for 5 measured point(s) (ids 0-4)" "the older log's warning"
expect "$tmp/old/manifest.json" "points_by_sequence.csv has no rows for 5 measured point(s) (ids 0-4)" "the manifest's warnings"
[ "$(($(wc -l <"$tmp/old/points_by_sequence.csv") - 1))" -eq 6 ] || fail "expected the 3 new points' rows on 2 sequences"

exit $status
