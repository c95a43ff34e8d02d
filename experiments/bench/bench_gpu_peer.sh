#!/usr/bin/env bash
# bench_gpu_peer: a kvbudget sweep point on the GPU against the PyTorch eager script a
# researcher would write (peer_torch.py), side by side in one run (issue 20, GPU goal:
# >= 5x the peer on the Llama-3-8B shape at 2048 tokens, every position).
#
#   bash experiments/bench/bench_gpu_peer.sh KVBUDGET [LAYERS Q_HEADS KV_HEADS TOKENS HEAD_DIM]
#
# Defaults: the Llama-3-8B shape, 32 layers x 32 query / 8 KV heads x 2048 tokens x
# head_dim 128. Both sides: synthetic fp32 data of that shape (kvbudget's generator and
# torch.randn; the timing does not depend on the values), uniform int{2,4,8}-asym-g32,
# attention KL and output error at every position (`metrics.positions = "all"`), the exact
# attention computed once per run. kvbudget's seconds per point are `seconds` in
# points.csv (`kvbudget run --backend cuda`); the peer's are the best of 3 (fp32, TF32
# off; KVB_BACKEND=cpu runs kvbudget on the CPU instead). Prints a Markdown table with the ratio peer / kvbudget (> 1: kvbudget faster).
set -euo pipefail
kvb=$1
L=${2:-32} QH=${3:-32} KVH=${4:-8} T=${5:-2048} D=${6:-128}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/kvb-gpu-peer.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/peer.toml" <<TOML
name = "gpu_peer"
seed = 0
[data.synthetic]
layers = $L
q_heads = $QH
kv_heads = $KVH
head_dim = $D
tokens = $T
entropy_mean = 9.0
entropy_spread = 4.0
[[strategy]]
type = "uniform"
format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4, 8]
[calibration]
overlap = true
[metrics]
positions = "all"
report = ["attn_kl_mean", "attn_out_rel_err"]
TOML
echo "shape: $L layers x $QH query / $KVH KV heads x $T tokens x head_dim $D; load $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
"$kvb" run "$work/peer.toml" --backend "${KVB_BACKEND:-cuda}" --out "$work/runs" --no-plots -q >"$work/run.log" 2>&1 ||
  { cat "$work/run.log"; exit 1; }
kvb_wall=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')
points=$work/runs/gpu_peer/latest/points.csv
python3 "$here/peer_torch.py" --synthetic "$L,$QH,$KVH,$T,$D" \
  --formats int2-asym-g32,int4-asym-g32,int8-asym-g32 >"$work/peer.json"
python3 - "$points" "$work/peer.json" "$kvb_wall" "${KVB_BACKEND:-cuda}" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
peer = json.load(open(sys.argv[2]))
print(f"kvbudget run --backend {sys.argv[4]}: {len(rows)} points, {float(sys.argv[3]):.1f} s wall in all "
      f"(data generation, upload and the exact pass included)")
print(f"peer: {peer['device']}, torch {peer['torch']}, exact pass {peer['exact_seconds']:.3f} s, "
      f"peak {peer.get('peak_gib', 0):.1f} GiB")
print("(the two sides' data differ: the metrics show the magnitudes agree, not the values)")
print("| format | kvbudget s/point | peer s/point | peer / kvbudget | kvbudget attn_kl_mean | peer attn_kl_mean | kvbudget attn_out_rel_err | peer attn_out_rel_err |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    fmt = r["plan"].split()[0].removeprefix("K:")  # "K:int4-asym-g32 V:int4-asym-g32"
    p = peer["points"].get(fmt)
    if p is None:
        print(f"| {fmt} | {float(r['seconds']):.4f} | - | - | {r['attn_kl_mean']} | - | {r['attn_out_rel_err']} | - |")
        continue
    print(f"| {fmt} | {float(r['seconds']):.4f} | {p['seconds']:.4f} | {p['seconds'] / float(r['seconds']):.2f} | "
          f"{float(r['attn_kl_mean']):.4g} | {p['attn_kl_mean']:.4g} | {float(r['attn_out_rel_err']):.4g} | "
          f"{p['attn_out_rel_err']:.4g} |")
PY
