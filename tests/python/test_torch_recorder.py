"""The PyTorch recorder (python/kvbudget/torch_recorder.py): a small Llama written here
in PyTorch with Hugging Face's module names and its module-level
apply_rotary_pos_emb, recorded with kvbudget.TorchRecorder; the recording against
q/k/v/attention computed directly, loaded and run by kvbudget; the bundled llama-bytes
checkpoint recorded by it equal to `kvbudget record` within fp16 rounding. Skipped
where PyTorch is missing (Debian: python3-torch)."""

import json
import math
import os
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

import kvbudget

torch = pytest.importorskip("torch")
nn = torch.nn

SOURCE = Path(__file__).resolve().parents[2]
KVB = os.environ.get("KVB_BINARY", str(SOURCE / "build" / "kvbudget"))
LLAMA = SOURCE / "data" / "models" / "llama-bytes"
TEXT = SOURCE / "data" / "text" / "eval_kjv_revelation.txt"


# ---------------------------------------------------------------------------
# A small Llama in PyTorch: RMSNorm, RoPE (rotate-half), GQA, SwiGLU, with the module
# names of transformers' LlamaForCausalLM (so its checkpoints load by name) and, like
# transformers' modeling_llama.py, RoPE applied by a module-level function.
# ---------------------------------------------------------------------------

def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """q [B, heads, T, d], k [B, kv_heads, T, d]; cos, sin [T, d]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim, theta):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions):
        """cos, sin [T, head_dim] of integer positions [T]."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()


class LlamaAttention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim):
        super().__init__()
        self.head_dim, self.heads, self.kv_heads = head_dim, heads, kv_heads
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, cache=None):
        """x [B, n, hidden]; cos/sin of the n new positions; cache: {"k", "v"} of the
        earlier positions (post-RoPE), extended in place."""
        B, n, _ = x.shape
        q = self.q_proj(x).view(B, n, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, n, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, n, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        return self.o_proj(attention(q, k, v).transpose(1, 2).reshape(B, n, -1))


def attention(q, k, v):
    """Causal softmax attention of the last n queries q [B, H, n, d] over keys/values
    [B, kv_heads, T, d] (GQA: query head h reads kv head h // (H / kv_heads))."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n, T = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    future = torch.ones(n, T, dtype=torch.bool).triu(T - n + 1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


class LlamaMLP(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                                        c["head_dim"])
        self.mlp = LlamaMLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.rotary_emb = RotaryEmbedding(c["head_dim"], c["rope_theta"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = types.SimpleNamespace(**c)  # what the recorder reads of transformers' config
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def forward(self, input_ids, caches=None):
        """Logits [B, n, vocab] of input_ids [B, n], after the len(caches[0]["k"])
        positions already in `caches` (one dict per layer, extended in place)."""
        first = caches[0]["k"].shape[2] if caches and "k" in caches[0] else 0
        cos, sin = self.model.rotary_emb(torch.arange(first, first + input_ids.shape[1]))
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, caches[i] if caches else None)
        return self.lm_head(self.model.norm(x))


def tiny_config(**overrides):
    c = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
         "rope_theta": 500.0}
    c.update(overrides)
    return c


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(**overrides))
    with torch.no_grad():
        for p in model.parameters():  # scale the random weights up so attention is not uniform
            p.mul_(4.0 if p.dim() == 2 else 1.0)
    return model.eval()


# ---------------------------------------------------------------------------
# The small model, recorded and checked against q/k/v computed directly
# ---------------------------------------------------------------------------

def direct_layer(model, layer_index, ids):
    """Layer `layer_index`'s q, k (post-RoPE), k pre-RoPE, v ([heads, T, d]) and the
    attention output [T, heads * d] of one sequence ids [T], computed here."""
    c_model = model.model
    T = ids.shape[0]
    cos, sin = c_model.rotary_emb(torch.arange(T))
    x = c_model.embed_tokens(ids[None])
    for layer in c_model.layers[:layer_index]:
        x = layer(x, cos, sin, None)
    attn = c_model.layers[layer_index].self_attn
    h = c_model.layers[layer_index].input_layernorm(x)
    d = attn.head_dim
    q = attn.q_proj(h).view(1, T, -1, d).transpose(1, 2)
    k = attn.k_proj(h).view(1, T, -1, d).transpose(1, 2)
    v = attn.v_proj(h).view(1, T, -1, d).transpose(1, 2)
    q_rope, k_rope = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    out = attention(q_rope, k_rope, v).transpose(1, 2).reshape(T, -1)
    return {"query": q_rope[0], "key": k_rope[0], "key_pre_rope": k[0], "value": v[0], "attn_output": out}


def test_recorder_captures_what_attention_consumed(tmp_path):
    model = tiny_model()
    ids = torch.randint(0, 50, (24,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), kvbudget.TorchRecorder(model) as recorder:
        logits = model(ids[None])
    assert globals()["apply_rotary_pos_emb"].__name__ == "apply_rotary_pos_emb"
    assert not hasattr(globals()["apply_rotary_pos_emb"], "__wrapped__")  # the wrapper is gone after the block
    rec = recorder.recording()
    assert (rec.num_layers, rec.q_heads, rec.kv_heads, rec.head_dim, rec.tokens) == (2, 4, 2, 16, 24)
    assert rec.token_ids == ids.tolist()
    assert rec.rope_applied and rec.rope_theta == 500.0
    assert f"post-RoPE q/k: the in/outputs of {__name__}.apply_rotary_pos_emb" in rec.metadata["recorder"]
    with torch.no_grad():
        for i in range(2):
            expected = direct_layer(model, i, ids)
            got = rec.layer(i)
            for part, want in expected.items():
                np.testing.assert_allclose(got[part], want.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{i} {part}")
        assert torch.allclose(logits, model(ids[None]))  # recording did not change the forward pass

    # Written and read back as `kvbudget run` reads it.
    rec.save(tmp_path / "tiny.safetensors", "F32")
    loaded = kvbudget.load_recording(tmp_path / "tiny.safetensors")
    assert loaded.rope_applied and loaded.rope_theta == 500.0 and loaded.token_ids == ids.tolist()
    for part in ("query", "key", "value", "key_pre_rope", "attn_output"):
        assert np.array_equal(loaded.layer(1)[part], rec.layer(1)[part]), part
    config = {"name": "tiny", "seed": 0, "data": {"path": str(tmp_path / "tiny.safetensors")},
              "strategy": [{"type": "uniform", "format": "int{bits}-asym-g16", "vars": {"bits": [2, 4]}},
                           {"type": "uniform", "format": "prerope:int4-asym-g16"}],
              "metrics": {"pareto": ["attn_kl_mean", "attn_out_rel_err"]}}
    result = kvbudget.run(config, out=tmp_path / "results", plots=False, quiet=True)
    points = result.points
    assert len(points) == 3
    assert np.isfinite(points["attn_kl_mean"]).all() and (points["attn_kl_mean"] > 0).all()
    int2, int4 = points.sort_values("bpe")["attn_out_rel_err"].iloc[:2]
    assert int2 > int4  # fewer bits, more error: the recording's attention is not degenerate


def test_prefill_and_decoding_steps_are_one_sequence():
    model = tiny_model(seed=2)
    ids = torch.randint(0, 50, (20,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), kvbudget.TorchRecorder(model) as recorder:
        caches = [{} for _ in model.model.layers]
        model(ids[None, :12], caches)
        for t in range(12, 20):  # one token at a time with the KV cache
            model(ids[None, t:t + 1], caches)
    rec = recorder.recording()
    with torch.no_grad():
        whole = kvbudget.record_torch(model, ids)
    assert rec.tokens == 20 and rec.token_ids == ids.tolist()
    for i in range(rec.num_layers):
        for part in ("query", "key", "key_pre_rope", "value", "attn_output"):
            np.testing.assert_allclose(rec.layer(i)[part], whole.layer(i)[part], rtol=1e-5, atol=1e-5)
    recorder.reset()
    with pytest.raises(kvbudget.Error, match="nothing recorded"):
        recorder.recording()


def test_forward_calls_that_restart_the_sequence_are_refused():
    """Two forward calls without a KV cache are two sequences: their attention outputs
    do not describe one recording's q/k/v (kvbudget.run accepted it)."""
    ids = torch.randint(0, 50, (20,), generator=torch.Generator().manual_seed(5))
    for options in ({}, {"rope": "recompute"}):
        model = tiny_model(seed=6)
        with torch.no_grad(), kvbudget.TorchRecorder(model, **options) as recorder:
            model(ids[None, :12])
            model(ids[None, 12:])  # no cache: positions and attention start again
        with pytest.raises(kvbudget.Error, match="layer 0 .* forward calls must continue one sequence \\(a KV "
                                                 "cache\\); call reset\\(\\) between sequences"):
            recorder.recording()
        recorder.reset()  # a new sequence: one call is one sequence
        with torch.no_grad(), recorder:
            model(ids[None, 12:])
        assert recorder.recording().tokens == 8


def test_recompute_rope_matches_the_rotary_function():
    model = tiny_model(seed=4)
    ids = torch.arange(30) % 50
    wrapped = kvbudget.record_torch(model, ids)
    recomputed = kvbudget.record_torch(model, ids, rope="recompute")
    plain = kvbudget.record_torch(model, ids, rope="none")
    assert "recomputed from the projections" in recomputed.metadata["recorder"]
    assert not plain.rope_applied and plain.layer(0)["key_pre_rope"] is None
    for i in range(wrapped.num_layers):
        for part in ("query", "key", "key_pre_rope", "value", "attn_output"):
            np.testing.assert_allclose(recomputed.layer(i)[part], wrapped.layer(i)[part], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(plain.layer(i)["key"], wrapped.layer(i)["key_pre_rope"], rtol=1e-6, atol=1e-6)
    assert float(wrapped.metadata["nll_mean"]) > 0


def test_record_torch_takes_any_integer_ids():
    model = tiny_model(seed=4)
    ids = torch.arange(24) % 50
    expected = kvbudget.record_torch(model, ids)
    for narrow in (ids.int(), ids.to(torch.uint8), ids.numpy().astype(np.int32)):
        rec = kvbudget.record_torch(model, narrow)  # the model takes them; so does the NLL
        assert rec.token_ids == ids.tolist() and rec.metadata["nll_mean"] == expected.metadata["nll_mean"]
        np.testing.assert_array_equal(rec.layer(1)["key"], expected.layer(1)["key"])
    with pytest.raises(kvbudget.ConfigError, match="record_torch: input_ids has dtype torch.float32; expected "
                                                   "integer token ids"):
        kvbudget.record_torch(model, ids.float())


def test_recorder_errors():
    model = tiny_model()
    ids = torch.arange(8)
    with pytest.raises(kvbudget.Error, match="batch size 1"):
        with torch.no_grad(), kvbudget.TorchRecorder(model):
            model(torch.stack([ids, ids]))
    assert not hasattr(globals()["apply_rotary_pos_emb"], "__wrapped__")  # unwrapped after the error too
    with pytest.raises(kvbudget.ConfigError, match="no attention module"):
        kvbudget.TorchRecorder(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(kvbudget.ConfigError, match="has RoPE .* no function 'rope_function'"):
        kvbudget.TorchRecorder(model, rotary_function="rope_function").start()
    with pytest.raises(kvbudget.ConfigError, match="rope = 'yes'"):
        kvbudget.TorchRecorder(model, rope="yes")
    # Frequencies other than the model's: the keys are not RoPE of key_pre_rope.
    with pytest.raises(kvbudget.Error, match="RoPE with theta/inv_freq of the model .* keep_pre_rope=False"):
        kvbudget.record_torch(model, ids, rope_theta=10000.0, rope_inv_freq=np.ones(8, np.float32))
    rec = kvbudget.record_torch(model, ids, keep_pre_rope=False, rope_inv_freq=np.ones(8, np.float32))
    assert rec.layer(0)["key_pre_rope"] is None
    with pytest.raises(kvbudget.ConfigError, match="written as .safetensors"):
        kvbudget.record_torch(model, ids, "out.npz")


# ---------------------------------------------------------------------------
# The bundled llama-bytes checkpoint: the recorder equals `kvbudget record`
# ---------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """{name: float32 or integer array} of a safetensors file (BF16 widened to float32)."""
    data = Path(path).read_bytes()
    header_size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_size])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<")
        raw = np.frombuffer(data, dtype=dtype, count=(end - start) // dtype.itemsize, offset=8 + header_size + start)
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.reshape(info["shape"])
    return tensors


def load_llama_bytes():
    config = json.loads((LLAMA / "config.json").read_text())
    config["rope_theta"] = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    config["_name_or_path"] = str(LLAMA)  # as transformers' from_pretrained sets it
    model = LlamaForCausalLM(config)
    weights = {}
    for shard in sorted(LLAMA.glob("model*.safetensors")):
        weights.update(read_safetensors(shard))
    state = {name: torch.from_numpy(np.array(w, dtype=np.float32)) for name, w in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model.eval()


def test_llama_bytes_recording_equals_kvbudget_record(tmp_path):
    cli_path = tmp_path / "cli.safetensors"
    subprocess.run([KVB, "record", str(LLAMA), "--text", str(TEXT), "--max-tokens", "128", "--out", str(cli_path)],
                   check=True, capture_output=True)
    cli = kvbudget.load_recording(cli_path)
    model = load_llama_bytes()
    ids = torch.tensor(cli.token_ids)
    torch_path = tmp_path / "torch.safetensors"
    rec = kvbudget.record_torch(model, ids, torch_path)  # F16, as `kvbudget record` writes by default
    mine = kvbudget.load_recording(torch_path)
    assert (mine.num_layers, mine.q_heads, mine.kv_heads, mine.head_dim, mine.tokens) == (6, 6, 2, 64, 128)
    assert mine.token_ids == cli.token_ids and mine.rope_applied and mine.rope_theta == cli.rope_theta
    for key in ("model", "architecture", "rope", "layout", "tokens", "bos", "rope_theta"):
        assert mine.metadata.get(key) == cli.metadata.get(key), key
    assert "rope_inv_freq" not in mine.metadata  # default RoPE: theta alone, as the CLI writes it
    assert float(rec.metadata["nll_mean"]) == pytest.approx(float(cli.metadata["nll_mean"]), rel=1e-4)
    # The same tensor names, shapes and dtypes in both files.
    mine_header, cli_header = (
        {n: (i["dtype"], i["shape"]) for n, i in json.loads(p.read_bytes()[8:8 + int.from_bytes(
            p.read_bytes()[:8], "little")]).items() if n != "__metadata__"} for p in (torch_path, cli_path))
    assert mine_header == cli_header
    # Equal within fp16 rounding: both files round float32 values to F16, values that
    # differ by float32 rounding (another summation order: ~1e-6 of the tensor's largest
    # value), so they differ by at most one F16 step plus that.
    for i in range(6):
        for part in ("query", "key", "key_pre_rope", "value", "attn_output"):
            a, b = mine.layer(i)[part], cli.layer(i)[part]
            step = np.spacing(np.maximum(np.abs(a), np.abs(b)).astype(np.float16)).astype(np.float32)
            float32_noise = 1e-5 * float(np.abs(b).max())
            assert (np.abs(a - b) <= step + float32_noise).all(), (i, part, float(np.abs(a - b).max()))
            assert np.mean(a == b) > 0.9, (i, part)
