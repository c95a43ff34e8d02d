#!/usr/bin/env bash
# `kvbudget quantize` end to end on a .npy written here: ggml code dumps have
# blocks x block bytes, the dequantized tensor keeps its shape, errors are clear.
# $1 = kvbudget binary, $2 = source dir.
set -u
KVB="$1"
command -v perl >/dev/null || { echo "perl not found: cannot write the test .npy"; exit 77; }
DIR="$(mktemp -d)"
trap 'rm -rf "$DIR"' EXIT
fails=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# A float32 .npy [3, 40, 64] (7680 values) with a deterministic fill in
# [-SPAN/2, SPAN/2) (SPAN from the environment, default 4).
write_npy() {
perl - "$@" <<'PERL'
my ($out, @shape) = @ARGV;
my $span = $ENV{SPAN} // 4.0;
my $n = 1; $n *= $_ for @shape;
my $dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" . join(", ", @shape) . "), }";
my $total = int((10 + length($dict) + 1 + 63) / 64) * 64;
$dict .= " " x ($total - 10 - length($dict) - 1) . "\n";
open(my $fh, '>:raw', $out) or die "$out: $!";
print $fh "\x93NUMPY\x01\x00" . pack("v", length($dict)) . $dict;
my $s = 12345;
for (1 .. $n) { $s = ($s * 1103515245 + 12345) % 2147483648; print $fh pack("f<", ($s / 2147483648.0 - 0.5) * $span); }
PERL
}
write_npy "$DIR/k.npy" 3 40 64
rows=120
npy_bytes=$(stat -c %s "$DIR/k.npy")

"$KVB" quantize "$DIR/k.npy" --format q4_0 --out "$DIR/q40" > "$DIR/q40.txt"
check "q4_0 exits 0" "[ $? -eq 0 ]"
check "q4_0 codes = blocks x 18 bytes" "[ $(stat -c %s "$DIR/q40.codes.bin") -eq $((rows * 2 * 18)) ]"
check "q4_0 dequantized .npy has the input's shape and size" \
  "[ $(stat -c %s "$DIR/q40.dequant.npy") -eq $npy_bytes ] && head -c 128 "$DIR/q40.dequant.npy" | grep -q \"'shape': (3, 40, 64)\""
check "q4_0 prints 4.5 bits per element" "grep -q 'bits/element  4.500000' '$DIR/q40.txt'"
check "q4_0 prints the error" "grep -q 'relative MSE' '$DIR/q40.txt' && grep -q 'SNR' '$DIR/q40.txt' && grep -q 'max abs error' '$DIR/q40.txt'"
check "q4_0 layout sidecar" "grep -q 'block_q4_0' '$DIR/q40.codes.bin.json'"

"$KVB" quantize "$DIR/k.npy" -f q8_0 --codes "$DIR/q80.bin" --json > "$DIR/q80.json"
check "q8_0 codes = blocks x 34 bytes" "[ $(stat -c %s "$DIR/q80.bin") -eq $((rows * 2 * 34)) ]"
check "q8_0 --json has bpe 8.5" "grep -q '\"bpe\": 8.5' '$DIR/q80.json'"

"$KVB" quantize "$DIR/k.npy" -f iq4_nl --codes "$DIR/iq4.bin" > /dev/null
check "iq4_nl codes = blocks x 18 bytes" "[ $(stat -c %s "$DIR/iq4.bin") -eq $((rows * 2 * 18)) ]"

"$KVB" quantize "$DIR/k.npy" -f mxfp4 --dequant "$DIR/mx.safetensors" > /dev/null
check "safetensors output" "[ -s '$DIR/mx.safetensors' ] && head -c 200 '$DIR/mx.safetensors' | grep -q '\"dtype\":\"F32\"'"

"$KVB" quantize "$DIR/k.npy" -f turboquant-3 --rows-per-span 40 --seed 7 --codes "$DIR/t3.bin" > "$DIR/t3.txt"
check "turbo per-span code dump = exact storage bits" \
  "[ $(stat -c %s "$DIR/t3.bin") -eq $(( (rows * (64 * 3 + 16) + 7) / 8 )) ] && grep -q '3.250000' '$DIR/t3.txt'"

"$KVB" quantize "$DIR/k.npy" -f keep-fp32 > "$DIR/keep.txt"
check "keep-fp32 is lossless" "grep -q 'SNR           inf' '$DIR/keep.txt'"

"$KVB" quantize "$DIR/k.npy" -f q4_O > /dev/null 2> "$DIR/err.txt"
check "unknown format: usage error with a suggestion" "[ $? -eq 2 ] && grep -q \"did you mean 'q4_0'\" '$DIR/err.txt'"
"$KVB" quantize "$DIR/k.npy" -f qjl-m64 --kind value > /dev/null 2> "$DIR/err.txt"
check "QJL on values is refused" "[ $? -eq 2 ] && grep -q 'stores keys only (a sketch for attention logits); it cannot quantize values' '$DIR/err.txt'"
"$KVB" quantize "$DIR/missing.npy" -f q4_0 > /dev/null 2> "$DIR/err.txt"
check "missing file: error naming it" "[ $? -eq 1 ] && grep -q 'missing.npy' '$DIR/err.txt'"
"$KVB" quantize "$DIR/k.npy" -f q4_0 --tensor nope > /dev/null 2> "$DIR/err.txt"
check "unknown tensor name" "[ $? -eq 2 ] && grep -q \"no tensor 'nope'\" '$DIR/err.txt'"

# Finite input beyond the format's range: the output is not finite, and it says so
# (never "lossless").
SPAN=4e30 write_npy "$DIR/huge.npy" 2 32
"$KVB" quantize "$DIR/huge.npy" -f q8_0 > "$DIR/huge.txt"
check "overflowing format: warned, not lossless" \
  "[ $? -eq 0 ] && grep -q 'dequantized values are NaN or infinite' '$DIR/huge.txt' && ! grep -q lossless '$DIR/huge.txt'"

# Finite input beyond what fp16 scales reach: clipped values are counted and warned
# about; fp32 scales reach them.
SPAN=1e7 write_npy "$DIR/big.npy" 4 64
"$KVB" quantize "$DIR/big.npy" -f int4-sym-g32 > "$DIR/big.txt"
check "saturated fp16 scales: warned about the clipped values" \
  "[ $? -eq 0 ] && grep -q 'values lie beyond the range of int4-sym-g32 and come back clipped' '$DIR/big.txt'"
"$KVB" quantize "$DIR/big.npy" -f int4-sym-g32-sfp32 --json > "$DIR/big.json"
check "fp32 scales: no clipped values" "[ $? -eq 0 ] && grep -q '\"clipped_values\": 0' '$DIR/big.json'"
"$KVB" quantize "$DIR/k.npy" -f int4-sym-g32 > "$DIR/small.txt"
check "ordinary input: no warning" "[ $? -eq 0 ] && ! grep -q warning '$DIR/small.txt'"

# Pre-RoPE formats on a recording's keys: RoPE re-applied from key_pre_rope.
REC="$2/data/records/llama-bytes-record.safetensors"
"$KVB" quantize "$REC" -t layers.0.key -f prerope:keep-fp32 --pre-rope layers.0.key_pre_rope > "$DIR/pr.txt"
check "prerope:keep-fp32 re-applies RoPE (relative MSE < 1e-6, 2 spans of 512 tokens)" \
  "[ $? -eq 0 ] && grep -q '2 span(s)' '$DIR/pr.txt' && awk '/relative MSE/ { exit !(\$3 < 1e-6) }' '$DIR/pr.txt'"
"$KVB" quantize "$REC" -t layers.0.key -f kvquant-nuq4-1% > /dev/null 2> "$DIR/err.txt"
check "a pre-RoPE format without --pre-rope says what to give" "[ $? -eq 2 ] && grep -q 'quantizes keys before RoPE: give --pre-rope' '$DIR/err.txt'"
"$KVB" quantize "$REC" -t layers.0.value -f prerope:int4-asym-g32 --kind value > /dev/null 2> "$DIR/err.txt"
check "a pre-RoPE format on values needs no --pre-rope (values are not rotated)" "[ $? -eq 0 ]"
# Without --kind, a tensor named *value(s) is quantized as values, anything else as keys.
"$KVB" quantize "$REC" -t layers.0.value -f prerope:int4-asym-g32 > "$DIR/kind.txt" 2> "$DIR/err.txt"
check "layers.0.value is values without --kind" \
  "[ $? -eq 0 ] && grep -q \"kind          value (from the tensor's name\" '$DIR/kind.txt'"
"$KVB" quantize "$REC" -t layers.0.value -f qjl-m64 > /dev/null 2> "$DIR/err.txt"
check "QJL on a tensor named value: refused, saying where the kind came from" \
  "[ $? -eq 2 ] && grep -q \"tensor 'layers.0.value' is quantized as values (from the tensor's name\" '$DIR/err.txt'"
"$KVB" quantize "$REC" -t layers.0.value -f qjl-m64 --kind key --json > "$DIR/kind.json"
check "--kind key overrides the name" "[ $? -eq 0 ] && grep -q '\"kind\": \"key\"' '$DIR/kind.json'"
"$KVB" quantize "$REC" -t layers.0.key -f int4-asym-g32 > "$DIR/kind.txt"
check "layers.0.key is keys" "[ $? -eq 0 ] && grep -q \"kind          key (from the tensor's name\" '$DIR/kind.txt'"
"$KVB" quantize "$REC" -t layers.0.key -f prerope:int4-asym-g32 --pre-rope layers.0.key_pre_rope --rope-theta=-5 \
  > /dev/null 2> "$DIR/err.txt"
check "a non-positive --rope-theta is refused" "[ $? -eq 2 ] && grep -q 'rope-theta must be a finite number > 0' '$DIR/err.txt'"
# The pre-RoPE keys must rotate into the keys (check_pre_rope_keys): a wrong theta, or
# spans that restart at position 0 mid-sequence, are refused instead of giving a wrong error.
"$KVB" quantize "$REC" -t layers.0.key -f prerope:int8-asym-g32 --pre-rope layers.0.key_pre_rope --rope-theta 500000 \
  > /dev/null 2> "$DIR/err.txt"
check "a wrong --rope-theta is refused, naming theta, error and causes" \
  "[ $? -eq 1 ] && grep -q 'RoPE (theta 500000, positions 0..511) of the pre-RoPE keys does not give the post-RoPE keys' \
    '$DIR/err.txt' && grep -q 'a wrong --rope-theta' '$DIR/err.txt'"
"$KVB" quantize "$REC" -t layers.0.key -f prerope:int8-asym-g32 --pre-rope layers.0.key_pre_rope --rows-per-span 64 \
  > /dev/null 2> "$DIR/err.txt"
check "--rows-per-span that restarts positions mid-sequence is refused" \
  "[ $? -eq 1 ] && grep -q 'positions 0..63) of the pre-RoPE keys' '$DIR/err.txt' \
    && grep -q -- '--rows-per-span 64' '$DIR/err.txt'"
"$KVB" quantize "$REC" -t layers.0.key -f prerope:int8-asym-g32 --pre-rope layers.0.key_pre_rope --rope-theta 10000 \
  > /dev/null 2> "$DIR/err.txt"
check "the right --rope-theta passes" "[ $? -eq 0 ]"

# Seeds follow the config's rule (`--set seed=-1` is refused): -1 is not 2^64 - 1.
"$KVB" quantize "$DIR/k.npy" -f turboquant-3 --seed -1 > /dev/null 2> "$DIR/err.txt"
check "--seed -1 is refused" "[ $? -eq 2 ] && grep -q -- '--seed must be >= 0, got -1' '$DIR/err.txt'"
"$KVB" bounds --quick --seed -1 --out "$DIR/bounds" > /dev/null 2> "$DIR/err.txt"
check "bounds --seed -1 is refused" "[ $? -eq 2 ] && grep -q -- '--seed must be >= 0, got -1' '$DIR/err.txt'"
mkfifo "$DIR/pipe.npy"
"$KVB" quantize "$DIR/pipe.npy" -f q4_0 > /dev/null 2> "$DIR/err.txt"
check "a FIFO as the input is refused, not waited on" \
  "[ $? -eq 1 ] && grep -q 'pipe.npy: is a FIFO (named pipe), not a regular file' '$DIR/err.txt'"

"$KVB" quantize "$DIR/k.npy" -f q4_0 --rows-per-span 0 > /dev/null 2> "$DIR/err.txt"
check "--rows-per-span 0 is refused" "[ $? -eq 2 ] && grep -q 'rows-per-span must be >= 1' '$DIR/err.txt'"

cp "$DIR/k.npy" "$DIR/k_copy.npy"
"$KVB" quantize "$DIR/k_copy.npy" -f q4_0 --dequant "$DIR/k_copy.npy" > /dev/null 2> "$DIR/err.txt"
check "--dequant naming the input is refused, the input kept" \
  "[ $? -eq 2 ] && grep -q 'is the input file' '$DIR/err.txt' && cmp -s '$DIR/k.npy' '$DIR/k_copy.npy'"
"$KVB" quantize "$DIR/k.npy" -f q4_0 --codes "$DIR/no_such_dir/c.bin" > /dev/null 2> "$DIR/err.txt"
check "--codes in a missing directory is refused before quantizing" "[ $? -eq 2 ] && grep -q 'does not exist' '$DIR/err.txt'"

write_npy "$DIR/scalar.npy"
"$KVB" quantize "$DIR/scalar.npy" -f q4_0 > /dev/null 2> "$DIR/err.txt"
check "a 0-d array is called a scalar, not empty" "[ $? -eq 2 ] && grep -q \"'scalar' is a scalar (shape \\[\\])\" '$DIR/err.txt'"

# The same .npy with a NaN at flat index 100 (row 1, column 36 of [3, 40, 64]).
cp "$DIR/k.npy" "$DIR/nan.npy"
hdr=$(( $(stat -c %s "$DIR/k.npy") - 7680 * 4 ))
printf '\x00\x00\xc0\x7f' | dd of="$DIR/nan.npy" bs=1 seek=$((hdr + 400)) conv=notrunc status=none
"$KVB" quantize "$DIR/nan.npy" -f q4_0 > /dev/null 2> "$DIR/err.txt"
check "NaN input: error naming the file and the index" \
  "[ $? -eq 1 ] && grep -q 'nan.npy' '$DIR/err.txt' && grep -q '\[0, 1, 36\]' '$DIR/err.txt'"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
