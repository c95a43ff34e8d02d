#!/usr/bin/env bash
# data/: the recordings the build makes (data/CMakeLists.txt) against the slices of Hugging
# Face's recordings the repository keeps, and the repository's size against what a GPU
# machine receives (64 MiB, the GPU stage included; README.md, "Data").
# $1 = kvbudget binary, $2 = source dir. Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"

# The build made every recording, and git ignores them.
for name in gpt2-bytes llama-bytes reasoning-bytes; do
  rec="$src/data/records/$name-record.safetensors"
  [ -f "$rec" ] || { fail "$rec is missing: the build (data/CMakeLists.txt) makes it"; continue; }
  if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$src" check-ignore -q "$rec" || fail "$rec is not git-ignored (it is made by the build, not stored)"
  fi
done

# Each recording equals Hugging Face's where the slice has it (first 128 tokens, first and
# last layer, token ids), within fp16 rounding of both files: half an fp16 ulp of
# Hugging Face's value, one of ours, and 2e-5 of the tensor's largest value for the two
# fp32 forward passes (the tolerance of tests/model/test_model.cpp).
/usr/bin/python3 - "$src/data" >"$tmp/compare.out" 2>&1 <<'PY' || { fail "recordings differ from Hugging Face's slices"; cat "$tmp/compare.out" >&2; }
import json, struct, sys
import numpy as np

def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    types = {"F16": np.float16, "F32": np.float32, "I32": np.int32, "I64": np.int64}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=types[v["dtype"]]).reshape(v["shape"]) for k, v in header.items()}

data = sys.argv[1]
bad = 0
for name, tokens in [("gpt2-bytes", 512), ("llama-bytes", 512), ("reasoning-bytes", 977)]:
    ours = read(f"{data}/records/{name}-record.safetensors")
    hf = read(f"{data}/reference/{name}-record-slice.safetensors")
    ids = ours["input_ids"].astype(np.int64)
    ref_ids = read(f"{data}/reference/{name}-reference.safetensors")["input_ids"].astype(np.int64)
    if len(ids) != tokens or not np.array_equal(ids, ref_ids):
        print(f"{name}: token ids are not the reference file's {tokens}"); bad += 1
    worst = 0.0
    for key, want in hf.items():
        if key == "input_ids":
            continue
        got = ours[key].astype(np.float64)
        got = got[:len(want)] if key.endswith("attn_output") else got[:, :want.shape[1]]
        want = want.astype(np.float64)
        scale = np.abs(want).max()
        allowed = 2.0 ** -11 * (np.abs(want) + np.abs(got)) + 2.0 ** -24 + 2e-5 * scale
        over = int((np.abs(got - want) > allowed).sum())
        worst = max(worst, float(np.abs(got - want).max() / scale))
        if over:
            print(f"{name} {key}: {over} elements beyond fp16 rounding"); bad += 1
    print(f"{name}: {len(hf) - 1} tensors, worst |ours - HF| / max|HF| {worst:.3g}")
sys.exit(bad > 0)
PY

# The reasoning trace: 977 tokens, 4 layers of 4/2 heads, and attention recomputed from the
# recorded q/k/v reproduces the recorded attn_output.
"$kvb" inspect "$src/data/records/reasoning-bytes-record.safetensors" --positions 32 --check-output \
  >"$tmp/reasoning.out" 2>&1 || fail "inspect of the reasoning recording exited $?"
expect "$tmp/reasoning.out" "4 layers, 4/2 q/kv heads, head_dim 64, 977 tokens, post-RoPE (theta 10000)" "reasoning recording"
grep -q MISMATCH "$tmp/reasoning.out" && fail "the reasoning recording's attn_output should match"

# What a GPU machine receives: the repository's files (tracked, and untracked ones git
# does not ignore) plus the GPU stage (scripts/gpu_stage.sh, about 3.3 MB; 4 MB allowed),
# together at most 64 MiB. Skipped outside a git checkout.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  bytes=$(cd "$src" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  limit=$((64 * 1024 * 1024 - 4000000))
  echo "repository files: $bytes bytes (limit $limit: 64 MiB less 4 MB for the GPU stage)"
  [ "$bytes" -le "$limit" ] || fail "the repository's files take $bytes bytes, more than $limit (64 MiB less 4 MB for the GPU stage): make room (README.md, \"Data\")"
fi
cat "$tmp/compare.out"
exit $status
