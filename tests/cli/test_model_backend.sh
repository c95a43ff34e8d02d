#!/usr/bin/env bash
# `kvbudget eval` and `kvbudget generate` with --backend cpu | cuda | auto: cpu is the
# reference; cuda either runs on the device (where there is one: the same argmax at every
# position and logits within 1e-5 relative to the CPU's, and the same greedy tokens) or
# exits non-zero saying why (a build without CUDA, no device); auto always runs and says
# which backend it used; anything else is refused naming the choices.
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
llama="$src/data/models/llama-bytes"
text="$src/data/text/eval_kjv_revelation.txt"
prompt="And I saw a new heaven and a new earth: for the first heaven"

"$kvb" eval "$llama" --text "$text" --max-tokens 96 --format int4-asym-g32 --backend cpu --out "$tmp/cpu.npy" \
  >"$tmp/cpu.out" 2>&1 || fail "eval --backend cpu exited $?: $(cat "$tmp/cpu.out")"
expect "$tmp/cpu.out" "backend: cpu (requested)" "eval --backend cpu"

"$kvb" eval "$llama" --text "$text" --max-tokens 96 --format int4-asym-g32 --backend cuda --out "$tmp/cuda.npy" \
  >"$tmp/cuda.out" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  expect "$tmp/cuda.out" "backend: cuda (requested: " "eval --backend cuda"
  /usr/bin/python3 -c 'import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
rel = np.abs(a - b).max() / np.abs(a).max()
assert rel <= 1e-5, rel
assert (a.argmax(-1) == b.argmax(-1)).all()' "$tmp/cpu.npy" "$tmp/cuda.npy" 2>"$tmp/cmp.err" \
    || fail "eval: cuda logits differ from the cpu's: $(cat "$tmp/cmp.err")"
else
  [ $rc -eq 2 ] || fail "eval --backend cuda without a device: expected exit 2, got $rc"
  grep -qE "built without CUDA|no usable CUDA device" "$tmp/cuda.out" \
    || fail "eval --backend cuda: no reason given: $(cat "$tmp/cuda.out")"
  [ -e "$tmp/cuda.npy" ] && fail "eval --backend cuda failed but wrote its output"
fi

"$kvb" eval "$llama" --text "$text" --max-tokens 64 --backend auto >"$tmp/auto.out" 2>&1 \
  || fail "eval --backend auto exited $?: $(cat "$tmp/auto.out")"
grep -qE "^backend: (cpu|cuda) \(" "$tmp/auto.out" || fail "eval --backend auto: no backend line: $(head -5 "$tmp/auto.out")"

"$kvb" eval "$llama" --text "$text" --max-tokens 64 --backend gpu >"$tmp/bad.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "eval --backend gpu: expected exit 2, got $rc"
expect "$tmp/bad.out" 'backend must be "cpu", "cuda" or "auto", got "gpu"' "eval --backend gpu"

# --precision tf32 is the device pass's declared fast mode: refused with --backend cpu
# (eval and generate), anything but fp32/tf32 refused naming the choices.
"$kvb" eval "$llama" --text "$text" --max-tokens 64 --precision tf32 >"$tmp/tf32cpu.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "eval --precision tf32 on the cpu backend: expected exit 2, got $rc"
expect "$tmp/tf32cpu.out" 'precision = "tf32" is the CUDA backend' "eval --precision tf32 --backend cpu"
"$kvb" generate "$llama" --prompt "$prompt" -n 4 --precision tf32 >"$tmp/gtf32cpu.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "generate --precision tf32 on the cpu backend: expected exit 2, got $rc"
"$kvb" eval "$llama" --text "$text" --max-tokens 64 --backend auto --precision bf16 >"$tmp/bf16.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "eval --precision bf16: expected exit 2, got $rc"
expect "$tmp/bf16.out" 'precision must be "fp32" or "tf32", got "bf16"' "eval --precision bf16"
"$kvb" eval "$llama" --text "$text" --max-tokens 64 --backend auto --precision tf32 --json >"$tmp/auto_tf32.json" \
  2>"$tmp/auto_tf32.err" || fail "eval --backend auto --precision tf32 exited $?: $(cat "$tmp/auto_tf32.err")"
/usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
assert ("precision" in j) == (j["backend"] == "cuda"), j.get("backend")' "$tmp/auto_tf32.json" \
  || fail "eval --json: precision must be reported exactly when the device ran"

# generate: the same continuations on both backends where there is a device.
"$kvb" generate "$llama" --prompt "$prompt" -n 24 --format int4-asym-g32 --backend cpu --json >"$tmp/gen_cpu.json" \
  2>"$tmp/gen_cpu.err" || fail "generate --backend cpu exited $?: $(cat "$tmp/gen_cpu.err")"
"$kvb" generate "$llama" --prompt "$prompt" -n 24 --format int4-asym-g32 --backend cuda --json >"$tmp/gen_cuda.json" \
  2>"$tmp/gen_cuda.err"
rc=$?
if [ $rc -eq 0 ]; then
  /usr/bin/python3 -c 'import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["backend"] == "cpu" and b["backend"] == "cuda", (a["backend"], b["backend"])
for k in ("exact", "quantized"):
    assert a[k]["ids"] == b[k]["ids"], (k, a[k]["ids"], b[k]["ids"])' "$tmp/gen_cpu.json" "$tmp/gen_cuda.json" \
    2>"$tmp/gcmp.err" || fail "generate: cuda tokens differ from the cpu's: $(cat "$tmp/gcmp.err")"
else
  [ $rc -eq 2 ] || fail "generate --backend cuda without a device: expected exit 2, got $rc"
  grep -qE "built without CUDA|no usable CUDA device" "$tmp/gen_cuda.err" \
    || fail "generate --backend cuda: no reason given: $(cat "$tmp/gen_cuda.err")"
fi
exit $status
