#!/usr/bin/env python3
"""Writes a random-weight Llama checkpoint (config.json + model.safetensors, BF16) with
the shape of a real model, for the loading benchmark (bench_model_load.sh). NumPy only:
no transformers needed. Weights are N(0, 0.02²) (norm weights 1), truncated to BF16.

    /usr/bin/python3 experiments/bench/make_checkpoint.py OUT_DIR [--shape llama-3.2-1b]
"""
import argparse
import json
import os
import struct

import numpy as np

SHAPES = {  # Hugging Face config.json values of the real models
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    # Llama 3's vocabulary on a toy body: the host's share of a model-level point
    # (logits [T, 128256]) measured on a CPU, where an 8B body would dominate.
    "llama-3-vocab-tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, vocab_size=128256, tie_word_embeddings=False),
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}


def tensors(c):
    """(name, shape) of every weight, in Hugging Face's LlamaForCausalLM naming."""
    H, I, d = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    yield "model.embed_tokens.weight", (c["vocab_size"], H)
    for l in range(c["num_hidden_layers"]):
        b = f"model.layers.{l}."
        yield b + "input_layernorm.weight", (H,)
        yield b + "post_attention_layernorm.weight", (H,)
        yield b + "self_attn.q_proj.weight", (q, H)
        yield b + "self_attn.k_proj.weight", (kv, H)
        yield b + "self_attn.v_proj.weight", (kv, H)
        yield b + "self_attn.o_proj.weight", (H, q)
        yield b + "mlp.gate_proj.weight", (I, H)
        yield b + "mlp.up_proj.weight", (I, H)
        yield b + "mlp.down_proj.weight", (H, I)
    yield "model.norm.weight", (H,)
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (c["vocab_size"], H)


def bf16(rng, shape, norm):
    if norm:
        return np.full(shape, 0x3F80, np.uint16)  # 1.0
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def write_tiled(f, block, n):
    """n BF16 values: `block` repeated (for --fill tiled)."""
    for i in range(0, n, block.size):
        block[: min(block.size, n - i)].tofile(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--fill", default="random", choices=["random", "tiled"],
                    help="tiled: one random block of 2^25 values repeated (an 8B checkpoint in seconds; "
                         "for timing the loader, not for logits)")
    a = ap.parse_args()
    c = dict(SHAPES[a.shape], architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
             rope_theta=500000.0, max_position_embeddings=8192, torch_dtype="bfloat16", bos_token_id=1,
             hidden_act="silu")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    header, offset = {}, 0
    for name, shape in tensors(c):
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(0)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        block = bf16(rng, (1 << 25,), False) if a.fill == "tiled" else None
        for name, shape in tensors(c):
            if block is not None and not name.endswith("norm.weight"):
                write_tiled(f, block, int(np.prod(shape)))
            else:
                bf16(rng, shape, name.endswith("norm.weight")).tofile(f)
    print(f"{a.out}: {a.shape}, {offset / 2**30:.2f} GiB of BF16 weights")


if __name__ == "__main__":
    main()
