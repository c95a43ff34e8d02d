#!/usr/bin/env python3
"""Checks kvbudget.TorchRecorder on Hugging Face transformers models against
`kvbudget record`: builds small random-weight checkpoints (Llama with GQA, Llama with
llama3 RoPE scaling, Qwen2 with q/k/v biases, GPT-2) with transformers, records each on
the same text with `kvbudget record` (the C++ forward pass) and with the recorder
(transformers' forward pass, on the GPU where there is one), and compares the two
files: the same tensor names, shapes, dtypes, token ids and RoPE metadata, every value
within one F16 rounding step (after --float32-tolerance for the two float32 passes'
summation orders), and the mean NLL. Needs torch and transformers (not
Debian packages; the GPU machine has them) and a built kvbudget with its Python
package on PYTHONPATH:

    PYTHONPATH=build/python python3 scripts/check_torch_recorder.py [--kvbudget build/kvbudget]
        [--tokens 256] [--device cuda] [--keep DIR]

Prints one line per model and exits 1 when any comparison fails."""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parents[1]
sys.path.append(str(SOURCE / "build" / "python"))  # last: PYTHONPATH or the setup's .pth file wins

import kvbudget  # noqa: E402


def byte_model_config(transformers, kind):
    """A small config of `kind` over the byte vocabulary (256 bytes + BOS 256), as the
    bundled *-bytes checkpoints; None when this transformers cannot build it."""
    common = dict(vocab_size=257, bos_token_id=256, eos_token_id=256, max_position_embeddings=2048)
    llama_like = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False, **common)
    if kind == "llama":
        return transformers.LlamaConfig(rope_theta=10000.0, **llama_like)
    if kind == "llama3-scaled":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}
        try:
            return transformers.LlamaConfig(rope_theta=500000.0, rope_scaling=scaling, **llama_like)
        except (TypeError, ValueError) as e:
            print(f"  llama3-scaled: this transformers rejects rope_scaling ({e}); skipped")
            return None
    if kind == "qwen2":
        return transformers.Qwen2Config(rope_theta=1000000.0, use_sliding_window=False, **llama_like)
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=257, bos_token_id=256, eos_token_id=256, n_positions=1024,
                                       n_embd=256, n_layer=4, n_head=8)
    raise ValueError(kind)


def header(path):
    data = Path(path).read_bytes()
    size = int.from_bytes(data[:8], "little")
    h = json.loads(data[8:8 + size])
    return {n: (i["dtype"], i["shape"]) for n, i in h.items() if n != "__metadata__"}


def compare(cli_path, torch_path, torch_nll, float32_tolerance):
    """Problems (a list of text) between the CLI's and the recorder's files."""
    problems = []
    cli, mine = kvbudget.load_recording(cli_path), kvbudget.load_recording(torch_path)
    if header(cli_path) != header(torch_path):
        problems.append(f"tensor names/shapes/dtypes differ: {header(cli_path)} vs {header(torch_path)}")
        return problems, {}
    if cli.token_ids != mine.token_ids:
        problems.append("token ids differ")
    for key in ("rope", "rope_theta", "layout", "tokens", "bos"):
        if cli.metadata.get(key) != mine.metadata.get(key):
            problems.append(f"metadata {key}: {cli.metadata.get(key)!r} vs {mine.metadata.get(key)!r}")
    if ("rope_inv_freq" in cli.metadata) != ("rope_inv_freq" in mine.metadata):
        problems.append(f"metadata rope_inv_freq only in {'the CLI' if 'rope_inv_freq' in cli.metadata else 'mine'}")
    elif "rope_inv_freq" in cli.metadata:
        a = np.array(cli.metadata["rope_inv_freq"].split(","), dtype=np.float64)
        b = np.array(mine.metadata["rope_inv_freq"].split(","), dtype=np.float64)
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-6, atol=0):
            problems.append(f"rope_inv_freq differ by {np.max(np.abs(a / b - 1)) if a.shape == b.shape else a.shape}")
    worst_steps, worst_relative, equal, total = 0.0, 0.0, 0, 0
    for i in range(cli.num_layers):
        for part in ("query", "key", "key_pre_rope", "value", "attn_output"):
            a, b = cli.layer(i)[part], mine.layer(i)[part]
            if (a is None) != (b is None):
                problems.append(f"layer {i} {part} only in {'the CLI' if b is None else 'mine'}")
                continue
            if a is None:
                continue
            # One F16 step of the element, after the float32 passes' own difference
            # (another summation order: a small fraction of the tensor's largest value).
            step = np.spacing(np.maximum(np.abs(a), np.abs(b)).astype(np.float16)).astype(np.float32)
            noise = float32_tolerance * float(np.abs(a).max())
            steps = float(np.max(np.maximum(np.abs(a - b) - noise, 0) / step))
            worst_steps = max(worst_steps, steps)
            worst_relative = max(worst_relative, float(np.abs(a - b).max()) / max(float(np.abs(a).max()), 1e-30))
            equal += int(np.sum(a == b))
            total += a.size
            if steps > 1.0:
                problems.append(f"layer {i} {part}: {steps:.1f} F16 steps apart beyond {float32_tolerance:g} of "
                                f"max |value| (max |diff| {float(np.max(np.abs(a - b))):.3g})")
    cli_nll = float(cli.metadata["nll_mean"])
    if abs(torch_nll - cli_nll) > 1e-4 * abs(cli_nll):
        problems.append(f"mean NLL {torch_nll:.6f} (transformers) vs {cli_nll:.6f} (kvbudget record)")
    return problems, {"max_f16_steps": worst_steps, "max_relative": worst_relative,
                      "equal_fraction": equal / max(total, 1), "nll": cli_nll}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvbudget", default=str(SOURCE / "build" / "kvbudget"), help="the kvbudget binary")
    ap.add_argument("--text", default=str(SOURCE / "data" / "text" / "eval_kjv_revelation.txt"))
    ap.add_argument("--tokens", type=int, default=256, help="tokens recorded (--max-tokens)")
    ap.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    ap.add_argument("--models", default="llama,llama3-scaled,qwen2,gpt2", help="comma-separated")
    ap.add_argument("--keep", default=None, help="a directory to keep the checkpoints and recordings in")
    ap.add_argument("--float32-tolerance", type=float, default=1e-4,
                    help="allowed difference of the two float32 passes, relative to a tensor's max |value|, "
                         "before F16 rounding (default 1e-4)")
    args = ap.parse_args()

    import torch
    import transformers

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 matmuls as float32: the C++ pass is float32
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvb-torch-recorder-"))
    work.mkdir(parents=True, exist_ok=True)
    failures = 0
    for kind in args.models.split(","):
        config = byte_model_config(transformers, kind)
        if config is None:
            continue
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).float()
        with torch.no_grad():  # wider than the default init (std 0.02), so attention is far from uniform
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.mul_(5.0)
                elif name.endswith("bias"):
                    p.normal_(0.0, 0.5)
        checkpoint = work / kind
        model.save_pretrained(checkpoint, safe_serialization=True)
        cli_path, torch_path = work / f"{kind}-cli.safetensors", work / f"{kind}-torch.safetensors"
        run = subprocess.run([args.kvbudget, "record", str(checkpoint), "--text", args.text, "--max-tokens",
                              str(args.tokens), "--out", str(cli_path)], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{kind}: FAIL: kvbudget record: {run.stderr.strip()}")
            failures += 1
            continue
        ids = torch.tensor(kvbudget.load_recording(cli_path).token_ids)
        model = model.to(device).eval()
        try:
            rec = kvbudget.record_torch(model, ids, torch_path)
        except (kvbudget.Error, kvbudget.ConfigError) as e:
            print(f"{kind}: FAIL: TorchRecorder: {e}")
            failures += 1
            continue
        problems, stats = compare(cli_path, torch_path, float(rec.metadata["nll_mean"]), args.float32_tolerance)
        status = "ok" if not problems else "FAIL"
        failures += bool(problems)
        print(f"{kind}: {status}: {rec.num_layers} layers, {rec.q_heads}|{rec.kv_heads} heads x {rec.head_dim}, "
              f"{rec.tokens} tokens; {rec.metadata['recorder']}; " +
              (f"max |diff| {stats['max_relative']:.2g} of max |value|, {100 * stats['equal_fraction']:.2f}% equal, "
               f"NLL {stats['nll']:.4f}" if stats else ""))
        for p in problems:
            print(f"  {p}")
    print(f"{'all models agree' if not failures else f'{failures} model(s) disagree'} (files in {work})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
