#!/usr/bin/env bash
# The model commands end to end: `kvbudget record`, `kvbudget eval`, a model sweep
# (configs/llama_ppl.toml, made smaller with --set) with its PPL-ratio frontier, and
# the errors a user meets. $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
text="$src/data/text/eval_kjv_revelation.txt"
llama="$src/data/models/llama-bytes"
gpt2="$src/data/models/gpt2-bytes"

# record: a recording the loaders and `inspect` read, attention outputs consistent.
"$kvb" record "$llama" --text "$text" --max-tokens 256 --out "$tmp/rec.safetensors" >"$tmp/rec.out" 2>&1 \
  || fail "record exited $?: $(cat "$tmp/rec.out")"
expect "$tmp/rec.out" "recorded 6 layers, 6/2 q/kv heads, head_dim 64, 256 tokens" "record"
"$kvb" inspect "$tmp/rec.safetensors" --check-output --positions 32 >"$tmp/inspect.out" 2>&1 || fail "inspect of the recording"
expect "$tmp/inspect.out" "6 layers, 6/2 q/kv heads, head_dim 64, 256 tokens, post-RoPE (theta 10000)" "inspect recording"
expect "$tmp/inspect.out" "layers.5.key_pre_rope" "inspect recording"
expect "$tmp/inspect.out" "input_ids" "inspect recording"
expect "$tmp/inspect.out" "model         llama-bytes" "inspect recording"
awk '/^attn_output check/ { on = 1; next } on && /^  layer/ { if ($3 + 0 >= 2e-3) exit 1 }' "$tmp/inspect.out" \
  || fail "recorded attn_output inconsistent with recorded q/k/v"
"$kvb" record "$gpt2" --text "$text" --max-tokens 64 --dtype f32 --out "$tmp/g.safetensors" >/dev/null 2>&1 || fail "record gpt2 f32"
"$kvb" inspect "$tmp/g.safetensors" --no-stats >"$tmp/g.out" 2>&1 || fail "inspect gpt2 recording"
grep -qE '^layers\.0\.query +F32 +\[6, 64, 64\]' "$tmp/g.out" || fail "gpt2 f32 recording: layers.0.query"

# eval: exact PPL, then a quantized cache with every model metric, files written.
"$kvb" eval "$gpt2" --text "$text" --max-tokens 128 >"$tmp/exact.out" 2>&1 || fail "eval exact exited $?"
expect "$tmp/exact.out" "exact cache: PPL" "eval exact"
"$kvb" eval "$llama" --text "$text" --max-tokens 128 --strategy uniform --param format=int4-asym-g32 \
  --continuations 2 --continuation-prompt 32 --continuation-tokens 8 --out "$tmp/e.safetensors" --nll "$tmp/nll.npy" \
  >"$tmp/q.out" 2>&1 || fail "eval quantized exited $?: $(cat "$tmp/q.out")"
for m in ppl_ratio next_token_kl_mean next_token_kl_median next_token_kl_p99 next_token_kl_max same_top_rate \
  gen_token_match gen_bleu4 gen_bleu4_research; do
  expect "$tmp/q.out" "  $m " "eval quantized"
done
expect "$tmp/q.out" "K:int4-asym-g32 V:int4-asym-g32, 5.0000 bits per element" "eval quantized"
# Standard errors as llama.cpp prints them: "value ± se" for the metrics that have one.
for m in ppl ppl_ratio next_token_kl_mean same_top_rate; do
  grep -qE "^  $m +[-0-9.e]+ +± [0-9.e-]+ " "$tmp/q.out" || fail "eval: $m without '± se'"
done
grep -qE "^  next_token_kl_p99 +[-0-9.e]+ +±" "$tmp/q.out" && fail "eval: next_token_kl_p99 has a '±' but no standard error"
expect "$tmp/exact.out" "exact cache: PPL" "eval exact"
grep -qE "exact cache: PPL [0-9.e]+ ± [0-9.e]+ " "$tmp/exact.out" || fail "eval exact: PPL without '± se'"
"$kvb" inspect "$tmp/e.safetensors" --no-stats >"$tmp/e.out" 2>&1 || fail "inspect eval output"
grep -qE '^logits +F32 +\[128, 257\]' "$tmp/e.out" || fail "eval --out: logits"
grep -qE '^nll_exact +F32 +\[127\]' "$tmp/e.out" || fail "eval --out: nll_exact"
"$kvb" inspect "$tmp/nll.npy" --no-stats >"$tmp/n.out" 2>&1 || fail "inspect nll.npy"
expect "$tmp/n.out" "[127]" "eval --nll"
# keep-fp16: the PPL ratio is 1 up to the keys' and values' fp16 rounding (about 1e-4 on
# these 128 tokens: 0.999893 +- 0.000096 on an AVX2 machine, whose fp32 sums round
# otherwise than AVX-512's; a real cache change moves it by 1e-2 and more).
"$kvb" eval "$llama" --text "$text" --max-tokens 128 --format keep-fp16 >"$tmp/f16.out" 2>&1 || fail "eval keep-fp16"
awk '$1 == "ppl_ratio" { r = $2 + 0; exit !(r > 0.9995 && r < 1.0005) }' "$tmp/f16.out" || fail "keep-fp16 PPL ratio not 1"
# A strategy preset, and a --param overriding its per-kind formats.
"$kvb" eval "$llama" --text "$text" --max-tokens 128 --strategy kivi-2 >"$tmp/kivi.out" 2>&1 || fail "eval kivi-2: $(cat "$tmp/kivi.out")"
expect "$tmp/kivi.out" "K:int2-asym-ch32 V:int2-asym-g32 Kwindow:128xkeep-fp16/chunked" "eval --strategy preset"
"$kvb" eval "$llama" --text "$text" --max-tokens 128 --strategy kivi-2 --param format=int4-asym-g32 >"$tmp/kivi4.out" 2>&1 \
  || fail "eval kivi-2 with --param: $(cat "$tmp/kivi4.out")"
expect "$tmp/kivi4.out" "K:int4-asym-g32 V:int4-asym-g32 Kwindow" "eval --strategy preset --param"
"$kvb" eval "$llama" --text "$text" --max-tokens 32 --strategy uniform --param format=int4-asym-g32 \
  --param format=int2-asym-g32 >"$tmp/twice.out" 2>&1
[ $? -eq 2 ] || fail "a --param given twice: expected exit 2"
expect "$tmp/twice.out" "--param format is given twice" "eval with a repeated --param"
# Token ids from a file.
printf '256 73 110 32 116 104 101\n' >"$tmp/ids.txt"
"$kvb" eval "$gpt2" --tokens "$tmp/ids.txt" >"$tmp/ids.out" 2>&1 || fail "eval --tokens"
expect "$tmp/ids.out" "tokens: 7 from" "eval --tokens"

# A model sweep with a PPL-ratio frontier (and its plot when matplotlib is there).
"$kvb" run "$src/configs/llama_ppl.toml" --out "$tmp/results" -q --set data.max_tokens=96 \
  --set data.continuations=2 --set data.continuation_prompt=32 --set data.continuation_tokens=8 \
  >"$tmp/run.out" 2>"$tmp/run.err" || fail "llama_ppl.toml run exited $?: $(tail -5 "$tmp/run.err")"
expect "$tmp/run.out" "Pareto frontier: ppl_ratio (lower is better) vs bits per element" "llama_ppl run"
expect "$tmp/run.out" "8 of 8 points measured" "llama_ppl run"
pareto="$tmp/results/llama_ppl/latest/pareto.csv"
[ "$(grep -c '^ppl_ratio,' "$pareto")" -ge 2 ] || fail "pareto.csv has fewer than 2 ppl_ratio frontier points"
grep -q '^ppl_ratio,.*int2-asym-g32' "$pareto" || fail "the cheapest point (int2) is not on the frontier"
points="$tmp/results/llama_ppl/latest/points.csv"
csv_ok "$points" || fail "points.csv has rows of unequal length"
# Each metric with a standard error has `<metric>_se` right after it (llama.cpp's ±).
/usr/bin/python3 -c 'import csv, math, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
for m in ["ppl", "ppl_ratio", "next_token_kl_mean", "same_top_rate"]:
    i = head.index(m)
    assert head[i + 1] == m + "_se", (m, head[i + 1])
    for r in rows[1:]:
        se = float(r[i + 1])
        assert math.isfinite(se) and se >= 0, (m, r[i + 1])
assert "next_token_kl_p99_se" not in head and "gen_bleu4_se" not in head
' "$points" || fail "points.csv: a model metric without its _se column right after it, or a bad value"
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  [ -s "$tmp/results/llama_ppl/latest/plots/ppl_ratio.png" ] || fail "no ppl_ratio plot"
fi

# Errors: exit 1 for bad data, 2 for bad usage; messages name the file and the key.
mkdir -p "$tmp/bert"
printf '{"architectures": ["BertForMaskedLM"], "vocab_size": 10}' >"$tmp/bert/config.json"
"$kvb" eval "$tmp/bert" --text "$text" >/dev/null 2>"$tmp/bert.err"
[ $? -eq 1 ] || fail "unsupported architecture should exit 1"
expect "$tmp/bert.err" "bert/config.json: key 'architectures': unsupported architecture 'BertForMaskedLM'" "eval bert"
mkdir -p "$tmp/broken"
printf '{"architectures": ["LlamaForCausalLM"], ' >"$tmp/broken/config.json"
"$kvb" record "$tmp/broken" --text "$text" --out "$tmp/x.safetensors" >/dev/null 2>"$tmp/broken.err"
[ $? -eq 1 ] || fail "malformed config.json should exit 1"
expect "$tmp/broken.err" "broken/config.json: malformed JSON" "record broken config"
printf '256 72 300\n' >"$tmp/oov.txt"
"$kvb" eval "$llama" --tokens "$tmp/oov.txt" >/dev/null 2>"$tmp/oov.err"
[ $? -eq 1 ] || fail "a token outside the vocabulary should exit 1"
expect "$tmp/oov.err" "token id 300 at index 2 is outside the vocabulary" "eval oov"
expect "$tmp/oov.err" "oov.txt: token id 300" "eval oov names the token file"
# A directory given as the text: named as such, not read as an empty text.
"$kvb" eval "$llama" --text "$tmp" >/dev/null 2>"$tmp/tdir.err"
[ $? -eq 1 ] || fail "eval --text DIR should exit 1"
expect "$tmp/tdir.err" "$tmp: is a directory, expected a text file" "eval --text DIR"
"$kvb" run "$src/configs/llama_ppl.toml" --out "$tmp/results" -q --set "data.text=$tmp" >/dev/null 2>"$tmp/rdir.err"
[ $? -eq 1 ] || fail "run with [data] text = DIR should exit 1"
expect "$tmp/rdir.err" "$tmp: is a directory, expected a text file" "run with [data] text = DIR"
"$kvb" run "$src/configs/repro_entropy_gpt2_model.toml" --out "$tmp/results" -q --set data.max_tokens=0 \
  >/dev/null 2>"$tmp/npos.err"
[ $? -eq 2 ] || fail "a GPT-2 model source longer than n_positions should exit 2"
expect "$tmp/npos.err" "more than the 1024 positions of" "GPT-2 model source beyond n_positions"
expect "$tmp/npos.err" "set data.max_tokens <= 1024" "GPT-2 model source beyond n_positions"
# A FIFO or a device as the text is refused by name (it would block or grow without end).
"$kvb" eval "$llama" --text /dev/zero >/dev/null 2>"$tmp/zero.err"
[ $? -eq 1 ] || fail "eval --text /dev/zero should exit 1"
expect "$tmp/zero.err" "/dev/zero: is a character device, not a regular file" "eval --text /dev/zero"
mkfifo "$tmp/pipe.txt"
"$kvb" run "$src/configs/llama_ppl.toml" --out "$tmp/results" -q --set "data.text=$tmp/pipe.txt" >/dev/null 2>"$tmp/pipe.err"
[ $? -eq 1 ] || fail "run with [data] text = FIFO should exit 1"
expect "$tmp/pipe.err" "pipe.txt: is a FIFO (named pipe), not a regular file" "run with [data] text = FIFO"
# Seeds: -1 is refused as `--set seed=-1` is, not wrapped to 2^64 - 1.
"$kvb" eval "$llama" --text "$text" --format int4-asym-g32 --seed -1 >/dev/null 2>"$tmp/seed.err"
[ $? -eq 2 ] || fail "eval --seed -1 should exit 2"
expect "$tmp/seed.err" "--seed must be >= 0, got -1" "eval --seed -1"
# max_tokens 1: one query attending to itself alone measures nothing.
"$kvb" run "$src/configs/llama_ppl.toml" --out "$tmp/results" -q --set data.max_tokens=1 >/dev/null 2>"$tmp/one.err"
[ $? -eq 2 ] || fail "a model source with max_tokens = 1 should exit 2"
expect "$tmp/one.err" "data.max_tokens: 1 keeps a single token" "model source with max_tokens = 1"
# Outputs that cannot be written are refused before the model runs.
"$kvb" record "$gpt2" --text "$text" --max-tokens 64 --out "$tmp/no_dir/r.safetensors" >/dev/null 2>"$tmp/wdir.err"
[ $? -eq 2 ] || fail "record --out in a missing directory should exit 2"
expect "$tmp/wdir.err" "no_dir does not exist" "record --out in a missing directory"
"$kvb" eval "$llama" --text "$text" --format int9-asym-g32 >/dev/null 2>"$tmp/fmt.err"
[ $? -eq 2 ] || fail "a bad format should exit 2"
expect "$tmp/fmt.err" "int9-asym-g32" "eval bad format"
"$kvb" eval "$llama" --text "$text" --strategy uniform --param formt=x >/dev/null 2>"$tmp/param.err"
[ $? -eq 2 ] || fail "a bad --param should exit 2"
expect "$tmp/param.err" "has no parameter 'formt' (did you mean 'format'?)" "eval bad param"
"$kvb" record "$llama" --text "$text" >/dev/null 2>"$tmp/noout.err"
[ $? -eq 2 ] || fail "record without --out should exit 2"
expect "$tmp/noout.err" "missing --out" "record without --out"
"$kvb" eval "$llama" --text "$text" --tokens "$tmp/ids.txt" >/dev/null 2>&1
[ $? -eq 2 ] || fail "--text with --tokens should exit 2"
"$kvb" help | grep -q "^  record " || fail "record is not in the command table"
"$kvb" help | grep -q "^  eval " || fail "eval is not in the command table"
exit $status
