// ModelConfig: what the forward pass needs from a Hugging Face checkpoint's
// config.json, for the architectures it implements:
//
//   GPT2LMHeadModel     learned positions, LayerNorm, GELU (tanh), Conv1D weights [in, out],
//                       tied lm_head
//   LlamaForCausalLM    RoPE (default, linear or llama3 scaling), RMSNorm, SwiGLU, GQA,
//                       tied or untied embeddings
//   Qwen2ForCausalLM    Llama with q/k/v biases (and optional sliding-window layers)
//   MistralForCausalLM  Llama with a sliding attention window on every layer
//   MinistralForCausalLM Mistral with per-layer attention types (`layer_types`: a
//                       hybrid of full and sliding-window layers)
//
// Per-layer attention types follow transformers' config classes: `layer_types`
// ("full_attention" / "sliding_attention"), Qwen2's use_sliding_window +
// max_window_layers, Mistral's sliding_window (model_config.cpp,
// parse_attention_types, says which architecture reads which key).
//
// Both generations of Hugging Face's RoPE keys are read: `rope_parameters` (transformers
// 5) and `rope_theta` + `rope_scaling` (transformers 4).
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kvb {

enum class ModelFamily { Gpt2, Llama };       // Llama also covers Qwen2 and Mistral
enum class Activation { GeluTanh, GeluErf, Relu, Silu };
// A layer's attention: full causal, or over a sliding window of the last W tokens
// (Hugging Face's layer_types "full_attention" / "sliding_attention").
enum class AttentionKind { Full, Sliding };
const char* attention_kind_name(AttentionKind kind);  // "full_attention" / "sliding_attention"

struct RopeConfig {
  bool enabled = false;
  double theta = 10000.0;
  std::string type = "default";  // "default", "linear" or "llama3"
  double factor = 1.0;           // linear and llama3: context extension factor
  double low_freq_factor = 1.0;  // llama3
  double high_freq_factor = 4.0; // llama3
  int64_t original_max_positions = 8192;  // llama3: original_max_position_embeddings
};

struct ModelConfig {
  std::filesystem::path dir;          // the checkpoint directory
  std::filesystem::path config_file;  // dir / "config.json"
  std::string architecture;           // e.g. "LlamaForCausalLM"
  std::string model_type;             // e.g. "llama"
  ModelFamily family = ModelFamily::Llama;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t layers = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // MLP hidden width
  int64_t max_positions = 0;      // GPT-2: size of the position table; others: informational
  double norm_eps = 1e-5;
  Activation activation = Activation::Silu;
  bool gated_mlp = true;          // SwiGLU (gate, up, down) vs GPT-2's fc -> act -> proj
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  bool tied_embeddings = false;   // lm_head reuses the token embedding
  RopeConfig rope;
  // Per layer: its attention kind, and its window: 0 for a full layer, W > 0 for a
  // sliding one, where key j is visible from query t only when t - W < j <= t
  // (Hugging Face's sliding window: the query and the W - 1 tokens before it).
  std::vector<AttentionKind> attention_kinds;
  std::vector<int64_t> sliding_window;
  // Attention scores are q·k * score_scale(layer): 1/sqrt(head_dim), and for GPT-2
  // with scale_attn_by_inverse_layer_idx also / (layer + 1).
  bool scale_attn_weights = true;
  bool scale_by_inverse_layer_idx = false;
  std::optional<int64_t> bos_token_id, eos_token_id;  // eos_token_id: the first of eos_token_ids
  // Every id that ends a generation: config.json's eos_token_id (an id or a list) and
  // generation_config.json's beside it, when present (what Hugging Face's generate stops at).
  std::vector<int64_t> eos_token_ids;
  bool is_eos(int64_t id) const { return std::find(eos_token_ids.begin(), eos_token_ids.end(), id) != eos_token_ids.end(); }

  float score_scale(int64_t layer) const;
  bool is_sliding(int64_t layer) const { return attention_kinds[static_cast<size_t>(layer)] == AttentionKind::Sliding; }
  int64_t sliding_layers() const;  // how many layers slide (0: full attention everywhere)
  int64_t qkv_width() const { return (q_heads + 2 * kv_heads) * head_dim; }
  // A warning when `tokens` exceed max_position_embeddings of a RoPE model (which will
  // compute any position, but was not trained on them), else "". GPT-2 refuses instead.
  std::string context_warning(int64_t tokens) const;
  std::string summary() const;  // "LlamaForCausalLM: 6 layers, 6/2 heads, head_dim 64, ..."
};

// Reads dir/config.json. Errors (kvb::Error) name the file and the key: malformed
// JSON, a missing or mistyped key, an unsupported architecture or RoPE type.
ModelConfig load_model_config(const std::filesystem::path& dir);

// "0,2,5-7": ascending layer indices, runs written as ranges.
std::string format_layer_list(const std::vector<int64_t>& layers);

// The architectures load_model_config accepts, for messages and listings.
const std::vector<std::string>& supported_architectures();

}  // namespace kvb
