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
# attention computed once per run (kvbudget: during its first point, int3, which the peer
# does not run). kvbudget's seconds per point are `seconds` in points.csv (`kvbudget run
# --backend cuda --precision P` for P in $KVB_PRECISIONS, default "fp32 tf32"); the
# peer's are the best of 3 (fp32, TF32 off; KVB_BACKEND=cpu runs kvbudget on the CPU
# instead, fp32 only). Prints a Markdown table with the ratio peer / kvbudget (> 1:
# kvbudget faster), the wall time per point after the first (from the times its progress
# lines arrive) and, with both precisions, tf32's relative difference from fp32 on
# six metrics (the declared fast mode's error).
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
bits = [3, 2, 4, 8]
[calibration]
overlap = true
[metrics]
positions = "all"
report = ["attn_kl_mean", "attn_out_rel_err", "attn_kl_p99", "attn_out_rel_err_p99", "topk_overlap", "logit_rmse"]
TOML
backend=${KVB_BACKEND:-cuda}
precisions=${KVB_PRECISIONS:-fp32 tf32}
[ "$backend" = cpu ] && precisions=fp32
echo "shape: $L layers x $QH query / $KVH KV heads x $T tokens x head_dim $D; load $(cut -d' ' -f1-3 /proc/loadavg)"
# Each progress line ("point i/n done ...", on stderr as each point's results are
# final) is stamped with the time it arrived: the wall time per point after the first is
# (last stamp - first stamp) / (n - 1): each point's device work plus its host share
# (merging the layers' rows, the metrics and their bootstrap intervals), which `seconds`
# leaves out, without the run's data generation.
for prec in $precisions; do
  "$kvb" run "$work/peer.toml" --backend "$backend" --precision "$prec" --out "$work/runs_$prec" --no-plots \
    2>&1 >"$work/run_$prec.log" | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done \
    >"$work/progress_$prec" || { cat "$work/run_$prec.log" "$work/progress_$prec"; exit 1; }
done
python3 "$here/peer_torch.py" --synthetic "$L,$QH,$KVH,$T,$D" \
  --formats int2-asym-g32,int4-asym-g32,int8-asym-g32 >"$work/peer.json"
python3 - "$work" "$backend" $precisions <<'PY'
import csv, json, re, sys
work, backend, precs = sys.argv[1], sys.argv[2], sys.argv[3:]
peer = json.load(open(f"{work}/peer.json"))
runs = {p: list(csv.DictReader(open(f"{work}/runs_{p}/gpu_peer/latest/points.csv"))) for p in precs}
later_wall = {}
for p in precs:
    stamps = [float(l.split()[0]) for l in open(f"{work}/progress_{p}") if re.match(r"\S+ point \d+/\d+ done", l)]
    if len(stamps) != len(runs[p]):
        sys.exit(f"bench_gpu_peer: {len(stamps)} progress lines for {len(runs[p])} points ({work}/progress_{p})")
    later_wall[p] = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    print(f"kvbudget run --backend {backend} --precision {p}: {len(runs[p])} points; "
          f"wall per point after the first {later_wall[p]:.3f} s (between the first and last points' progress lines, "
          f"over {len(stamps) - 1} points: the device's work "
          f"and the host's merge, metrics and bootstrap intervals, which `seconds` leaves out)")
print(f"peer: {peer['device']}, torch {peer['torch']}, exact pass {peer['exact_seconds']:.3f} s, "
      f"peak {peer.get('peak_gib', 0):.1f} GiB")
print("(the two sides' data differ: the metrics show the magnitudes agree, not the values; kvbudget's first "
      "point, int3, also computes the run's exact scores and norms, which later points reuse)")
print("| format | precision | kvbudget s/point | peer s/point | peer / kvbudget | kvbudget attn_kl_mean | peer attn_kl_mean "
      "| kvbudget attn_out_rel_err | peer attn_out_rel_err |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
fmt_of = lambda r: r["plan"].split()[0].removeprefix("K:")  # "K:int4-asym-g32 V:int4-asym-g32"
for p in precs:
    for r in runs[p]:
        fmt, sec = fmt_of(r), float(r["seconds"])
        q = peer["points"].get(fmt)
        if q is None:
            print(f"| {fmt} | {p} | {sec:.4f} | - | - | {float(r['attn_kl_mean']):.4g} | - | "
                  f"{float(r['attn_out_rel_err']):.4g} | - |")
            continue
        print(f"| {fmt} | {p} | {sec:.4f} | {q['seconds']:.4f} | {q['seconds'] / sec:.2f} | "
              f"{float(r['attn_kl_mean']):.4g} | {q['attn_kl_mean']:.4g} | {float(r['attn_out_rel_err']):.4g} | "
              f"{q['attn_out_rel_err']:.4g} |")
peer_mean = sum(q["seconds"] for q in peer["points"].values()) / len(peer["points"])
for p in precs:
    print(f"wall per point, {p}: kvbudget {later_wall[p]:.3f} s, peer {peer_mean:.3f} s (mean of its formats): "
          f"peer / kvbudget {peer_mean / later_wall[p]:.2f}")
if "fp32" in runs and "tf32" in runs:
    print("\ntf32 against fp32 (the declared fast mode's metric error), relative difference per metric:")
    metrics = ["attn_kl_mean", "attn_out_rel_err", "attn_kl_p99", "attn_out_rel_err_p99", "topk_overlap", "logit_rmse"]
    print("| format | " + " | ".join(metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    for a, b in zip(runs["fp32"], runs["tf32"]):
        cells = []
        for m in metrics:
            x, y = float(a[m]), float(b[m])
            cells.append(f"{abs(y - x) / max(abs(x), 1e-30):.2e}")
        print(f"| {fmt_of(a)} | " + " | ".join(cells) + " |")
PY
