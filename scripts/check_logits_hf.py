#!/usr/bin/env python3
"""Checks kvbudget's forward pass against Hugging Face transformers on random-weight
checkpoints built with real architectures' configs (issue 21): sliding-window and hybrid
attention (Qwen2's use_sliding_window + max_window_layers, explicit `layer_types`,
Mistral's window on every layer), GQA Llama, GPT-2, and optionally the exact configs of
Llama-3.2-1B (llama3 RoPE scaling, tied embeddings, vocabulary 128256) and Llama-3.1-8B
(llama3 RoPE scaling, untied embeddings; 16 GB in bf16, built on the GPU when there is one).

For each model: build it with transformers (seeded), `save_pretrained` in bf16, reload
the saved checkpoint in fp32 for the reference (converting in memory would round RoPE's
inv_freq buffer too), run eager attention on TOKENS random token ids (longer than the
sliding windows, so they cut), and compare with `kvbudget eval DIR --tokens ... --ctx 0
--out logits.npy` (exact cache): the largest |Δlogit| relative to max |logit| and the
positions whose argmax differs. Random weights make no language model: logits, not
perplexity. Needs torch and transformers (the GPU machine has them):

    python3 scripts/check_logits_hf.py --kvbudget build/kvbudget [--tokens 160[,4096...]]
        [--models qwen2-max-window-layers,qwen2-layer-types,...] [--device cuda] [--keep DIR]
        [--backend cpu|cuda|auto]

--tokens takes several lengths, each checked on the same checkpoint (the 8B shape's
issue target: 512,4096). --backend is kvbudget eval's: cpu (the default) checks the C++ forward pass, cuda the
CUDA one (kernels/model_forward.h).

Prints one line per model and exits 1 when any model is off by more than --tolerance
(default 1e-4 relative) or cannot be built or run."""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SMALL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, rms_norm_eps=1e-5,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def config(transformers, name):
    """The transformers config of model `name`, or None when this transformers has no such option."""
    if name == "llama-gqa":
        return transformers.LlamaConfig(rope_theta=10000.0, **SMALL)
    if name == "mistral-sliding":  # every layer sees the last 48 tokens
        return transformers.MistralConfig(sliding_window=48, rope_theta=10000.0, **SMALL)
    if name == "qwen2-max-window-layers":  # Qwen2's own switch: layers >= max_window_layers slide
        return transformers.Qwen2Config(use_sliding_window=True, sliding_window=48, max_window_layers=2,
                                        rope_theta=10000.0, **SMALL)
    if name == "qwen2-layer-types":  # a hybrid written out layer by layer
        c = transformers.Qwen2Config(use_sliding_window=True, sliding_window=40, rope_theta=10000.0,
                                     layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                                  "full_attention"], **SMALL)
        return c if getattr(c, "layer_types", None) else None
    if name == "gpt2":
        return transformers.GPT2Config(n_embd=256, n_layer=4, n_head=8, n_positions=1024, vocab_size=512,
                                       bos_token_id=1, eos_token_id=2)
    if name == "llama-3.2-1b":  # Hugging Face's config.json of meta-llama/Llama-3.2-1B
        return transformers.LlamaConfig(
            hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
            eos_token_id=128001, hidden_act="silu",
            rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                              original_max_position_embeddings=8192, rope_type="llama3"))
    if name == "llama-3.1-8b":  # Hugging Face's config.json of meta-llama/Llama-3.1-8B
        return transformers.LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
            rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=128000,
            eos_token_id=128001, hidden_act="silu",
            rope_scaling=dict(factor=8.0, high_freq_factor=4.0, low_freq_factor=1.0,
                              original_max_position_embeddings=8192, rope_type="llama3"))
    raise SystemExit(f"check_logits_hf: unknown model {name}")


BIG = {"llama-3.1-8b"}  # built on the reference's device in bf16 (an fp32 copy on the host: 32 GB)


MODELS = ["qwen2-max-window-layers", "qwen2-layer-types", "mistral-sliding", "llama-gqa", "gpt2"]


def build(torch, transformers, name, out, device):
    c = config(transformers, name)
    if c is None:
        return None
    torch.manual_seed(0)
    if name in BIG:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(c, torch_dtype=torch.bfloat16)
    else:
        model = transformers.AutoModelForCausalLM.from_config(c)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    del model
    return c


def hf_logits(torch, transformers, path, id_lists, device):
    """The reference's logits [len(ids), vocab] for each list of ids, from one load."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                              attn_implementation="eager").to(device).eval()
    out = []
    with torch.no_grad():
        for ids in id_lists:
            out.append(model(torch.tensor([ids], device=device)).logits[0].float().cpu().numpy())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvbudget", default="build/kvbudget")
    ap.add_argument("--tokens", default="160", help="one length or several, comma-separated")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"any of {MODELS + ['llama-3.2-1b', 'llama-3.1-8b']}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--keep", help="keep the checkpoints and logits here")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "auto"],
                    help="kvbudget eval's forward pass (cpu: the C++ one; cuda: the device's)")
    a = ap.parse_args()
    import torch
    import transformers

    device = a.device if a.device != "cuda" or torch.cuda.is_available() else "cpu"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, reference on {device}, "
          f"kvbudget --backend {a.backend}")
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="kvb-hf-logits."))
    failed = 0
    for name in a.models.split(","):
        d = root / name
        try:
            c = build(torch, transformers, name, d, device)
            if c is None:
                print(f"{name}: skipped (this transformers has no such option)")
                continue
            lengths = [int(t) for t in str(a.tokens).split(",")]
            rng = np.random.default_rng(1)
            all_ids = rng.integers(3, c.vocab_size, max(lengths)).tolist()
            id_lists = [all_ids[:n] for n in lengths]
            refs = hf_logits(torch, transformers, d, id_lists, device)
            for n, ids, ref in zip(lengths, id_lists, refs):
                (d / "ids.txt").write_text(" ".join(map(str, ids)) + "\n")
                np.save(d / f"hf_logits_{n}.npy", ref)
                run = subprocess.run([a.kvbudget, "eval", str(d), "--tokens", str(d / "ids.txt"), "--ctx", "0",
                                      "--max-tokens", str(n), "--out", str(d / "kvb_logits.npy"),
                                      "--backend", a.backend],
                                     capture_output=True, text=True)
                if run.returncode != 0:
                    raise RuntimeError(f"kvbudget eval failed ({run.returncode}): {run.stderr.strip()[-400:]}")
                got = np.load(d / "kvb_logits.npy").reshape(ref.shape)
                rel = float(np.abs(got - ref).max() / np.abs(ref).max())
                argmax = int((got.argmax(-1) != ref.argmax(-1)).sum())
                first_bad = int(np.argmax(np.abs(got - ref).max(-1) > a.tolerance * np.abs(ref).max()))
                kinds = getattr(c, "layer_types", None)
                ok = rel <= a.tolerance and argmax == 0
                failed += not ok
                print(f"{name}: {n} tokens, sliding_window {getattr(c, 'sliding_window', None)}, "
                      f"layer_types {kinds}: max |Δlogit| / max |logit| = {rel:.3g}, argmax differs at "
                      f"{argmax} positions{'' if ok else f' (first position off: {first_bad})'} "
                      f"-> {'ok' if ok else 'FAIL'}", flush=True)
        except Exception as e:  # noqa: BLE001 (one line per model; the others still run)
            failed += 1
            print(f"{name}: FAIL: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
