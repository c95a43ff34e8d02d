#!/usr/bin/env bash
# `kvbudget generate` end to end on the bundled byte-level Llama: the exact cache
# against itself and against a lossless plan (token match 1), an aggressive 1-bit
# format (the continuations diverge), seeded sampling (same seed, same text), the
# JSON of --out and --json, the two layouts, and the errors a user meets.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
llama="$src/data/models/llama-bytes"
gpt2="$src/data/models/gpt2-bytes"
prompt="And I saw a new heaven and a new earth: for the first heaven"

# check_json FILE PYTHON: runs the Python expression block on the parsed JSON `j`
# (asserts), failing the test with its message.
check_json() {
  /usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[2])' "$1" "$2" 2>"$tmp/check.err" || fail "$1: $(cat "$tmp/check.err")"
}

# The exact cache against itself: identical continuations, token match 1.
"$kvb" generate "$llama" --prompt "$prompt" -n 32 --json >"$tmp/exact.json" 2>"$tmp/exact.err" \
  || fail "generate exact exited $?: $(cat "$tmp/exact.err")"
check_json "$tmp/exact.json" '
assert j["plan"] == "exact" and j["plan_source"] is None, j["plan"]
assert j["token_match"] == 1.0 and j["first_divergence"] is None, (j["token_match"], j["first_divergence"])
e, q = j["exact"], j["quantized"]
assert e["ids"] == q["ids"] and 0 < len(e["ids"]) <= 32, e["ids"]
assert len(e["ids"]) == 32 or e["stopped_at_eos"], "fewer than 32 tokens without EOS"
assert all(j["agreement"]) and len(j["agreement"]) == len(e["ids"])
assert j["prompt_ids"][0] == 256 and len(j["prompt_ids"]) == 1 + len(j["prompt"]), "bytes tokenizer with BOS"
assert j["sampling"]["mode"] == "greedy"'

# A lossless plan (keep-fp32): the same tokens as the exact cache.
"$kvb" generate "$llama" --prompt "$prompt" -n 32 --format keep-fp32 --json >"$tmp/fp32.json" 2>&1 \
  || fail "generate keep-fp32: $(cat "$tmp/fp32.json")"
check_json "$tmp/fp32.json" '
assert j["token_match"] == 1.0 and j["first_divergence"] is None, j["token_match"]
assert j["bpe"] == 32.0, j["bpe"]'

# A byte model's special tokens (reasoning-bytes' <think> 257 and </think> 258) have no
# text: they read "<id N>" where they were generated, in each token's text and the whole.
printf 'Q: Start with 75. Then add 76, double, halve. What are the values along the way?\n' >"$tmp/q.txt"
"$kvb" generate "$src/data/models/reasoning-bytes" --prompt-file "$tmp/q.txt" -n 60 --format int4-asym-g32 --json \
  >"$tmp/think.json" 2>&1 || fail "generate reasoning-bytes: $(cat "$tmp/think.json")"
check_json "$tmp/think.json" '
e = j["exact"]
special = [(i, t) for i, t in zip(e["ids"], e["texts"]) if i >= 256 and i != j["eos_token_id"]]
assert special and all(t == "<id %d>" % i for i, t in special), special
assert all(e["text"].count("<id %d>" % i) >= 1 for i, _ in special), e["text"]'

# A phase plan built from a reasoning trace (--plan-tokens: the prompt holds no </think>)
# switches where the continuation generates the marker, and says where.
"$kvb" generate "$src/data/models/reasoning-bytes" --prompt-file "$tmp/q.txt" -n 60 --strategy phase \
  --param first_format=int4-asym-g32 --param second_format=int2-asym-g32 --param phase_marker=258 \
  --plan-tokens "$src/data/tasks/reasoning_trace_ids.txt" --json >"$tmp/phase.json" 2>&1 \
  || fail "generate with --plan-tokens: $(cat "$tmp/phase.json")"
check_json "$tmp/phase.json" '
assert j["phase_marker"] == 258 and j["phase_switch"]["in_prompt"] is False, j.get("phase_switch")
q = j["quantized"]["ids"]
assert j["phase_switch"]["quantized"] == (q.index(258) if 258 in q else None), j["phase_switch"]
assert "reasoning_trace_ids.txt" in j["plan_built_on"], j["plan_built_on"]'
"$kvb" generate "$src/data/models/reasoning-bytes" --prompt x --plan-text "$tmp/q.txt" >"$tmp/noplan.out" 2>&1 \
  && fail "--plan-text without a format or strategy was accepted"
expect "$tmp/noplan.out" "build a plan: give --format" "generate --plan-text alone"

# BLEU-4 is undefined for continuations of fewer than 4 tokens (not a score of 0).
"$kvb" generate "$llama" --prompt "$prompt" -n 3 --format keep-fp32 --json >"$tmp/short.json" 2>&1 \
  || fail "generate -n 3: $(cat "$tmp/short.json")"
check_json "$tmp/short.json" '
assert j["bleu4"] is None and j["token_match"] == 1.0, (j["bleu4"], j["token_match"])'
# A window's bits per element: the whole prompt fits in KIVI's 128-token window (16 bits),
# the cache at its longest does not; a plan's own prefill gives way to the prompt's.
"$kvb" generate "$llama" --prompt "$prompt" -n 200 --ignore-eos --strategy kivi-2 --json >"$tmp/kivi.json" 2>&1 \
  || fail "generate kivi-2: $(cat "$tmp/kivi.json")"
check_json "$tmp/kivi.json" '
assert j["bpe_prompt"] == 16.0 and j["bpe"] < 12, (j["bpe_prompt"], j["bpe"])
assert j["cache_tokens"] == len(j["prompt_ids"]) + 199, j["cache_tokens"]'
"$kvb" generate "$llama" --prompt "$prompt" -n 4 --strategy uniform --param format=int2-asym-g32 --param prompt=3 \
  >"$tmp/prefill.out" 2>&1 || fail "generate with a prefill: $(cat "$tmp/prefill.out")"
expect "$tmp/prefill.out" "the prompt is the prefill" "generate: a plan's prefill replaced by the prompt"
# A format the model's head_dim cannot hold is the user's error (exit 2), as in run.
"$kvb" generate "$llama" --prompt "$prompt" -n 2 --format int4-asym-g33 >"$tmp/g33.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "generate --format int4-asym-g33: expected exit 2, got $rc"
expect "$tmp/g33.out" "group size 33 does not divide head_dim 64" "generate: a group size that does not divide head_dim"
grep -q "longer --prompt" "$tmp/g33.out" && fail "generate: a group size error told to lengthen the prompt"
# What a strategy reads comes from the text its plan is built on: an error there names it.
"$kvb" generate "$llama" --prompt "abcd" -n 2 --strategy entropy --param budget_bpe=4 --param 'family=int{b}-asym-g32' \
  >"$tmp/short_plan.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "generate entropy on a 4-byte prompt: expected exit 2, got $rc"
expect "$tmp/short_plan.out" "generate builds the plan on the prompt, 5 tokens: give a longer --prompt" \
  "generate: a plan that cannot be built on the prompt"
# The cache that ran is the same whatever prefill the plan was built with: so are its
# reported bits per element and plan (prefill = the prompt).
for p in 1 20; do
  "$kvb" generate "$llama" --prompt "$prompt" -n 8 --strategy hf-quanto-int4 --param prompt=$p --json \
    >"$tmp/prefill$p.json" 2>&1 || fail "generate hf-quanto-int4 prompt=$p: $(cat "$tmp/prefill$p.json")"
done
/usr/bin/python3 -c 'import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert (a["bpe"], a["bpe_prompt"]) == (b["bpe"], b["bpe_prompt"]), (a["bpe"], a["bpe_prompt"], b["bpe"], b["bpe_prompt"])
n = len(a["prompt_ids"])
assert a["plan"].endswith("prefill:%d" % n) and b["plan"].endswith("prefill:%d" % n), (a["plan"], b["plan"])
# bpe at the quantized cache at its longest: the prompt and the quantized tokens but the last.
assert a["cache_tokens"] == n + len(a["quantized"]["ids"]) - 1, a["cache_tokens"]' \
  "$tmp/prefill1.json" "$tmp/prefill20.json" || fail "generate: the plan as it ran (prefill = the prompt)"

# An aggressive 1-bit cache diverges; --out holds every field, the same as --json.
"$kvb" generate "$llama" --prompt "$prompt" -n 32 --format int1-sym-g32 --out "$tmp/int1.json" \
  >"$tmp/int1.out" 2>&1 || fail "generate int1 exited $?: $(cat "$tmp/int1.out")"
check_json "$tmp/int1.json" '
for k in ["model", "prompt", "prompt_ids", "plan", "plan_source", "bpe", "bpe_prompt", "cache_tokens", "sampling",
          "max_new_tokens", "stop_at_eos",
          "eos_token_id", "exact", "quantized", "agreement", "matching_tokens", "token_match", "first_divergence", "bleu4"]:
    assert k in j, "missing key " + k
for k in ["mode", "temperature", "top_k", "top_p", "seed"]:
    assert k in j["sampling"], "missing sampling." + k
for run in ("exact", "quantized"):
    c = j[run]
    assert len(c["ids"]) == len(c["texts"]) == c["new_tokens"], run
    assert all(isinstance(i, int) for i in c["ids"]), run
e, q = j["exact"]["ids"], j["quantized"]["ids"]
assert j["token_match"] < 1.0 and j["first_divergence"] is not None, j["token_match"]
d = j["first_divergence"]
assert e[:d] == q[:d] and (d == min(len(e), len(q)) or e[d] != q[d]), "first_divergence is not the first difference"
agree = [i < len(e) and i < len(q) and e[i] == q[i] for i in range(max(len(e), len(q)))]
assert j["agreement"] == agree, "agreement"
assert abs(j["token_match"] - sum(agree) / len(e)) < 1e-12, "token_match is the agreeing share of the exact tokens"
assert j["plan_source"] == "uniform(format=int1-sym-g32)" and "K:int1-sym-g32" in j["plan"], j["plan"]'
"$kvb" generate "$llama" --prompt "$prompt" -n 32 --format int1-sym-g32 --json >"$tmp/int1-stdout.json" 2>/dev/null \
  || fail "generate --json"
cmp -s "$tmp/int1.json" "$tmp/int1-stdout.json" || fail "--out and --json differ"
# Text: not a terminal, so one continuation after the other, then the match.
expect "$tmp/int1.out" "--- exact cache: " "generate text"
expect "$tmp/int1.out" "--- quantized cache: " "generate text"
expect "$tmp/int1.out" "plan: uniform(format=int1-sym-g32) = K:int1-sym-g32" "generate text"
expect "$tmp/int1.out" "first divergence at new token" "generate text"
expect "$tmp/int1.out" "wrote $tmp/int1.json" "generate text"
grep -qE "^token match: 0\.[0-9]{4} \(" "$tmp/int1.out" || fail "generate text: no token match line"
"$kvb" generate "$llama" --prompt "$prompt" -n 16 --format int1-sym-g32 --layout side --width 100 >"$tmp/side.out" 2>&1 \
  || fail "generate --layout side"
grep -qE "^exact cache: .* │ quantized cache: " "$tmp/side.out" || fail "side by side: no column headings"
awk -F'│' '/│/ && NF != 2 { exit 1 }' "$tmp/side.out" || fail "side by side: a line without exactly two columns"

# Seeded sampling: the same seed gives the same continuations, both from one stream
# (the exact cache against itself matches); another seed another text.
for s in 1 2; do
  "$kvb" generate "$llama" --prompt "$prompt" -n 32 --temperature 0.9 --top-k 40 --top-p 0.95 --seed $s --json \
    >"$tmp/sampled-$s.json" 2>&1 || fail "sampled generate seed $s: $(cat "$tmp/sampled-$s.json")"
  check_json "$tmp/sampled-$s.json" '
assert j["sampling"] == {"mode": "sampled", "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": j["sampling"]["seed"]}
assert j["token_match"] == 1.0, "sampled exact-vs-exact"'
done
# With a plan, the exact continuation is the same draw: only the quantized one changes.
"$kvb" generate "$llama" --prompt "$prompt" -n 32 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 1 \
  --format int1-sym-g32 --json >"$tmp/sampled-int1.json" 2>/dev/null || fail "sampled generate with int1"
/usr/bin/python3 -c 'import json, sys
a, q = (json.load(open(f)) for f in sys.argv[1:3])
assert q["exact"] == a["exact"], "the plan changed the exact continuation"
assert q["quantized"]["ids"] != a["exact"]["ids"], "int1 did not change the sampled text"' \
  "$tmp/sampled-1.json" "$tmp/sampled-int1.json" || fail "sampling with a plan"
"$kvb" generate "$llama" --prompt "$prompt" -n 32 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 1 --threads 1 --json \
  >"$tmp/sampled-1t.json" 2>/dev/null || fail "sampled generate, one thread"
cmp -s "$tmp/sampled-1.json" "$tmp/sampled-1t.json" || fail "sampling depends on the thread count"
/usr/bin/python3 -c 'import json, sys
a, b, g = (json.load(open(f)) for f in sys.argv[1:4])
assert a["exact"]["ids"] != b["exact"]["ids"], "seeds 1 and 2 gave the same text"
assert a["exact"]["ids"] != g["exact"]["ids"], "sampling gave the greedy text"' \
  "$tmp/sampled-1.json" "$tmp/sampled-2.json" "$tmp/exact.json" || fail "seeded sampling"
"$kvb" generate "$llama" --prompt "$prompt" -n 8 --top-k 1 --temperature 1 --json >"$tmp/topk1.json" 2>/dev/null \
  || fail "generate --top-k 1"
/usr/bin/python3 -c 'import json, sys
a, g = (json.load(open(f)) for f in sys.argv[1:3])
assert a["exact"]["ids"] == g["exact"]["ids"][:8], "top-k 1 is not greedy"' "$tmp/topk1.json" "$tmp/exact.json" \
  || fail "top-k 1"

# --ignore-eos: exactly N tokens; a prompt file; GPT-2.
"$kvb" generate "$gpt2" --prompt "$prompt" -n 12 --ignore-eos --strategy kivi-2 --json >"$tmp/gpt2.json" 2>&1 \
  || fail "generate gpt2 kivi-2: $(cat "$tmp/gpt2.json")"
check_json "$tmp/gpt2.json" '
assert j["stop_at_eos"] is False and j["eos_token_id"] is None
assert len(j["exact"]["ids"]) == 12 and len(j["quantized"]["ids"]) == 12
assert "Kwindow" in j["plan"], j["plan"]'
printf '%s' "$prompt" >"$tmp/prompt.txt"
"$kvb" generate "$llama" --prompt-file "$tmp/prompt.txt" -n 32 --json >"$tmp/file.json" 2>/dev/null || fail "--prompt-file"
/usr/bin/python3 -c 'import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["exact"] == b["exact"] and a["prompt_ids"] == b["prompt_ids"]' "$tmp/file.json" "$tmp/exact.json" \
  || fail "--prompt-file differs from --prompt"

# Errors: exit code, and a message that names what is wrong.
refused() {  # refused CODE PATTERN ARGS...: exits CODE and says PATTERN
  local code="$1" pattern="$2"
  shift 2
  "$kvb" generate "$@" >"$tmp/err.out" 2>&1
  local got=$?
  [ "$got" = "$code" ] || fail "generate $*: exit $got, expected $code"
  grep -qF -- "$pattern" "$tmp/err.out" || { fail "generate $*: no '$pattern' in"; sed 's/^/    /' "$tmp/err.out" >&2; }
}
refused 2 "did you mean 'q4_0'" "$llama" --prompt "$prompt" --format q4_00
refused 2 "did you mean 'kivi-2'" "$llama" --prompt "$prompt" --strategy kivi-3
refused 2 "--max-new-tokens must be >= 1, got 0" "$llama" --prompt "$prompt" -n 0
refused 2 "--max-new-tokens must be >= 1, got -5" "$llama" --prompt "$prompt" -n -5
refused 2 "--temperature must be" "$llama" --prompt "$prompt" --temperature -1
refused 2 "--top-p must be in (0, 1]" "$llama" --prompt "$prompt" --temperature 1 --top-p 0
refused 2 "give --temperature > 0 with them" "$llama" --prompt "$prompt" --top-p 0.9
refused 2 "give exactly one of --prompt and --prompt-file" "$llama"
refused 2 "give exactly one of --prompt and --prompt-file" "$llama" --prompt x --prompt-file "$tmp/prompt.txt"
refused 2 "--out $tmp/x.txt: expected a .json file" "$llama" --prompt "$prompt" --out "$tmp/x.txt"
refused 1 "$tmp/no-such-model: not a checkpoint directory" "$tmp/no-such-model" --prompt "$prompt"
refused 2 "missing MODEL_DIR" --prompt "$prompt"
head -c 2100 "$src/data/text/eval_kjv_revelation.txt" >"$tmp/long.txt"
refused 2 "tokens exceed the 2048 positions of" "$llama" --prompt-file "$tmp/long.txt"
refused 2 "exceed the learned position table" "$gpt2" --prompt-file "$tmp/prompt.txt" -n 1000
refused 2 "unrecognised option '--frobnicate'" "$llama" --prompt "$prompt" --frobnicate
exit $status
