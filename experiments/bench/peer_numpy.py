#!/usr/bin/env python3
"""The NumPy peer of kvbudget's attention-level metrics: the script a researcher would
write instead of using kvbudget, run side by side with it by bench_metrics.

Reads a recording (safetensors, [heads, tokens, head_dim] per layer), quantizes every
key and value with a uniform int format (methods.md §2: asymmetric min-max or
symmetric absmax, groups along head_dim `g<G>` or along tokens `ch<G>`, fp16 scale
and zero, round half to even; groups along tokens causal as in methods.md §3: the query
at t reads its own open group exact) and computes the methods.md §4 metrics at every query
position in float64: KL(p || p̂), top-k overlap, ‖o - ô‖/‖o‖, logit errors, tensor
relative MSE. The exact attention (p, top-k of p, o) is computed once per run, as a
sweep would, and reused by every point.

Usage: peer_numpy.py RECORDING --formats f1,f2 [--tokens T] [--topk 8] [--repeats N]
Prints one JSON object: per format its metrics and seconds per point (wall and CPU,
best of N),
the exact pass's seconds, and the BLAS NumPy runs on. Threads: set
OPENBLAS_NUM_THREADS (bench_metrics does).
"""
import argparse
import json
import re
import struct
import sys
import time

import numpy as np

DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": None}


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        if t["dtype"] not in DTYPES:
            continue  # not a float tensor (the recorder's token ids): the metrics read none
        if t["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], dtype=DTYPES[t["dtype"]])
        out[name] = arr.reshape(t["shape"]).astype(np.float32)
    return out


def quantize(x, fmt):
    """x [heads, T, d] float32 -> the dequantized tensor, as kvbudget's int formats."""
    m = re.fullmatch(r"int(\d)-(sym|asym)-(g|ch)(\d+)", fmt)
    if not m:
        raise SystemExit(f"peer_numpy: unsupported format {fmt}")
    bits, sym, axis, g = int(m[1]), m[2] == "sym", m[3], int(m[4])
    h, t, d = x.shape
    if axis == "g":  # groups of g channels within each token
        xg = x.reshape(h, t, d // g, g)
        red = -1
    else:  # groups of g tokens within each channel
        assert t % g == 0, "ch groups must divide the tokens"
        xg = x.reshape(h, t // g, g, d)
        red = 2
    f16 = lambda v: v.astype(np.float16).astype(np.float32)
    if sym:
        qmax = float(2 ** (bits - 1) - 1)
        scale = f16(np.abs(xg).max(axis=red, keepdims=True) / np.float32(qmax))
        safe = np.where(scale > 0, scale, np.float32(1))
        q = np.where(scale > 0, np.clip(np.rint(xg / safe), -qmax, qmax), 0)
        xq = (q * scale).astype(np.float32)
    else:
        levels = float(2**bits - 1)
        lo, hi = xg.min(axis=red, keepdims=True), xg.max(axis=red, keepdims=True)
        zero, scale = f16(lo), f16((hi - lo) / np.float32(levels))
        safe = np.where(scale > 0, scale, np.float32(1))
        q = np.where(scale > 0, np.clip(np.rint((xg - zero) / safe), 0, levels), 0)
        xq = (q.astype(np.float32) * scale + zero).astype(np.float32)
    return xq.reshape(h, t, d)


def open_group_tokens(fmt):
    """G for a format whose groups run along tokens (int…-ch<G>), else 0."""
    m = re.fullmatch(r"int\d-(sym|asym)-ch(\d+)", fmt)
    return int(m[2]) if m else 0


NEG = -1e300  # masked (non-causal) logits: exp gives 0 and differences of two are 0


def masked_logits(q, k):
    t, d = q.shape[1], q.shape[2]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    s[:, np.triu(np.ones((t, t), dtype=bool), 1)] = NEG
    return s


def log_softmax(s):
    m = s.max(axis=-1, keepdims=True)
    return s - (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))


def gqa(x, rep):
    return x if rep == 1 else np.repeat(x, rep, axis=0)


def exact_pass(layers, topk):
    """Per layer: q, k, v (float64), exact logits, log p, p, o, and the top-k marks."""
    out = []
    for q, k, v in layers:
        rep = q.shape[0] // k.shape[0]  # GQA: each KV head serves `rep` query heads
        q, k, v = q.astype(np.float64), gqa(k, rep).astype(np.float64), gqa(v, rep).astype(np.float64)
        s = masked_logits(q, k)
        logp = log_softmax(s)
        p = np.exp(logp)
        top = np.argpartition(-s, topk - 1, axis=-1)[..., :topk]
        mark = np.zeros(s.shape, dtype=bool)
        np.put_along_axis(mark, top, True, axis=-1)
        mark &= ~np.triu(np.ones(s.shape[1:], dtype=bool), 1)  # only causal keys
        out.append(dict(q=q, k=k, v=v, s=s, logp=logp, p=p, o=p @ v, mark=mark))
    return out


def point_metrics(layers, exact, fmt, topk):
    kl, overlap, out_rel, err2s, norm2s, logit2, logit_max = [], [], [], [], [], 0.0, 0.0
    kerr = knorm = verr = vnorm = 0.0
    pairs = 0
    for (k32, v32), ex in zip(layers, exact):
        kq, vq = quantize(k32, fmt), quantize(v32, fmt)
        kerr += float(((kq - k32).astype(np.float64) ** 2).sum())
        verr += float(((vq - v32).astype(np.float64) ** 2).sum())
        knorm += float((k32.astype(np.float64) ** 2).sum())
        vnorm += float((v32.astype(np.float64) ** 2).sum())
        rep = ex["q"].shape[0] // kq.shape[0]
        sh = masked_logits(ex["q"], gqa(kq, rep).astype(np.float64))
        t = sh.shape[1]
        # Groups along tokens are causal (methods.md §3): the query at t reads the tokens of
        # its own, still open, group exact; closed groups are quantized from their G tokens.
        g = open_group_tokens(fmt)
        open_pairs = (np.arange(t)[:, None] // g == np.arange(t)[None, :] // g) if g else None
        if g:
            sh = np.where(open_pairs, ex["s"], sh)
        logph = log_softmax(sh)
        kl.append((ex["p"] * (ex["logp"] - logph)).sum(axis=-1).ravel())
        top = np.argpartition(-sh, topk - 1, axis=-1)[..., :topk]
        causal = top <= np.arange(t)[None, :, None]
        common = (np.take_along_axis(ex["mark"], top, axis=-1) & causal).sum(axis=-1)
        overlap.append((common / np.minimum(topk, np.arange(1, t + 1))[None, :]).ravel())
        ph = np.exp(logph)
        oh = ph @ gqa(vq, rep).astype(np.float64)
        if g:  # the open group's values exact
            oh += (ph * open_pairs) @ (ex["v"] - gqa(vq, rep).astype(np.float64))
        e2 = ((oh - ex["o"]) ** 2).sum(axis=-1)
        n2 = (ex["o"] ** 2).sum(axis=-1)
        err2s.append(e2.ravel())
        norm2s.append(n2.ravel())
        out_rel.append(np.sqrt(e2 / n2).ravel())
        ds = np.where(np.triu(np.ones((t, t), dtype=bool), 1), 0.0, sh - ex["s"])
        logit2 += float((ds**2).sum())
        logit_max = max(logit_max, float(np.abs(ds).max()))
        pairs += sh.shape[0] * t * (t + 1) // 2
    kl, overlap, out_rel = np.concatenate(kl), np.concatenate(overlap), np.concatenate(out_rel)
    return {
        "k_rel_mse": kerr / knorm,
        "v_rel_mse": verr / vnorm,
        "logit_rmse": np.sqrt(logit2 / pairs),
        "logit_err_max": logit_max,
        "attn_kl_mean": float(kl.mean()),
        "attn_kl_p99": float(np.quantile(kl, 0.99)),
        "attn_kl_max": float(kl.max()),
        "topk_overlap": float(overlap.mean()),
        "attn_out_rel_err": float(out_rel.mean()),
        "attn_out_rel_err_p99": float(np.quantile(out_rel, 0.99)),
        "attn_out_rel_fro": float(np.sqrt(np.concatenate(err2s).sum() / np.concatenate(norm2s).sum())),
    }


def blas_name():
    """Which BLAS library this NumPy process has loaded (after one matrix product)."""
    np.ones((64, 64)) @ np.ones((64, 64))
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "blas" in line or "lapack" in line:
                libs.add(line.split()[-1])
    return sorted(libs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("recording")
    ap.add_argument("--formats", required=True)
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    tensors = load_safetensors(a.recording)
    n_layers = len([k for k in tensors if re.fullmatch(r"layers\.\d+\.key", k)])
    layers = []
    for i in range(n_layers):
        q, k, v = (tensors[f"layers.{i}.{n}"] for n in ("query", "key", "value"))
        if a.tokens:
            q, k, v = q[:, : a.tokens], k[:, : a.tokens], v[:, : a.tokens]
        layers.append((q, k, v))
    t0 = time.perf_counter()
    exact = exact_pass(layers, a.topk)
    exact_seconds = time.perf_counter() - t0
    kv = [(k, v) for _, k, v in layers]
    result = {"blas": blas_name(), "exact_seconds": exact_seconds, "points": {}}
    for fmt in a.formats.split(","):
        best = best_cpu = float("inf")
        for _ in range(a.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            m = point_metrics(kv, exact, fmt, a.topk)
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        result["points"][fmt] = {"seconds": best, "cpu_seconds": best_cpu, "metrics": m}
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
