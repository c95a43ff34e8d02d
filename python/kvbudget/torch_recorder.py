"""A PyTorch recorder: what every attention layer of a model consumed and produced,
captured with forward hooks during an ordinary forward pass, as a kvbudget Recording
(the layout `kvbudget record` writes and `kvbudget run` reads).

    with kvbudget.TorchRecorder(model) as rec:
        model(input_ids)                       # batch size 1
    rec.save("run.safetensors")                # F16, as `kvbudget record`
    recording = rec.recording()                # kvbudget.Recording in memory

    recording = kvbudget.record_torch(model, input_ids, "run.safetensors")

What is captured, per attention module (in module order = layer order):
  value          the v projection's output                      [kv_heads, T, head_dim]
  query, key     post-RoPE: the outputs of the model's rotary function (RoPE models),
                 else the q/k projections' outputs              [heads, T, head_dim]
  key_pre_rope   the rotary function's key input (RoPE models)  [kv_heads, T, head_dim]
  attn_output    the input of the output projection             [T, heads * head_dim]
  input_ids      the input of model.get_input_embeddings()      [T]

Attention modules are those with q_proj/k_proj/v_proj children (Llama, Qwen2, Qwen3,
Mistral, ...), a fused c_attn (GPT-2: q | k | v of equal widths) or qkv_proj (q | k | v
with GQA widths); the output projection is o_proj, c_proj, out_proj or dense.

Post-RoPE q/k: Hugging Face models apply RoPE with a module-level function
`apply_rotary_pos_emb(q, k, cos, sin, ...) -> (q, k)` of their modeling file, called
from the attention module's forward. While recording, that global of each attention
module's Python module is wrapped; the wrapper keeps its inputs (pre-RoPE, after any
q/k norm) and outputs (post-RoPE, what attention reads) for the attention module that
is running. The RoPE metadata (theta, and the inverse frequencies when they are not
theta's: scaled RoPE) comes from the model's `inv_freq` buffer and config, and is
checked: RoPE with those frequencies applied to key_pre_rope must give the recorded key
(rotate-half pairing, positions 0..T-1, no attention scaling), else recording() raises
kvbudget.Error (keep_pre_rope=False records post-RoPE q/k without key_pre_rope).
A model that applies RoPE inline (no such function) can be recorded with
rope="recompute": post-RoPE q/k are computed from the projections with those
frequencies (exact only where the model does the same thing).

Forward calls inside one recording are consecutive pieces of one sequence (a prefill
and decoding steps with the KV cache); rec.reset() starts a new sequence. Calls that
restart the sequence (no KV cache) are refused by recording(): the attention output of
layer 0's later calls is checked against causal attention over the whole recording.
"""

import sys
import os

import numpy as np

from . import _core
from ._core import ConfigError, Error

_QKV_NAMES = ("q_proj", "k_proj", "v_proj")
_FUSED_NAMES = ("c_attn", "qkv_proj")
_OUT_NAMES = ("o_proj", "c_proj", "out_proj", "dense")


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the interpreter
        raise ImportError("kvbudget.TorchRecorder needs PyTorch (Debian: apt-get install python3-torch)") from e
    return torch


def find_attention_modules(model):
    """[(name, module)] of the attention modules of `model` in registration order (the
    layer order of Hugging Face models): modules with q_proj, k_proj and v_proj
    children, or a fused c_attn / qkv_proj child."""
    found = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        if all(n in children for n in _QKV_NAMES) or any(n in children for n in _FUSED_NAMES):
            found.append((name, module))
    return found


def _config_of(model):
    config = getattr(model, "config", None)
    return getattr(config, "text_config", None) or config  # multimodal configs nest the language model's


def _config_value(config, *names):
    for n in names:
        v = getattr(config, n, None) if config is not None else None
        if v is not None:
            return v
    return None


def _rope_theta_of(config):
    """rope_theta of a Hugging Face config (transformers 4: config.rope_theta;
    5: config.rope_parameters["rope_theta"]), or None."""
    theta = _config_value(config, "rope_theta")
    if theta is None:
        params = _config_value(config, "rope_parameters")
        if isinstance(params, dict):
            theta = params.get("rope_theta")
    return None if theta is None else float(theta)


def rope_rotate(x, inv_freq, first_position=0):
    """RoPE in the rotate-half convention (channel i paired with i + d/2, angle
    position * inv_freq[i]), as Hugging Face and kvbudget apply it: x [heads, T, d]
    (NumPy, float32), positions first_position.. ; returns float32 [heads, T, d]."""
    x = np.asarray(x, dtype=np.float32)
    half = x.shape[-1] // 2
    positions = np.arange(first_position, first_position + x.shape[-2], dtype=np.float64)
    angles = positions[:, None] * np.asarray(inv_freq, dtype=np.float64)[None, :]  # [T, d/2]
    cos = np.cos(angles).astype(np.float32)
    sin = np.sin(angles).astype(np.float32)
    cos = np.concatenate([cos, cos], axis=-1)
    sin = np.concatenate([sin, sin], axis=-1)
    rotated_half = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated_half * sin


class _LayerCapture:
    """One attention module's captured pieces, each a list of chunks (one per forward
    call), float32 CPU arrays: q/k/v projections and rotary in/out as [heads, n, d],
    attn_output as [n, heads * d]."""

    def __init__(self, name, module, head_dim):
        self.name = name
        self.module = module
        self.head_dim = head_dim
        self.parts = {p: [] for p in ("q", "k", "v", "q_rope_in", "k_rope_in", "q_rope", "k_rope", "attn_output")}
        self.calls = 0
        self.tokens_this_call = None

    def reset(self):
        for chunks in self.parts.values():
            chunks.clear()
        self.calls = 0
        self.tokens_this_call = None


class TorchRecorder:
    """Records query, key, value (post-RoPE; pre-RoPE keys where the model has a rotary
    function), attention outputs and input ids of every attention layer of a PyTorch
    causal LM during forward passes; see the module's documentation.

    model: the model (a Hugging Face causal LM, or any nn.Module with attention modules
    named as theirs). attention_modules: the modules to record, in layer order (default
    find_attention_modules(model)). head_dim: per head (default each module's head_dim,
    else the config's head_dim or hidden_size / num_attention_heads).
    rope: "auto" (the rotary function's in/outputs where a module's Python module has
    one; a model with an inv_freq buffer but no such function is refused), "recompute"
    (post-RoPE from the projections with the frequencies below) or "none" (q/k as
    projected). rotary_function: the name of that function. rope_theta / rope_inv_freq:
    the RoPE frequencies (default the model's inv_freq buffer, config.rope_theta).
    keep_pre_rope: record key_pre_rope (checked against the keys).
    input_embeddings: the module whose input is the token ids (default
    model.get_input_embeddings() where there is one)."""

    def __init__(self, model, attention_modules=None, head_dim=None, rope="auto",
                 rotary_function="apply_rotary_pos_emb", rope_theta=None, rope_inv_freq=None, keep_pre_rope=True,
                 input_embeddings=None):
        torch = _torch()
        if rope not in ("auto", "recompute", "none"):
            raise ConfigError(f"TorchRecorder: rope = {rope!r}; expected 'auto', 'recompute' or 'none'")
        self.model = model
        self.rope = rope
        self.rotary_function = rotary_function
        self.keep_pre_rope = keep_pre_rope
        self._config = _config_of(model)
        if attention_modules is None:
            named = find_attention_modules(model)
        else:
            names = {id(m): n for n, m in model.named_modules()}
            named = [(names.get(id(m), f"attention[{i}]"), m) for i, m in enumerate(attention_modules)]
        if not named:
            raise ConfigError(f"TorchRecorder: {type(model).__name__} has no attention module with q_proj/k_proj/"
                              "v_proj, c_attn or qkv_proj children; pass attention_modules=[...]")
        self._layers = [_LayerCapture(n, m, self._head_dim_of(m, head_dim)) for n, m in named]
        self._rope_theta = rope_theta
        self._rope_inv_freq = rope_inv_freq
        if input_embeddings is None and hasattr(model, "get_input_embeddings"):
            try:
                input_embeddings = model.get_input_embeddings()
            except NotImplementedError:
                input_embeddings = None
        self._input_embeddings = input_embeddings if isinstance(input_embeddings, torch.nn.Module) else None
        self._input_ids = []
        self._handles = []
        self._patched = []  # (python module, attribute, original function) while recording
        self._rotary_names = []  # "module.function" of the wrapped rotary functions, kept after stop()
        self._active = None  # the _LayerCapture whose forward is running
        self._recording = False

    # -- set-up ------------------------------------------------------------------

    def _head_dim_of(self, module, given):
        if given:
            return int(given)
        d = getattr(module, "head_dim", None)
        if d:
            return int(d)
        config = getattr(module, "config", None) or self._config
        d = _config_value(config, "head_dim")
        if d:
            return int(d)
        hidden = _config_value(config, "hidden_size", "n_embd")
        heads = _config_value(config, "num_attention_heads", "n_head")
        if hidden and heads:
            return int(hidden) // int(heads)
        raise ConfigError(f"TorchRecorder: cannot tell the head_dim of {type(module).__name__} (no head_dim "
                          "attribute, no config.head_dim or hidden_size / num_attention_heads); pass head_dim=")

    def _heads_of(self, module, kv):
        """Query (kv=False) or key/value heads of a fused-projection module."""
        config = getattr(module, "config", None) or self._config
        heads = (getattr(module, "num_heads", None) or getattr(module, "num_attention_heads", None) or
                 _config_value(config, "num_attention_heads", "n_head"))
        if kv:
            kv_heads = (getattr(module, "num_key_value_heads", None) or
                        _config_value(config, "num_key_value_heads"))
            heads = kv_heads or heads
        if not heads:
            raise ConfigError(f"TorchRecorder: cannot tell the number of heads of {type(module).__name__}")
        return int(heads)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        """Installs the hooks (and the rotary-function wrappers); __enter__ calls it."""
        if self._recording:
            return
        try:
            for layer in self._layers:
                self._hook_layer(layer)
            if self._input_embeddings is not None:
                self._handles.append(self._input_embeddings.register_forward_pre_hook(self._on_embedding))
            if self.rope == "auto":
                self._wrap_rotary_functions()
        except BaseException:
            self.stop()
            raise
        self._recording = True

    def stop(self):
        """Removes every hook and wrapper; the captured tensors stay."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for python_module, attribute, original in reversed(self._patched):
            setattr(python_module, attribute, original)
        self._patched.clear()
        self._active = None
        self._recording = False

    def reset(self):
        """Forgets what was captured (a new sequence)."""
        for layer in self._layers:
            layer.reset()
        self._input_ids.clear()

    def _hook_layer(self, layer):
        module = layer.module
        children = dict(module.named_children())

        def enter(_module, _inputs):
            self._active = layer
            layer.tokens_this_call = None

        def leave(_module, _inputs, _output):
            self._active = None
            layer.calls += 1

        self._handles.append(module.register_forward_pre_hook(enter))
        self._handles.append(module.register_forward_hook(leave))
        if all(n in children for n in _QKV_NAMES):
            for part, child in zip("qkv", _QKV_NAMES):
                self._handles.append(children[child].register_forward_hook(self._on_projection(layer, part)))
        else:
            fused = next(children[n] for n in _FUSED_NAMES if n in children)
            self._handles.append(fused.register_forward_hook(self._on_fused_projection(layer)))
        out = next((children[n] for n in _OUT_NAMES if n in children), None)
        if out is not None:
            self._handles.append(out.register_forward_pre_hook(self._on_output_projection(layer)))

    def _wrap_rotary_functions(self):
        wrapped = set()
        for layer in self._layers:
            python_module = sys.modules.get(type(layer.module).__module__)
            original = getattr(python_module, self.rotary_function, None) if python_module else None
            if original is None or not callable(original):
                continue
            if id(python_module) in wrapped:
                continue
            wrapped.add(id(python_module))
            setattr(python_module, self.rotary_function, self._rotary_wrapper(original))
            self._patched.append((python_module, self.rotary_function, original))
            name = f"{python_module.__name__}.{self.rotary_function}"
            if name not in self._rotary_names:
                self._rotary_names.append(name)
        if not self._patched and self._model_inv_freq() is not None:
            raise ConfigError(f"TorchRecorder: {type(self.model).__name__} has RoPE (an inv_freq buffer) but the "
                              f"modules of its attention ({type(self._layers[0].module).__module__}) have no function "
                              f"'{self.rotary_function}' to capture post-RoPE query/key from; name it with "
                              "rotary_function=, or pass rope='recompute' (RoPE recomputed from the projections) "
                              "or rope='none'")

    # -- hooks -------------------------------------------------------------------

    @staticmethod
    def _one_sequence(t, what):
        if t.dim() < 2 or t.shape[0] != 1:
            raise Error(f"TorchRecorder: {what} has shape {tuple(t.shape)}; the recorder records one sequence "
                        "(batch size 1)")
        return t[0]

    @staticmethod
    def _to_numpy(t):
        return t.detach().float().cpu().numpy()

    def _store_heads(self, layer, part, flat):
        """flat [n, heads * d] (one sequence) -> [heads, n, d] chunk of `part`."""
        n, width = flat.shape
        d = layer.head_dim
        if width % d:
            raise Error(f"TorchRecorder: {layer.name}: {part} projection width {width} is not a multiple of "
                        f"head_dim {d}")
        layer.tokens_this_call = n
        layer.parts[part].append(self._to_numpy(flat.reshape(n, width // d, d).transpose(0, 1)))

    def _on_projection(self, layer, part):
        def hook(_module, _inputs, output):
            self._store_heads(layer, part, self._one_sequence(output, f"{layer.name} {part}_proj output"))
        return hook

    def _on_fused_projection(self, layer):
        def hook(_module, _inputs, output):
            flat = self._one_sequence(output, f"{layer.name} fused q/k/v projection output")
            d = layer.head_dim
            q_width = self._heads_of(layer.module, kv=False) * d
            kv_width = self._heads_of(layer.module, kv=True) * d
            if flat.shape[-1] != q_width + 2 * kv_width:
                raise Error(f"TorchRecorder: {layer.name}: fused projection width {flat.shape[-1]}, expected "
                            f"q | k | v = {q_width} + {kv_width} + {kv_width}")
            q, k, v = flat.split([q_width, kv_width, kv_width], dim=-1)
            for part, t in zip("qkv", (q, k, v)):
                self._store_heads(layer, part, t)
        return hook

    def _on_output_projection(self, layer):
        def hook(_module, inputs):
            x = self._one_sequence(inputs[0], f"{layer.name} output projection input")
            layer.parts["attn_output"].append(self._to_numpy(x.reshape(x.shape[0], -1)))
        return hook

    def _on_embedding(self, _module, inputs):
        ids = inputs[0]
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        self._input_ids.append(ids.detach().cpu().numpy().astype(np.int64).reshape(-1))

    def _heads_first(self, layer, t, what):
        """A rotary function's q or k of one sequence, [heads, n, d] whichever of
        Hugging Face's [batch, heads, n, d] or [batch, n, heads, d] it is."""
        x = self._one_sequence(t, f"{layer.name} {what} at {self.rotary_function}")
        n = layer.tokens_this_call
        if x.dim() != 3 or x.shape[-1] != layer.head_dim or n is None:
            raise Error(f"TorchRecorder: {layer.name}: {self.rotary_function} got {what} of shape {tuple(t.shape)}, "
                        f"expected [1, heads, tokens, {layer.head_dim}]; pass rope='recompute' or rope='none'")
        if x.shape[1] == n:  # [heads, n, d] (a tie heads == n reads as this, Hugging Face's layout)
            return self._to_numpy(x)
        if x.shape[0] == n:
            return self._to_numpy(x.transpose(0, 1))
        raise Error(f"TorchRecorder: {layer.name}: {self.rotary_function} got {what} of shape {tuple(t.shape)}, "
                    f"which has no axis of the {n} tokens of this call")

    def _rotary_wrapper(self, original):
        recorder = self

        def apply_rotary_pos_emb(q, k, *args, **kwargs):
            out = original(q, k, *args, **kwargs)
            layer = recorder._active
            if layer is None or not recorder._recording:
                return out
            if not (isinstance(out, (tuple, list)) and len(out) == 2 and out[0].shape == q.shape
                    and out[1].shape == k.shape):
                raise Error(f"TorchRecorder: {layer.name}: {recorder.rotary_function}(q, k, ...) did not return "
                            "(q, k) of their shapes; pass rope='recompute' or rope='none'")
            layer.parts["q_rope_in"].append(recorder._heads_first(layer, q, "query"))
            layer.parts["k_rope_in"].append(recorder._heads_first(layer, k, "key"))
            layer.parts["q_rope"].append(recorder._heads_first(layer, out[0], "query"))
            layer.parts["k_rope"].append(recorder._heads_first(layer, out[1], "key"))
            return out

        apply_rotary_pos_emb.__wrapped__ = original
        return apply_rotary_pos_emb

    # -- the recording -----------------------------------------------------------

    def _model_inv_freq(self):
        """The first `inv_freq` buffer of the model (Hugging Face's rotary embedding),
        as float32 NumPy, or None."""
        for name, buffer in self.model.named_buffers():
            if name == "inv_freq" or name.endswith(".inv_freq"):
                return self._to_numpy(buffer).reshape(-1)
        for name, module in self.model.named_modules():  # non-persistent buffers some versions keep as attributes
            f = getattr(module, "inv_freq", None)
            if f is not None and hasattr(f, "detach"):
                return self._to_numpy(f).reshape(-1)
        return None

    def _rope_frequencies(self, head_dim):
        """(theta, inv_freq as the recording stores them: empty when they are theta's,
        inv_freq as applied)."""
        inv_freq = self._rope_inv_freq
        if inv_freq is None:
            inv_freq = self._model_inv_freq()
        theta = self._rope_theta if self._rope_theta is not None else _rope_theta_of(self._config)
        if inv_freq is None and theta is None:
            raise ConfigError("TorchRecorder: the RoPE frequencies are unknown (no inv_freq buffer, no "
                              "config rope_theta); pass rope_theta= or rope_inv_freq=")
        if inv_freq is not None:
            inv_freq = np.asarray(inv_freq, dtype=np.float32).reshape(-1)
            if inv_freq.size * 2 != head_dim:
                raise ConfigError(f"TorchRecorder: {inv_freq.size} RoPE inverse frequencies for head_dim {head_dim} "
                                  "(partial rotary embeddings are not supported); pass rope='none' to record "
                                  "q/k without RoPE metadata")
        def from_theta(t):
            return (float(t) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(np.float32)

        if theta is None:  # from the second frequency, theta^(-2/d): 6 digits where they give inv_freq
            theta = float(inv_freq[1]) ** (-head_dim / 2.0) if inv_freq.size > 1 else 10000.0
            rounded = float(f"{theta:.6g}")
            if np.allclose(from_theta(rounded), inv_freq, rtol=1e-6, atol=0):
                theta = rounded
        default = from_theta(theta)
        if inv_freq is None:
            return theta, default, []
        same = np.allclose(inv_freq, default, rtol=1e-6, atol=0)
        return theta, inv_freq, ([] if same else [float(f) for f in inv_freq])

    @staticmethod
    def _cat(chunks, axis):
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=axis)

    def layers(self):
        """The captured tensors as NumPy float32 arrays, one dict per layer: query, key,
        value [heads, T, d], key_pre_rope (or None), attn_output [T, heads * d] (or
        None); plus (rope_applied, theta, inv_freq as stored)."""
        if not any(layer.parts["v"] for layer in self._layers):
            raise Error("TorchRecorder: nothing recorded: run the model inside `with TorchRecorder(model):` "
                        "(or between start() and stop())")
        rotary = any(layer.parts["k_rope"] for layer in self._layers)
        rope_applied = rotary or self.rope == "recompute"
        theta, inv_freq, stored_inv_freq = (self._rope_frequencies(self._layers[0].head_dim) if rope_applied
                                            else (None, None, []))
        out = []
        for i, layer in enumerate(self._layers):
            p = layer.parts
            if not p["v"]:
                raise Error(f"TorchRecorder: layer {i} ({layer.name}) was not run")
            counts = {part: len(p[part]) for part in ("q", "k", "v")}
            if len(set(counts.values())) != 1 or counts["v"] != layer.calls:
                raise Error(f"TorchRecorder: {layer.name}: {layer.calls} forward calls but projection outputs "
                            f"{counts}")
            value = self._cat(p["v"], 1)
            key_pre_rope = None
            if rotary:
                if len(p["k_rope"]) != layer.calls:
                    raise Error(f"TorchRecorder: {layer.name}: {self.rotary_function} ran {len(p['k_rope'])} "
                                f"times in {layer.calls} forward calls of this layer")
                query, key = self._cat(p["q_rope"], 1), self._cat(p["k_rope"], 1)
                key_pre_rope = self._cat(p["k_rope_in"], 1)
            elif rope_applied:  # recompute
                key_pre_rope = self._cat(p["k"], 1)
                query = rope_rotate(self._cat(p["q"], 1), inv_freq)
                key = rope_rotate(key_pre_rope, inv_freq)
            else:
                query, key = self._cat(p["q"], 1), self._cat(p["k"], 1)
            attn_output = self._cat(p["attn_output"], 0) if p["attn_output"] else None
            if attn_output is not None and len(p["attn_output"]) != layer.calls:
                raise Error(f"TorchRecorder: {layer.name}: output projection ran {len(p['attn_output'])} times in "
                            f"{layer.calls} forward calls")
            if i == 0 and attn_output is not None and layer.calls > 1:
                self._check_one_sequence(layer, i, query, key, value, attn_output, [c.shape[1] for c in p["v"]])
            if rotary and self.keep_pre_rope:
                self._check_rope(layer, i, key_pre_rope, key, inv_freq)
            out.append({"query": query, "key": key, "value": value,
                        "key_pre_rope": key_pre_rope if self.keep_pre_rope else None, "attn_output": attn_output})
        return out, (rope_applied, theta, stored_inv_freq)

    # Query rows of later forward calls compared by _check_one_sequence (spread evenly).
    _SEQUENCE_CHECK_ROWS = 64

    @staticmethod
    def _attention_rows(query, key, value, rows, first_key):
        """Causal softmax(q kᵀ/√d) v of query rows `rows` [n], row t reading keys
        first_key[t]..t (GQA: query head h reads kv head h // group); [n, heads * d]."""
        heads, _, d = query.shape
        group = heads // key.shape[0]
        out = np.zeros((len(rows), heads, d))
        for j, (t, first) in enumerate(zip(rows, first_key)):
            for h in range(heads):
                k = key[h // group, first:t + 1].astype(np.float64)
                scores = k @ query[h, t].astype(np.float64) / np.sqrt(d)
                w = np.exp(scores - scores.max())
                out[j, h] = (w / w.sum()) @ value[h // group, first:t + 1].astype(np.float64)
        return out.reshape(len(rows), heads * d)

    def _check_one_sequence(self, layer, index, query, key, value, attn_output, call_tokens):
        """Forward calls after the first must extend the first call's sequence (a KV
        cache): the attention output of their tokens must be causal attention over
        every earlier token of the recording, as a recording describes it. Raises
        kvbudget.Error where it is instead attention within each call alone (a sequence
        restarted without reset()); a model whose attention differs from plain causal
        softmax in both readings is left to the other checks."""
        starts = np.cumsum([0] + list(call_tokens[:-1]))
        later = np.arange(call_tokens[0], sum(call_tokens))
        if later.size == 0:
            return
        rows = later[np.unique(np.linspace(0, later.size - 1, min(later.size, self._SEQUENCE_CHECK_ROWS)).astype(int))]
        call_start = starts[np.searchsorted(starts, rows, side="right") - 1]
        recorded = attn_output[rows].astype(np.float64)
        scale = float(np.linalg.norm(recorded)) or 1.0
        whole = float(np.linalg.norm(self._attention_rows(query, key, value, rows, np.zeros_like(rows)) - recorded))
        within = float(np.linalg.norm(self._attention_rows(query, key, value, rows, call_start) - recorded))
        whole, within = whole / scale, within / scale
        if whole > 0.05 and within < 0.25 * whole:  # the threshold of `kvbudget inspect --check-output`
            raise Error(f"TorchRecorder: layer {index} ({layer.name}): the {len(call_tokens)} forward calls do not "
                        f"continue one sequence: the attention outputs of the calls after the first attend to their "
                        f"own call's tokens only (relative L2 {within:.3g}), not to the earlier calls' ({whole:.3g}); "
                        "forward calls must continue one sequence (a KV cache); call reset() between sequences")

    def _check_rope(self, layer, index, key_pre_rope, key, inv_freq):
        """RoPE with the recording's frequencies applied to key_pre_rope must give key:
        what the prerope:* formats and the RoPE statistics assume."""
        again = rope_rotate(key_pre_rope, inv_freq)
        scale = float(np.linalg.norm(key)) or 1.0
        error = float(np.linalg.norm(again - key)) / scale
        if error > _core.PRE_ROPE_KEY_TOLERANCE:  # the loader's bound: bf16 rounding ~2.5e-3; a wrong pairing ~1
            raise Error(f"TorchRecorder: layer {index} ({layer.name}): RoPE with theta/inv_freq of the model applied "
                        f"to the pre-RoPE keys differs from the post-RoPE keys by {error:.3g} (relative L2): the "
                        "model's RoPE is not the rotate-half RoPE at positions 0..T-1 a recording describes "
                        "(interleaved pairs, partial rotary, attention scaling or position offsets); pass "
                        "keep_pre_rope=False to record post-RoPE query/key only")

    def recording(self, input_ids=None, metadata=None, name=None):
        """The captured sequence as a kvbudget.Recording (rec.layer(i), rec.save(path,
        dtype)). input_ids: the token ids (default those the input embeddings saw);
        metadata: extra {key: text} for the file."""
        layers, (rope_applied, theta, inv_freq) = self.layers()
        tokens = layers[0]["value"].shape[1]
        if input_ids is not None:
            ids = np.asarray(input_ids.detach().cpu() if hasattr(input_ids, "detach") else input_ids).reshape(-1)
        elif self._input_ids:
            ids = np.concatenate(self._input_ids)
        else:
            ids = np.zeros(0, dtype=np.int64)
        if ids.size not in (0, tokens):
            raise Error(f"TorchRecorder: {ids.size} input ids for {tokens} recorded tokens")
        model_name = self._model_name()
        meta = {"model": model_name, "architecture": self._architecture(), "tokens": str(tokens),
                "recorder": self._description(rope_applied)}
        bos = _config_value(self._config, "bos_token_id")
        if isinstance(bos, int):
            meta["bos"] = str(bos)
        meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
        source = f"torch {type(self.model).__name__} on {tokens} tokens"
        return _core.recording_from_layers(layers, [int(i) for i in ids], rope_applied,
                                           float(theta) if theta is not None else 10000.0, inv_freq, meta,
                                           name or model_name, source)

    def save(self, path, dtype="F16", input_ids=None, metadata=None):
        """Writes the recording to `path` (.safetensors) with float tensors in dtype (F16
        as `kvbudget record` writes by default, BF16 or F32); returns the Recording."""
        path = os.fspath(path)
        if not path.endswith(".safetensors"):
            raise ConfigError(f"{path}: a recording is written as .safetensors")
        rec = self.recording(input_ids=input_ids, metadata=metadata)
        rec.save(path, dtype)
        return rec

    def _model_name(self):
        path = _config_value(self._config, "_name_or_path", "name_or_path")
        if path:
            return os.path.basename(os.path.normpath(str(path)))
        return type(self.model).__name__

    def _architecture(self):
        archs = _config_value(self._config, "architectures")
        return str(archs[0]) if archs else type(self.model).__name__

    def _description(self, rope_applied):
        how = "none"
        if rope_applied and self._rotary_names:
            how = "the in/outputs of " + ", ".join(self._rotary_names)
        elif rope_applied and self.rope == "recompute":
            how = "recomputed from the projections"
        return f"kvbudget.TorchRecorder ({len(self._layers)} attention modules; post-RoPE q/k: {how})"


def record_torch(model, input_ids, path=None, dtype="F16", metadata=None, **recorder_options):
    """Runs `model(input_ids)` (one sequence: [T] or [1, T]) under torch.no_grad() with a
    TorchRecorder and returns the Recording; with `path`, also writes it there (as
    `kvbudget record` does: F16 by default). metadata["nll_mean"] is the mean
    next-token NLL (nats) when the model returns logits. recorder_options go to
    TorchRecorder."""
    torch = _torch()
    if path is not None:
        path = os.fspath(path)
        if not path.endswith(".safetensors"):
            raise ConfigError(f"{path}: a recording is written as .safetensors")
    ids = input_ids if hasattr(input_ids, "dim") else torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ConfigError(f"record_torch: input_ids has dtype {ids.dtype}; expected integer token ids")
    ids = ids.long()  # int32 / uint8 ids too: the NLL's gather below takes int64 indices only
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        ids = ids.to(device)
    recorder = TorchRecorder(model, **recorder_options)
    with torch.no_grad(), recorder:
        output = model(ids)
    meta = dict(metadata or {})
    logits = getattr(output, "logits", output[0] if isinstance(output, (tuple, list)) else output)
    if hasattr(logits, "dim") and logits.dim() == 3 and logits.shape[1] == ids.shape[1] and ids.shape[1] > 1:
        logp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
        nll = -logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
        meta.setdefault("nll_mean", repr(float(nll.mean())))
    rec = recorder.recording(input_ids=ids[0], metadata=meta)
    if path is not None:
        rec.save(path, dtype)
    return rec
