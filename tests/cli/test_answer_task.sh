#!/usr/bin/env bash
# Answer accuracy end to end (configs/README.md [task], methods.md §4 "Answer
# accuracy"): `kvbudget eval --task` on the reasoning model's held-out problems and on
# the cloze task of the byte models; a sweep with [task] (points.csv columns, results
# of two shards merged equal a single run); and the errors a user meets.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
reasoning="$src/data/models/reasoning-bytes"
trace="$src/data/tasks/reasoning_trace_ids.txt"
npz="$src/data/tasks/reasoning_eval.npz"
cloze="$src/data/tasks/revelation_cloze.jsonl"
text="$src/data/text/eval_kjv_revelation.txt"
final='The final value is (-?[0-9]+)\.'
word='^\s*([A-Za-z]+)[^A-Za-z]'

# eval on the reasoning model: the exact cache answers every problem; a quantized
# cache reports answer_accuracy with its interval and the flips.
"$kvb" eval "$reasoning" --tokens "$trace" --task "$npz" --answer-regex "$final" --answer-after 258 \
  --problem-prefix short_ --max-problems 4 --max-new-tokens 400 --format int4-asym-g32 >"$tmp/r.out" 2>&1 \
  || fail "eval --task on reasoning-bytes exited $?: $(cat "$tmp/r.out")"
expect "$tmp/r.out" "task: $npz: 4 problems, answers by /$final/ after token 258, at most 400 new tokens" "eval --task"
expect "$tmp/r.out" "exact cache: answer accuracy 1 (4 of 4 problems; 95 % Wilson interval 0.51..1)" "eval --task"
grep -qE "^  answer_accuracy +[0-9.]+ +\[[0-9.e-]+, [0-9.e-]+\] " "$tmp/r.out" || fail "eval: answer_accuracy without its interval"
expect "$tmp/r.out" "  flips_right_to_wrong " "eval --task"
expect "$tmp/r.out" "  flips_wrong_to_right " "eval --task"

# The cloze task over held-out text, on both byte models.
for m in llama-bytes gpt2-bytes; do
  "$kvb" eval "$src/data/models/$m" --text "$text" --max-tokens 128 --task "$cloze" --answer-regex "$word" \
    --max-new-tokens 16 --max-problems 6 --format int2-asym-g32 >"$tmp/c_$m.out" 2>&1 \
    || fail "eval --task cloze on $m exited $?: $(cat "$tmp/c_$m.out")"
  grep -qE "^exact cache: answer accuracy [0-9.e-]+ \([0-6] of 6 problems" "$tmp/c_$m.out" || fail "cloze on $m: exact accuracy"
  grep -qE "^  answer_accuracy +[0-9.]+ " "$tmp/c_$m.out" || fail "cloze on $m: answer_accuracy"
done

# A sweep with [task]: gpt2-bytes on the cloze task, two points.
cat >"$tmp/cloze.toml" <<TOML
name = "cloze"
[data]
source = "model"
model = "$src/data/models/gpt2-bytes"
text = "$text"
max_tokens = 128
continuations = 0
[task]
file = "$cloze"
answer_regex = '$word'
max_new_tokens = 16
max_problems = 6
[calibration]
overlap = true
[[strategy]]
type = "uniform"
format = ["int2-asym-g32", "int8-asym-g32"]
[metrics]
report = ["answer_accuracy", "flips_right_to_wrong", "flips_wrong_to_right", "ppl_ratio"]
pareto = ["answer_accuracy"]
[attribution]
points = "none"
[output]
plots = false
TOML
"$kvb" run "$tmp/cloze.toml" --quiet --out "$tmp/single" >"$tmp/run.out" 2>&1 || fail "run with [task] exited $?: $(cat "$tmp/run.out")"
single=$(ls -d "$tmp"/single/cloze/2* | head -1)
for c in answer_accuracy answer_accuracy_lo answer_accuracy_hi flips_right_to_wrong flips_wrong_to_right; do
  has_column "$single/points.csv" "$c" || fail "points.csv: no column $c"
done
csv_ok "$single/points.csv" || fail "points.csv rows"
/usr/bin/python3 - "$single/points.csv" <<'PY' || fail "answer_accuracy columns inconsistent"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 2, rows
for r in rows:
    a, lo, hi = float(r["answer_accuracy"]), float(r["answer_accuracy_lo"]), float(r["answer_accuracy_hi"])
    assert 0 <= lo <= a <= hi <= 1, r
    assert abs(a * 6 - round(a * 6)) < 1e-9, r  # a count of 6 problems
    assert float(r["flips_right_to_wrong"]) + float(r["flips_wrong_to_right"]) <= 6, r
PY
expect "$single/manifest.json" '"answer_interval"' "manifest"
expect "$single/manifest.json" '"answer_regex"' "manifest"
for i in 0 1; do
  "$kvb" run "$tmp/cloze.toml" --quiet --shard "$i/2" --out "$tmp/sh" >"$tmp/sh$i.out" 2>&1 || fail "shard $i/2 exited $?: $(cat "$tmp/sh$i.out")"
done
"$kvb" merge "$tmp"/sh/cloze/*-shard* --merged-dir "$tmp/merged" >"$tmp/merge.out" 2>&1 || fail "merge exited $?: $(cat "$tmp/merge.out")"
diff <(numbers "$single/points.csv") <(numbers "$tmp/merged/points.csv") >/dev/null || fail "merged shards' points.csv differs from the single run"

# The bundled config, made small: uniform and phase bits on the reasoning model.
"$kvb" run "$src/configs/reasoning_accuracy.toml" --quiet --out "$tmp/reason" --set task.problem_prefix=short_ \
  --set task.max_problems=2 --set 'strategy.0.format=["int4-asym-g32"]' --set 'strategy.1.first_bits=[4]' \
  --set 'strategy.1.second_bits=[2]' --set output.plots=false >"$tmp/reason.out" 2>&1 \
  || fail "configs/reasoning_accuracy.toml exited $?: $(cat "$tmp/reason.out")"
reason=$(ls -d "$tmp"/reason/reasoning_accuracy/2* | head -1)
[ "$(wc -l <"$reason/points.csv")" -eq 3 ] || fail "reasoning_accuracy: expected 2 points"

# Errors.
sed 's#^file = .*#file = "'"$tmp"'/none.jsonl"#' "$tmp/cloze.toml" >"$tmp/missing.toml"
"$kvb" run "$tmp/missing.toml" --quiet --out "$tmp/x" >"$tmp/missing.out" 2>&1
[ $? -eq 2 ] || fail "a missing task file: expected exit 2"
expect "$tmp/missing.out" "missing.toml:9: task.file: $tmp/none.jsonl: no such task file" "missing task file"
"$kvb" run "$tmp/cloze.toml" --quiet --out "$tmp/x" --set 'task.answer_regex=([a-z' >"$tmp/regex.out" 2>&1
[ $? -eq 2 ] || fail "a bad regex: expected exit 2"
expect "$tmp/regex.out" "--set task.answer_regex: /([a-z/ does not compile" "bad regex"
"$kvb" run "$tmp/cloze.toml" --quiet --out "$tmp/x" --set task.answer_reg=x >"$tmp/unknown.out" 2>&1
[ $? -eq 2 ] || fail "an unknown [task] key: expected exit 2"
expect "$tmp/unknown.out" "unknown key 'task.answer_reg' (did you mean 'answer_regex'?)" "unknown [task] key"
grep -v '^\[task\]\|^file = \|^answer_regex\|^max_new_tokens\|^max_problems' "$tmp/cloze.toml" >"$tmp/notask.toml"
"$kvb" run "$tmp/notask.toml" --quiet --out "$tmp/x" >"$tmp/notask.out" 2>&1
[ $? -eq 2 ] || fail "answer_accuracy without [task]: expected exit 2"
expect "$tmp/notask.out" "'answer_accuracy' scores an answer task's answers; name one in [task]" "metric without [task]"
/usr/bin/python3 -c 'import numpy as np, sys
np.savez(sys.argv[1], a_prompt=np.array([256, 81], dtype=np.int32), a_answer=np.array([3]), b_prompt=np.array([256], dtype=np.int32))' "$tmp/noanswer.npz"
"$kvb" eval "$reasoning" --tokens "$trace" --task "$tmp/noanswer.npz" --answer-regex "$final" >"$tmp/noanswer.out" 2>&1
[ $? -eq 2 ] || fail "a problem without an answer: expected exit 2"
expect "$tmp/noanswer.out" "problem 'b' has a prompt (b_prompt) but no expected answer (no array b_answer)" "npz without an answer"
"$kvb" eval "$reasoning" --tokens "$trace" --task "$npz" >"$tmp/noregex.out" 2>&1
[ $? -eq 2 ] || fail "--task without --answer-regex: expected exit 2"
expect "$tmp/noregex.out" "--task needs --answer-regex" "--task without --answer-regex"
exit $status
