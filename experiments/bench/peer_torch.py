#!/usr/bin/env python3
"""The PyTorch peer of kvbudget's CUDA attention metrics: the eager script a researcher
would write on a GPU instead of using kvbudget, run side by side with `kvbudget run
--backend cuda` by bench_gpu_peer.sh (issue 20, GPU goal).

Per layer, queries [q_heads, T, d], keys and values [kv_heads, T, d] (GQA: each KV head
serves q_heads / kv_heads query heads), fp32 on the device. The exact attention (log p,
o = p·V) is computed once per run and kept, as a sweep would. Each point quantizes every
key and value with a uniform int format (methods.md §2: asymmetric min-max or symmetric
absmax over groups of G channels of a token, `int<b>-<sym|asym>-g<G>`, fp16 scale and
zero, round half to even), then at every query position: the causal logits of the
quantized keys, log p̂ (log_softmax), KL(p ‖ p̂) and ‖o − ô‖/‖o‖ with ô = p̂·V̂, averaged over
all rows (the means kvbudget reports as attn_kl_mean and attn_out_rel_err).

Data: a kvbudget recording (safetensors: layers.<i>.query/key/value) or --synthetic
LAYERS,Q_HEADS,KV_HEADS,TOKENS,HEAD_DIM (Gaussian, seeded; the timing does not depend
on the values). Prints one JSON object: device, exact pass seconds, per format the two
metrics and seconds per point (best of --repeats, CUDA synchronised)."""
import argparse
import json
import re
import struct
import time

import numpy as np
import torch


def load_recording(path, device):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or not re.fullmatch(r"layers\.\d+\.(query|key|value)", name):
            continue
        a, b = t["data_offsets"]
        if t["dtype"] == "BF16":
            arr = (np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], dtype={"F16": np.float16, "F32": np.float32}[t["dtype"]])
        out[name] = torch.from_numpy(arr.reshape(t["shape"]).astype(np.float32)).to(device)
    n_layers = len([k for k in out if k.endswith(".key")])
    return [tuple(out[f"layers.{i}.{n}"] for n in ("query", "key", "value")) for i in range(n_layers)]


def synthetic(spec, device, seed):
    layers, hq, hkv, t, d = (int(v) for v in spec.split(","))
    g = torch.Generator(device=device).manual_seed(seed)
    return [tuple(torch.randn(h, t, d, generator=g, device=device) for h in (hq, hkv, hkv)) for _ in range(layers)]


def quantize(x, fmt):
    """x [heads, T, d] fp32 -> the dequantized tensor (groups of G channels per token)."""
    m = re.fullmatch(r"int(\d)-(sym|asym)-g(\d+)", fmt)
    if not m:
        raise SystemExit(f"peer_torch: unsupported format {fmt} (int<b>-<sym|asym>-g<G>)")
    bits, sym, g = int(m[1]), m[2] == "sym", int(m[3])
    h, t, d = x.shape
    xg = x.reshape(h, t, d // g, g)
    f16 = lambda v: v.half().float()  # noqa: E731
    if sym:
        qmax = float(2 ** (bits - 1) - 1)
        scale = f16(xg.abs().amax(-1, keepdim=True) / qmax)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.where(scale > 0, torch.clamp(torch.round(xg / safe), -qmax, qmax), torch.zeros_like(xg))
        xq = q * scale
    else:
        levels = float(2**bits - 1)
        lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
        zero, scale = f16(lo), f16((hi - lo) / levels)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.where(scale > 0, torch.clamp(torch.round((xg - zero) / safe), 0, levels), torch.zeros_like(xg))
        xq = q * scale + zero
    return xq.reshape(h, t, d)


def causal_log_softmax(q, k, mask):
    s = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    return torch.log_softmax(s.masked_fill(mask, float("-inf")), dim=-1)


def expand(x, rep):  # GQA: [kv_heads, T, d] -> [q_heads, T, d]
    return x.repeat_interleave(rep, dim=0) if rep > 1 else x


def exact_pass(layers):
    t = layers[0][0].shape[1]
    mask = torch.ones(t, t, dtype=torch.bool, device=layers[0][0].device).triu(1)
    out = []
    for q, k, v in layers:
        rep = q.shape[0] // k.shape[0]
        logp = causal_log_softmax(q, expand(k, rep), mask)
        out.append((logp, torch.matmul(logp.exp(), expand(v, rep))))
    return mask, out


def point(layers, exact, mask, fmt):
    kl_sum = err_sum = 0.0
    rows = 0
    for (q, k, v), (logp, o) in zip(layers, exact):
        rep = q.shape[0] // k.shape[0]
        logph = causal_log_softmax(q, expand(quantize(k, fmt), rep), mask)
        p = logp.exp()
        kl = torch.where(mask, torch.zeros_like(p), p * (logp - logph)).sum(-1)
        oh = torch.matmul(logph.exp(), expand(quantize(v, fmt), rep))
        rel = (oh - o).norm(dim=-1) / o.norm(dim=-1)
        kl_sum += kl.sum()
        err_sum += rel.sum()
        rows += kl.numel()
    return {"attn_kl_mean": float(kl_sum) / rows, "attn_out_rel_err": float(err_sum) / rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("recording", nargs="?")
    ap.add_argument("--synthetic", help="LAYERS,Q_HEADS,KV_HEADS,TOKENS,HEAD_DIM")
    ap.add_argument("--formats", default="int4-asym-g32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matrix products (default: exact fp32)")
    a = ap.parse_args()
    if bool(a.recording) == bool(a.synthetic):
        raise SystemExit("peer_torch: give a recording or --synthetic, not both")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    layers = load_recording(a.recording, device) if a.recording else synthetic(a.synthetic, device, a.seed)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        mask, exact = exact_pass(layers)
        sync()
        result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                  "tf32": a.tf32, "exact_seconds": time.perf_counter() - t0, "points": {}}
        for fmt in a.formats.split(","):
            best = float("inf")
            for _ in range(a.repeats):
                sync()
                t0 = time.perf_counter()
                metrics = point(layers, exact, mask, fmt)  # float() synchronises
                best = min(best, time.perf_counter() - t0)
            result["points"][fmt] = dict(metrics, seconds=best)
        if device == "cuda":
            result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(result))


if __name__ == "__main__":
    main()
