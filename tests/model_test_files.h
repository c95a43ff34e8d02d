// Tiny random Hugging Face checkpoints (config.json + model.safetensors) for the model
// tests, and a plain double-precision reference forward pass written from the
// architectures' definitions, loop by loop, independent of sim/model.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sim/io/tensor_store.h"
#include "sim/io/tensor_writer.h"
#include "sim/model/transformer.h"
#include "test_util.h"

namespace kvb::test {

// A fixture's reference input ids (they start with BOS): the first n, or all when n is 0.
inline std::vector<int64_t> reference_ids(const std::string& name, size_t n = 0) {
  std::vector<int64_t> ids =
      TensorStore::open(data_dir() / "reference" / (name + "-reference.safetensors"))->read_i64("input_ids");
  if (n == 0) return ids;
  REQUIRE(ids.size() >= n);
  ids.resize(n);
  return ids;
}

struct TinyCheckpoint {
  nlohmann::json config;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, std::vector<float>> values;
  uint64_t next_seed = 1;

  void add(const std::string& name, std::vector<int64_t> shape, float scale, float offset = 0.0f) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v = random_normal(static_cast<size_t>(n), next_seed++, scale);
    for (float& x : v) x += offset;
    shapes[name] = std::move(shape);
    values[name] = std::move(v);
  }
  const std::vector<float>& at(const std::string& name) const { return values.at(name); }
  bool has(const std::string& name) const { return values.count(name) != 0; }

  // Writes config.json and model.safetensors (F32, or `dtype`) into dir.
  std::filesystem::path write(const std::filesystem::path& dir, DType dtype = DType::F32) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    std::vector<TensorToWrite> t;
    for (const auto& [name, v] : values) t.push_back(TensorToWrite::of_floats(name, shapes.at(name), v.data(), dtype));
    write_safetensors(dir / "model.safetensors", t);
    return dir;
  }
};

struct TinyLlamaOptions {
  std::string architecture = "LlamaForCausalLM";
  int64_t layers = 2, hidden = 32, q_heads = 4, kv_heads = 2, head_dim = 8, intermediate = 48, vocab = 23;
  bool qkv_bias = false, tied = false;
};

// A Llama-family checkpoint; the caller adds RoPE / window keys to .config.
// RoPE's default inverse frequencies theta^(-2i/d), i < d/2, in double: what a reference
// rotates with.
inline std::vector<double> llama_inv_freq(double theta, int64_t d) {
  std::vector<double> f;
  for (int64_t i = 0; i < d / 2; ++i) f.push_back(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d)));
  return f;
}

// n seeded token ids in [0, vocab).
inline std::vector<int64_t> some_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
  return t;
}

inline TinyCheckpoint tiny_llama(const TinyLlamaOptions& o) {
  TinyCheckpoint c;
  c.config = {{"architectures", {o.architecture}},
              {"hidden_size", o.hidden},
              {"num_hidden_layers", o.layers},
              {"num_attention_heads", o.q_heads},
              {"num_key_value_heads", o.kv_heads},
              {"head_dim", o.head_dim},
              {"intermediate_size", o.intermediate},
              {"vocab_size", o.vocab},
              {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", o.tied},
              {"bos_token_id", 0}};
  const int64_t H = o.hidden, qw = o.q_heads * o.head_dim, kvw = o.kv_heads * o.head_dim, I = o.intermediate;
  c.add("model.embed_tokens.weight", {o.vocab, H}, 1.0f);
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    c.add(b + "input_layernorm.weight", {H}, 0.1f, 1.0f);
    c.add(b + "post_attention_layernorm.weight", {H}, 0.1f, 1.0f);
    c.add(b + "self_attn.q_proj.weight", {qw, H}, 0.3f);
    c.add(b + "self_attn.k_proj.weight", {kvw, H}, 0.3f);
    c.add(b + "self_attn.v_proj.weight", {kvw, H}, 0.3f);
    c.add(b + "self_attn.o_proj.weight", {H, qw}, 0.2f);
    if (o.qkv_bias) {
      c.add(b + "self_attn.q_proj.bias", {qw}, 0.1f);
      c.add(b + "self_attn.k_proj.bias", {kvw}, 0.1f);
      c.add(b + "self_attn.v_proj.bias", {kvw}, 0.1f);
    }
    c.add(b + "mlp.gate_proj.weight", {I, H}, 0.2f);
    c.add(b + "mlp.up_proj.weight", {I, H}, 0.2f);
    c.add(b + "mlp.down_proj.weight", {H, I}, 0.2f);
  }
  c.add("model.norm.weight", {H}, 0.1f, 1.0f);
  if (!o.tied) c.add("lm_head.weight", {o.vocab, H}, 0.3f);
  return c;
}

// Reference Llama-family forward in double: logits [T][vocab]. `inv_freq` has
// head_dim/2 entries; window[l] = 0 means full attention.
inline std::vector<std::vector<double>> reference_llama(const TinyCheckpoint& c, const TinyLlamaOptions& o,
                                                        const std::vector<double>& inv_freq,
                                                        const std::vector<int64_t>& window,
                                                        const std::vector<int64_t>& tokens) {
  const int64_t H = o.hidden, d = o.head_dim, T = static_cast<int64_t>(tokens.size());
  const int64_t group = o.q_heads / o.kv_heads;
  auto matvec = [&](const std::string& w, const std::vector<double>& x, int64_t out) {
    const std::vector<float>& W = c.at(w);
    const int64_t in = static_cast<int64_t>(x.size());
    std::vector<double> y(static_cast<size_t>(out), 0.0);
    for (int64_t r = 0; r < out; ++r)
      for (int64_t i = 0; i < in; ++i) y[r] += W[r * in + i] * x[i];
    const std::string bias = w.substr(0, w.size() - 6) + "bias";
    if (c.has(bias))
      for (int64_t r = 0; r < out; ++r) y[r] += c.at(bias)[r];
    return y;
  };
  auto rms = [&](const std::vector<double>& x, const std::string& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + 1e-5);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = c.at(w)[i] * x[i] * inv;
    return y;
  };
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < d / 2; ++i) {
        const double a = v[h * d + i], b = v[h * d + i + d / 2], ang = static_cast<double>(pos) * inv_freq[i];
        v[h * d + i] = a * std::cos(ang) - b * std::sin(ang);
        v[h * d + i + d / 2] = b * std::cos(ang) + a * std::sin(ang);
      }
  };
  std::vector<std::vector<double>> x(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(H)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[t][i] = c.at("model.embed_tokens.weight")[tokens[t] * H + i];
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> h = rms(x[t], b + "input_layernorm.weight");
      q[t] = matvec(b + "self_attn.q_proj.weight", h, o.q_heads * d);
      k[t] = matvec(b + "self_attn.k_proj.weight", h, o.kv_heads * d);
      v[t] = matvec(b + "self_attn.v_proj.weight", h, o.kv_heads * d);
      rope(q[t], o.q_heads, t);
      rope(k[t], o.kv_heads, t);
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> attn(static_cast<size_t>(o.q_heads * d), 0.0);
      for (int64_t h = 0; h < o.q_heads; ++h) {
        const int64_t g = h / group;
        const int64_t lo = window[l] > 0 ? std::max<int64_t>(0, t - window[l] + 1) : 0;
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t j = lo; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[t][h * d + i] * k[j][g * d + i];
          s.push_back(dot / std::sqrt(static_cast<double>(d)));
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = lo; j <= t; ++j)
          for (int64_t i = 0; i < d; ++i) attn[h * d + i] += s[j - lo] / z * v[j][g * d + i];
      }
      const std::vector<double> o_proj = matvec(b + "self_attn.o_proj.weight", attn, H);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o_proj[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<double> h = rms(x[t], b + "post_attention_layernorm.weight");
      const std::vector<double> gate = matvec(b + "mlp.gate_proj.weight", h, o.intermediate);
      const std::vector<double> up = matvec(b + "mlp.up_proj.weight", h, o.intermediate);
      std::vector<double> m(static_cast<size_t>(o.intermediate));
      for (int64_t i = 0; i < o.intermediate; ++i) m[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const std::vector<double> down = matvec(b + "mlp.down_proj.weight", m, H);
      for (int64_t i = 0; i < H; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<double>> logits;
  const std::string head = o.tied ? "model.embed_tokens.weight" : "lm_head.weight";
  for (int64_t t = 0; t < T; ++t) logits.push_back(matvec(head, rms(x[t], "model.norm.weight"), o.vocab));
  return logits;
}

// max over positions of max_v |a - b| / max_v |b|.
inline double worst_relative_row_error(const std::vector<std::vector<double>>& ref, const float* got, int64_t cols) {
  double worst = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    double diff = 0, scale = 0;
    for (int64_t v = 0; v < cols; ++v) {
      diff = std::max(diff, std::fabs(got[t * cols + v] - ref[t][v]));
      scale = std::max(scale, std::fabs(ref[t][v]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// A bundled fixture checkpoint (data/models/<name>), loaded once per test program.
inline std::shared_ptr<const Transformer> fixture_model(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Transformer>> cache;
  auto& m = cache[name];
  if (!m) m = Transformer::load(data_dir() / "models" / name);
  return m;
}

}  // namespace kvb::test
