#!/usr/bin/env bash
# `kvbudget inspect` on the bundled fixtures and on broken files.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

# A recording: tensors with statistics, metadata, and the entropy tables. The build makes it
# with `kvbudget record` (data/CMakeLists.txt): 6 layers x (query, key, key_pre_rope, value,
# attn_output) + input_ids.
rec="$src/data/records/llama-bytes-record.safetensors"
"$kvb" inspect "$rec" --positions 64 --check-output >"$tmp/rec.out" 2>"$tmp/rec.err" || fail "inspect $rec exited $?"
expect "$tmp/rec.out" "31 tensors in 1 file" "inspect llama record"
expect "$tmp/rec.out" "metadata:" "inspect llama record"
grep -qE '^  model +llama-bytes$' "$tmp/rec.out" || fail "metadata 'model llama-bytes' not in inspect llama record"
expect "$tmp/rec.out" "layers.0.key_pre_rope" "inspect llama record"
expect "$tmp/rec.out" "absmax" "inspect llama record"
expect "$tmp/rec.out" "6 layers, 6/2 q/kv heads, head_dim 64, 512 tokens, post-RoPE (theta 10000)" "inspect llama record"
expect "$tmp/rec.out" "attention entropy, bits (mean over 64 query positions" "inspect llama record"
expect "$tmp/rec.out" "Shannon H" "inspect llama record"
expect "$tmp/rec.out" "Renyi-2 H2" "inspect llama record"
expect "$tmp/rec.out" "attn_output check" "inspect llama record"
grep -q MISMATCH "$tmp/rec.out" && fail "the llama record's attn_output should match"

# A recorded attn_output that the recomputed attention does not reproduce (keys read
# as values) fails the check, naming what to look at.
"$kvb" inspect "$rec" --no-stats --positions 8 --value 'layers.{layer}.key' --check-output >"$tmp/mm.out" 2>&1
[ $? -eq 1 ] || fail "a mismatching attn_output: expected exit 1"
expect "$tmp/mm.out" "MISMATCH" "mismatching attn_output"
expect "$tmp/mm.out" "differs from attention recomputed from query/key/value in 6 layer(s)" "mismatching attn_output"
"$kvb" inspect "$src/data/models/gpt2-bytes" --no-stats --check-output >"$tmp/nr.out" 2>&1
[ $? -eq 1 ] || fail "--check-output on a checkpoint (no recording): expected exit 1"
expect "$tmp/nr.out" "--check-output: no recording found to check" "--check-output without a recording"
"$kvb" inspect "$rec" --tensors 'nomatch*' >"$tmp/glob.out" 2>&1
[ $? -eq 2 ] || fail "--tensors matching nothing: expected exit 2"
expect "$tmp/glob.out" "--tensors 'nomatch*' matches none of the 31 tensors" "--tensors matching nothing"
[ "$(grep -c '^  layer [0-5] ' "$tmp/rec.out")" -eq 18 ] || fail "expected 6 rows in each of the 2 entropy tables and the attn_output check"
# Every entropy lies in [0, log2(512)] bits.
awk '/^  layer [0-5]  / && NF == 9 { for (i = 3; i <= 9; ++i) if ($i < 0 || $i > 9) exit 1 }' "$tmp/rec.out" \
  || fail "entropy outside [0, 9] bits"
# The recomputed attention matches the recorded output (relative error column < 2e-3).
awk '/^attn_output check/ { on = 1; next } on && /^  layer/ { if ($3 + 0 >= 2e-3) exit 1 }' "$tmp/rec.out" \
  || fail "attn_output check above 2e-3"

# A sharded checkpoint (directory): file column, no recording.
"$kvb" inspect "$src/data/models/gpt2-bytes" --tensors 'transformer.h.0.attn.*' >"$tmp/model.out" 2>&1 \
  || fail "inspect gpt2-bytes model exited $?"
expect "$tmp/model.out" "76 tensors in 2 files" "inspect gpt2 model"
expect "$tmp/model.out" "transformer.h.0.attn.c_attn.weight  F16    [384, 1152]  model-00001-of-00002.safetensors" "inspect gpt2 model"
expect "$tmp/model.out" "recording: none" "inspect gpt2 model"
[ "$(grep -c '^transformer\.' "$tmp/model.out")" -eq 4 ] || fail "--tensors glob should keep 4 tensors"

# --no-stats drops the statistics columns.
"$kvb" inspect "$src/data/reference/gpt2-bytes-reference.safetensors" --no-stats >"$tmp/ref.out" 2>&1 || fail "inspect reference"
expect "$tmp/ref.out" "input_ids  I32" "inspect reference --no-stats"
grep -q "absmax" "$tmp/ref.out" && fail "--no-stats still prints statistics"

# A tensor with NaN and Inf: statistics count them and do not crash; the recording
# check then reports the first bad element and exits 1.
python_free_nan="$tmp/nan.safetensors"
header='{"layers.0.query":{"dtype":"F32","shape":[1,2,1],"data_offsets":[0,8]},"layers.0.key":{"dtype":"F32","shape":[1,2,1],"data_offsets":[8,16]},"layers.0.value":{"dtype":"F32","shape":[1,2,1],"data_offsets":[16,24]}}'
len=${#header}
{
  printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((len & 255)) $((len >> 8)))"
  printf '%s' "$header"
  # query: 1.0, NaN   key: +Inf, 2.0   value: 0.5, 0.25  (little-endian F32)
  printf '\x00\x00\x80\x3f\x00\x00\xc0\x7f\x00\x00\x80\x7f\x00\x00\x00\x40\x00\x00\x00\x3f\x00\x00\x80\x3e'
} >"$python_free_nan"
"$kvb" inspect "$python_free_nan" >"$tmp/nan.out" 2>"$tmp/nan.err"
rc=$?
[ "$rc" -eq 1 ] || fail "inspect of a recording with NaN should exit 1, got $rc"
grep -qE '^layers\.0\.query +F32 +\[1, 2, 1\] +1 +1 +1 +0 +1 +1 +0$' "$tmp/nan.out" || fail "NaN not counted in the statistics"
grep -qE '^layers\.0\.key +F32 +\[1, 2, 1\] +2 +2 +2 +0 +2 +0 +1$' "$tmp/nan.out" || fail "Inf not counted in the statistics"
expect "$tmp/nan.err" "nan.safetensors" "inspect NaN recording (stderr)"
expect "$tmp/nan.err" "layer 0 query[0, 1, 0] is NaN" "inspect NaN recording (stderr)"

# Broken files: non-zero exit, the message names the file.
head -c 100 "$rec" >"$tmp/truncated.safetensors"
"$kvb" inspect "$tmp/truncated.safetensors" >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
[ "$rc" -eq 1 ] || fail "inspect of a truncated file should exit 1, got $rc"
expect "$tmp/bad.err" "truncated.safetensors" "inspect truncated file"
header_length=$(head -c 8 "$rec" | od -An -tu8 | tr -d ' ')  # safetensors: a little-endian u64 first
expect "$tmp/bad.err" "header length $header_length extends beyond the file" "inspect truncated file"

"$kvb" inspect "$tmp/does-not-exist.npz" >/dev/null 2>"$tmp/missing.err"
rc=$?
[ "$rc" -eq 1 ] || fail "inspect of a missing file should exit 1, got $rc"
expect "$tmp/missing.err" "does-not-exist.npz: no such file or directory" "inspect missing file"

"$kvb" inspect "$rec" --layout heads,tokns,head_dim >/dev/null 2>"$tmp/layout.err"
rc=$?
[ "$rc" -eq 2 ] || fail "a bad --layout is a usage error (exit 2), got $rc"
expect "$tmp/layout.err" "did you mean 'tokens'" "inspect --layout typo"

"$kvb" inspect >/dev/null 2>&1
[ $? -eq 2 ] || fail "inspect without FILE should exit 2"
"$kvb" inspect --help >"$tmp/help.out" || fail "inspect --help"
expect "$tmp/help.out" "--positions" "inspect --help"

# Options that cannot mean anything are usage errors (exit 2), in the table commands too.
bad_command_lines=(
  "inspect $rec --max-tokens -1"
  "inspect $rec --no-recording --check-output"
  "metrics --bogus"
  "metrics extra"
  "strategies --bogus"
  "formats extra"
  "bounds --quick --samples 0 --out $tmp/bounds"
)
for line in "${bad_command_lines[@]}"; do
  # shellcheck disable=SC2086  # each line is a command line
  "$kvb" $line >/dev/null 2>"$tmp/bad.err"
  rc=$?
  [ $rc -eq 2 ] || fail "kvbudget $line: expected exit 2, got $rc"
  [ -s "$tmp/bad.err" ] || fail "kvbudget $line: no message"
done
"$kvb" metrics --help >/dev/null || fail "metrics --help"
# The metric table says which points.csv columns carry each metric's uncertainty.
"$kvb" metrics >"$tmp/metrics.out" 2>&1 || fail "metrics exited $?"
grep -qE '^attn_kl_mean +attention +lower +_lo/_hi ' "$tmp/metrics.out" || fail "metrics: attn_kl_mean without _lo/_hi"
grep -qE '^ppl_ratio +model +lower +_se ' "$tmp/metrics.out" || fail "metrics: ppl_ratio without _se"
grep -qE '^k_rel_mse +tensor +lower +- ' "$tmp/metrics.out" || fail "metrics: k_rel_mse should have no uncertainty"

# A slice of Hugging Face's recording (data/reference/: layers 0 and 5, 128 tokens) is a
# recording once its layers are listed.
slice="$src/data/reference/llama-bytes-record-slice.safetensors"
"$kvb" inspect "$slice" --layers 0,5 --positions 16 --check-output >"$tmp/slice.out" 2>&1 || fail "inspect --layers 0,5 of the slice exited $?"
expect "$tmp/slice.out" "2 layers, 6/2 q/kv heads, head_dim 64, 128 tokens" "inspect --layers of the slice"
grep -q MISMATCH "$tmp/slice.out" && fail "the slice's attn_output should match"
"$kvb" inspect "$slice" --no-stats >"$tmp/noslice.out" 2>&1
[ $? -eq 1 ] || fail "a slice without --layers: expected exit 1"
expect "$tmp/noslice.out" "layer 1 is missing: the key pattern 'layers.{layer}.key' matches layers 0, 5" "a slice without --layers"
"$kvb" inspect "$slice" --no-stats --layers 0,x >"$tmp/badlayers.out" 2>&1
[ $? -eq 2 ] || fail "--layers 0,x: expected exit 2"
expect "$tmp/badlayers.out" "--layers 0,x: 'x' is not a layer index" "--layers 0,x"

# One token: no query position attends to more than one key, so there is no entropy to
# report (not a table of zeros).
"$kvb" inspect "$slice" --layers 0,5 --max-tokens 1 >"$tmp/one.out" 2>&1 || fail "inspect --max-tokens 1 exited $?"
expect "$tmp/one.out" "attention entropy: not defined, the recording has 1 token(s)" "inspect of one token"
grep -q "Shannon H" "$tmp/one.out" && fail "inspect of one token printed an entropy table"
"$kvb" inspect "$slice" --layers 0,5 --max-tokens 1 --json >"$tmp/one.json" 2>&1 || fail "inspect --max-tokens 1 --json exited $?"
/usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['recording']; sys.exit(0 if r['entropy'] is None and r['entropy_positions']==0 else 1)" "$tmp/one.json" \
  || fail "inspect --json of one token: expected entropy null"

exit $status
