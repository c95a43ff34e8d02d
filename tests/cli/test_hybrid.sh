#!/usr/bin/env bash
# Hybrid models end to end (issue 21 item 6): a tiny random-weight Ministral checkpoint
# with sliding and full layers (layer_types), `kvbudget eval --layers`, a model sweep
# with data.quantize_layers, and the errors. $1 = kvbudget binary, $2 = source dir.
# Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
llama="$src/data/models/llama-bytes"
text="$src/data/text/eval_kjv_revelation.txt"

# The checkpoint: 3 layers (sliding, full, sliding; window 64), F32 safetensors.
/usr/bin/python3 - "$tmp/hybrid" <<'EOF' || fail "writing the hybrid checkpoint"
import json, os, struct, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
L, H, heads, kv, d, inter, vocab = 3, 32, 4, 2, 8, 48, 23
config = {"architectures": ["MinistralForCausalLM"], "model_type": "ministral", "hidden_size": H,
          "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
          "intermediate_size": inter, "vocab_size": vocab, "rms_norm_eps": 1e-5, "hidden_act": "silu",
          "rope_theta": 10000.0, "sliding_window": 64, "max_position_embeddings": 256, "bos_token_id": 0,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
rng = np.random.default_rng(7)
tensors = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, H)), "model.norm.weight": 1 + rng.normal(0, .1, H),
           "lm_head.weight": rng.normal(0, .3, (vocab, H))}
for l in range(L):
    b = f"model.layers.{l}."
    tensors.update({b + "input_layernorm.weight": 1 + rng.normal(0, .1, H),
                    b + "post_attention_layernorm.weight": 1 + rng.normal(0, .1, H),
                    b + "self_attn.q_proj.weight": rng.normal(0, .3, (heads * d, H)),
                    b + "self_attn.k_proj.weight": rng.normal(0, .3, (kv * d, H)),
                    b + "self_attn.v_proj.weight": rng.normal(0, .3, (kv * d, H)),
                    b + "self_attn.o_proj.weight": rng.normal(0, .2, (H, heads * d)),
                    b + "mlp.gate_proj.weight": rng.normal(0, .2, (inter, H)),
                    b + "mlp.up_proj.weight": rng.normal(0, .2, (inter, H)),
                    b + "mlp.down_proj.weight": rng.normal(0, .2, (H, inter))})
header, blobs, at = {}, [], 0
for name, t in tensors.items():
    raw = np.asarray(t, dtype="<f4").tobytes()
    header[name] = {"dtype": "F32", "shape": list(np.shape(t)), "data_offsets": [at, at + len(raw)]}
    blobs.append(raw)
    at += len(raw)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(" ".join(str(i) for i in rng.integers(0, vocab, 48)), file=open(os.path.join(out, "..", "ids.txt"), "w"))
EOF
hybrid="$tmp/hybrid"
ids="$tmp/ids.txt"

# eval: the summary names the layer types; --layers quantizes only the chosen layers.
"$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 --layers sliding >"$tmp/sliding.out" 2>&1 \
  || fail "eval --layers sliding exited $?: $(cat "$tmp/sliding.out")"
expect "$tmp/sliding.out" "hybrid: 2 sliding-window layers (W 64: 0,2), 1 full" "eval on a hybrid"
expect "$tmp/sliding.out" "uniform(format=int2-asym-g8) on layers 0,2 (others keep-fp16) = K:int2-asym-g8+keep-fp16" \
  "eval --layers sliding"
for sel in none all full sliding 1 0-1; do
  opt=(--layers "$sel")
  [ "$sel" = none ] && opt=()
  "$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 "${opt[@]}" --json >"$tmp/$sel.json" 2>"$tmp/$sel.err" \
    || fail "eval --layers $sel exited $?: $(cat "$tmp/$sel.err")"
done
# All layers chosen = no selection; the bits per element count the layers left out at
# keep-fp16 (16 bits): bpe(S) = (|S| bpe(all) + (3 - |S|) 16) / 3; "full" = layer 1.
/usr/bin/python3 - "$tmp" <<'EOF' || fail "eval --layers: selections against each other"
import json, sys
r = {s: json.load(open(f"{sys.argv[1]}/{s}.json")) for s in ["none", "all", "full", "sliding", "1", "0-1"]}
assert r["all"]["kl_mean"] == r["none"]["kl_mean"] and r["all"]["ppl"] == r["none"]["ppl"], "all != none"
assert r["all"]["bpe"] == r["none"]["bpe"]
q = r["all"]["bpe"]
for sel, n in [("full", 1), ("sliding", 2), ("1", 1), ("0-1", 2)]:
    want = (n * q + (3 - n) * 16) / 3
    assert abs(r[sel]["bpe"] - want) < 1e-9, (sel, r[sel]["bpe"], want)
assert r["full"]["kl_mean"] == r["1"]["kl_mean"], "full is layer 1"
for sel in ["full", "sliding"]:  # fewer quantized layers, less error than all of them, but not none
    assert 0 < r[sel]["kl_mean"] < r["all"]["kl_mean"], (sel, r[sel]["kl_mean"], r["all"]["kl_mean"])
EOF
# keep-fp32 for the others: they are exact and counted at 32 bits.
"$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 --layers 1 --other-layers-format keep-fp32 --json \
  >"$tmp/fp32.json" 2>"$tmp/fp32.err" || fail "eval --other-layers-format keep-fp32: $(cat "$tmp/fp32.err")"
/usr/bin/python3 -c 'import json, sys
a, q = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert abs(a["bpe"] - (q["bpe"] + 2 * 32) / 3) < 1e-9, (a["bpe"], q["bpe"])' "$tmp/fp32.json" "$tmp/all.json" \
  || fail "keep-fp32 others: bits per element"

# A model sweep: data.quantize_layers applies to every point's plan.
cat >"$tmp/hybrid.toml" <<EOF
name = "hybrid"
[data]
source = "model"
model = "$hybrid"
token_file = "$ids"
max_tokens = 0
continuations = 0
quantize_layers = "sliding"
[[strategy]]
type = "uniform"
format = "int2-asym-g8"
[metrics]
report = ["ppl_ratio", "next_token_kl_mean", "attn_kl_mean"]
positions = "all"   # as eval scores them (the calibration positions included)
EOF
"$kvb" run "$tmp/hybrid.toml" --out "$tmp/results" -q --no-plots >"$tmp/run.out" 2>"$tmp/run.err" \
  || fail "hybrid sweep exited $?: $(tail -5 "$tmp/run.err")"
/usr/bin/python3 -c 'import csv, json, sys
row = next(csv.DictReader(open(sys.argv[1])))
ev = json.load(open(sys.argv[2]))
assert "keep-fp16" in row["plan"], row["plan"]
assert abs(float(row["bpe"]) - ev["bpe"]) < 1e-9, (row["bpe"], ev["bpe"])
assert abs(float(row["next_token_kl_mean"]) - ev["kl_mean"]) <= 1e-6 * ev["kl_mean"], (row["next_token_kl_mean"], ev["kl_mean"])
' "$tmp/results/hybrid/latest/points.csv" "$tmp/sliding.json" || fail "sweep with quantize_layers differs from eval --layers sliding"

# Errors: exit 2, naming the option or the config key.
check_error() {  # check_error WHAT EXPECTED_TEXT COMMAND...
  local what="$1" want="$2"
  shift 2
  "$@" >/dev/null 2>"$tmp/err.txt"
  [ $? -eq 2 ] || fail "$what: expected exit 2"
  expect "$tmp/err.txt" "$want" "$what"
}
check_error "--layers out of range" "--layers '3': layer 3 does not exist: $hybrid has 3 layers (0..2)" \
  "$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 --layers 3
check_error "--layers bad word" "'fulll' is not a layer index or range" \
  "$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 --layers fulll
check_error "--layers sliding on a dense model" "has no sliding-window layers (0 of its 6 layers slide)" \
  "$kvb" eval "$llama" --text "$text" --max-tokens 32 --format int4-asym-g32 --layers sliding
check_error "--layers without a plan" "--layers needs a plan" "$kvb" eval "$hybrid" --tokens "$ids" --layers full
check_error "--other-layers-format without --layers" "--other-layers-format needs --layers" \
  "$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 --other-layers-format keep-fp32
check_error "--other-layers-format unknown" "--other-layers-format: " \
  "$kvb" eval "$hybrid" --tokens "$ids" --format int2-asym-g8 --layers 1 --other-layers-format keep-fp12
check_error "--layers with a budget" "--layers with budget_bpe" \
  "$kvb" eval "$hybrid" --tokens "$ids" --strategy uniform --param budget_bpe=4 --param 'family=int{b}-asym-g8' --layers 1
check_error "quantize_layers out of range" "quantize_layers '0,5': layer 5 does not exist: $hybrid has 3 layers" \
  "$kvb" run "$tmp/hybrid.toml" --out "$tmp/results" -q --set 'data.quantize_layers=[0, 5]'
expect "$tmp/err.txt" "data.quantize_layers" "quantize_layers out of range names the key"
sed 's/^quantize_layers = .*/other_layers_format = "keep-fp32"/' "$tmp/hybrid.toml" >"$tmp/other.toml"
check_error "other_layers_format without quantize_layers" "data.other_layers_format: only used with quantize_layers" \
  "$kvb" run "$tmp/other.toml" --out "$tmp/results" -q
# A bad layer type in config.json: exit 1, the file, key and entry named.
mkdir -p "$tmp/badtypes"
cp "$hybrid/model.safetensors" "$tmp/badtypes/"
sed 's/"full_attention"/"local_attention"/' "$hybrid/config.json" >"$tmp/badtypes/config.json"
"$kvb" eval "$tmp/badtypes" --tokens "$ids" >/dev/null 2>"$tmp/types.err"
[ $? -eq 1 ] || fail "a bad layer type should exit 1"
expect "$tmp/types.err" "badtypes/config.json: key 'layer_types': entry 1: unsupported layer type \"local_attention\"" \
  "bad layer type"
exit $status
