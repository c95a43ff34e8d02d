#!/usr/bin/env bash
# Hybrid models end to end (issue 21 item 6): a tiny random-weight Ministral checkpoint
# with sliding and full layers (layer_types), `kvbudget eval --layers`, a model sweep
# with data.quantize_layers, evaluation past the window (eval, generate, a sweep), and
# the errors. $1 = kvbudget binary, $2 = source dir.
# Exit 0 pass, 1 fail.
kvb="$1"
src="$2"
source "$(dirname "$0")/lib.sh"
llama="$src/data/models/llama-bytes"
text="$src/data/text/eval_kjv_revelation.txt"

# The checkpoints: 3 layers (sliding, full, sliding; window 64), F32 safetensors; the
# same weights with a window of 8 (evaluation past the window); and that shape with a
# byte vocabulary (generate).
/usr/bin/python3 - "$tmp" <<'EOF' || fail "writing the hybrid checkpoints"
import json, os, struct, sys
import numpy as np
def write(out, vocab, window, seed, ids_file=None):
    os.makedirs(out, exist_ok=True)
    L, H, heads, kv, d, inter = 3, 32, 4, 2, 8, 48
    config = {"architectures": ["MinistralForCausalLM"], "model_type": "ministral", "hidden_size": H,
              "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
              "intermediate_size": inter, "vocab_size": vocab, "rms_norm_eps": 1e-5, "hidden_act": "silu",
              "rope_theta": 10000.0, "sliding_window": window, "max_position_embeddings": 256, "bos_token_id": 0,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    rng = np.random.default_rng(seed)
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
    if ids_file:
        print(" ".join(str(i) for i in rng.integers(0, vocab, 48)), file=open(ids_file, "w"))
write(os.path.join(sys.argv[1], "hybrid"), 23, 64, 7, os.path.join(sys.argv[1], "ids.txt"))
write(os.path.join(sys.argv[1], "past"), 23, 8, 7)
write(os.path.join(sys.argv[1], "past_bytes"), 260, 8, 8)
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

# Past the window (48 tokens, W = 8): model-level evaluation runs as the model computes
# it. The exact path scripts/check_logits_hf.py calls (--ctx 0 --out logits.npy); a
# fixed format whose memory counts the last 8 tokens of a sliding layer (layer 1 at
# int2-asym-g8, 6 bpe, over its 48 tokens; layers 0 and 2 at keep-fp16 over 8 tokens);
# an allocating strategy calibrated below W; generate; a model sweep.
past="$tmp/past"
"$kvb" eval "$past" --tokens "$ids" --ctx 0 --out "$tmp/past_logits.npy" >"$tmp/past_exact.out" 2>&1 \
  || fail "eval past the window exited $?: $(cat "$tmp/past_exact.out")"
/usr/bin/python3 -c 'import numpy as np, sys
l = np.load(sys.argv[1]); assert l.shape == (48, 23) and np.isfinite(l).all(), l.shape' "$tmp/past_logits.npy" \
  || fail "eval past the window: logits"
"$kvb" eval "$past" --tokens "$ids" --format int2-asym-g8 --layers full --json >"$tmp/past_fixed.json" 2>"$tmp/err.txt" \
  || fail "eval --format past the window exited $?: $(cat "$tmp/err.txt")"
/usr/bin/python3 -c 'import json, math, sys
r = json.load(open(sys.argv[1]))
assert r["plan"].endswith("sliding:W8(layers 0,2)"), r["plan"]
want = (2 * 8 * 16 + 48 * 6) / (2 * 8 + 48)
assert abs(r["bpe"] - want) < 1e-9, (r["bpe"], want)
assert math.isfinite(r["kl_mean"]) and r["kl_mean"] > 0 and r["positions"] == 47, r' "$tmp/past_fixed.json" \
  || fail "eval --format past the window: plan and memory"
"$kvb" eval "$past" --tokens "$ids" --strategy entropy --param budget_bpe=8 --param 'family=int{b}-asym-g8' \
  >"$tmp/past_entropy.out" 2>&1 || fail "eval --strategy entropy past the window exited $?: $(cat "$tmp/past_entropy.out")"
expect "$tmp/past_entropy.out" "the strategy calibrated on the 1 calibration positions below the sliding window W = 8" \
  "entropy past the window"
expect "$tmp/past_entropy.out" "5 beyond it were left out" "entropy past the window"
# generate: a prompt longer than the window, the plan from the prompt's exact run.
"$kvb" generate "$tmp/past_bytes" --prompt "a prompt longer than eight bytes" --strategy entropy --param budget_bpe=8 \
  --param 'family=int{b}-asym-g8' -n 6 >"$tmp/past_gen.out" 2>&1 \
  || fail "generate past the window exited $?: $(cat "$tmp/past_gen.out")"
expect "$tmp/past_gen.out" "sliding:W8(layers 0,2)" "generate past the window"
# A config: model-level metrics only, no attribution; the same plan and memory as eval.
sed -e "s|^model = .*|model = \"$past\"|" -e 's/^quantize_layers = .*/quantize_layers = "full"/' \
  -e 's/"attn_kl_mean"\]/"same_top_rate"]/' "$tmp/hybrid.toml" >"$tmp/past.toml"
printf '[attribution]\npoints = "none"\n' >>"$tmp/past.toml"
"$kvb" run "$tmp/past.toml" --out "$tmp/results" -q --no-plots >"$tmp/run.out" 2>"$tmp/run.err" \
  || fail "sweep past the window exited $?: $(tail -5 "$tmp/run.err")"
/usr/bin/python3 -c 'import csv, json, sys
row = next(csv.DictReader(open(sys.argv[1])))
ev = json.load(open(sys.argv[2]))
assert row["plan"].endswith("sliding:W8(layers 0,2)"), row["plan"]
assert abs(float(row["bpe"]) - ev["bpe"]) < 1e-9, (row["bpe"], ev["bpe"])
assert abs(float(row["next_token_kl_mean"]) - ev["kl_mean"]) <= 1e-6 * ev["kl_mean"], (row["next_token_kl_mean"], ev["kl_mean"])
' "$tmp/results/hybrid/latest/points.csv" "$tmp/past_fixed.json" || fail "sweep past the window differs from eval"

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
# Past the window: attention-level metrics, the default attribution and recording files are refused.
sed -e "s|^model = .*|model = \"$past\"|" "$tmp/hybrid.toml" >"$tmp/past_attn.toml"
check_error "attention metric past the window" \
  "'attn_kl_mean' is an attention-level metric, but past slides over the last W = 8 tokens (layers 0,2) and 48 tokens are evaluated" \
  "$kvb" run "$tmp/past_attn.toml" --out "$tmp/results" -q
expect "$tmp/err.txt" "metrics.report" "attention metric past the window names the key"
sed -e 's/, "attn_kl_mean"\]/]/' "$tmp/past_attn.toml" >"$tmp/past_attr.toml"
check_error "attribution past the window" "attribution.points: attribution splits attention-level errors" \
  "$kvb" run "$tmp/past_attr.toml" --out "$tmp/results" -q
check_error "record past the window" "layer 0 uses sliding-window attention over the last W = 8 tokens" \
  "$kvb" record "$past" --tokens "$ids" --out "$tmp/past_record.safetensors"
# A bad layer type in config.json: exit 1, the file, key and entry named.
mkdir -p "$tmp/badtypes"
cp "$hybrid/model.safetensors" "$tmp/badtypes/"
sed 's/"full_attention"/"local_attention"/' "$hybrid/config.json" >"$tmp/badtypes/config.json"
"$kvb" eval "$tmp/badtypes" --tokens "$ids" >/dev/null 2>"$tmp/types.err"
[ $? -eq 1 ] || fail "a bad layer type should exit 1"
expect "$tmp/types.err" "badtypes/config.json: key 'layer_types': entry 1: unsupported layer type \"local_attention\"" \
  "bad layer type"
exit $status
