#include "sim/model/model_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/json_file.h"

namespace kvb {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// More transformer layers than any checkpoint has (the largest have a few hundred).
constexpr int64_t kMaxLayers = 65536;

// Typed access to config.json keys; every error names the file and the key.
class JsonKeys {
 public:
  JsonKeys(const json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // Whether the key is written at all, null included.
  bool present(const std::string& key) const { return j_.contains(key); }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(file_ + ": key '" + prefix_ + key + "': " + what);
  }
  const json& raw(const std::string& key) const {
    if (!has(key)) throw Error(file_ + ": missing key '" + prefix_ + key + "'");
    return j_.at(key);
  }
  int64_t integer(const std::string& key) const {
    const json& v = raw(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t integer(const std::string& key, int64_t def) const { return has(key) ? integer(key) : def; }
  // A size: > 0 and at most `most` (checked before anything is allocated for it).
  int64_t positive(const std::string& key, int64_t most = INT32_MAX) const {
    const int64_t v = integer(key);
    if (v <= 0) fail(key, "must be > 0, got " + std::to_string(v));
    if (v > most) fail(key, std::to_string(v) + " is more than this tool supports (" + std::to_string(most) + ")");
    return v;
  }
  double real(const std::string& key) const {
    const json& v = raw(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  double real(const std::string& key, double def) const { return has(key) ? real(key) : def; }
  // An absent flag takes its default; a null one is false, as in Hugging Face, which
  // tests these flags for truth (`if config.scale_attn_weights:`) and None is false.
  bool boolean(const std::string& key, bool def) const {
    if (!j_.contains(key)) return def;
    const json& v = j_.at(key);
    if (v.is_null()) return false;
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::optional<int64_t> opt_token(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j_.at(key);
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();  // eos lists
    if (!v.is_number_integer()) fail(key, "expected a token id, got " + v.dump());
    return v.get<int64_t>();
  }
  // An id or a list of ids (eos_token_id in Llama 3's configs); empty when absent or null.
  std::vector<int64_t> token_list(const std::string& key) const {
    if (!has(key)) return {};
    const json& v = j_.at(key);
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array()) fail(key, "expected a token id or a list of them, got " + v.dump());
    std::vector<int64_t> ids;
    for (const json& id : v) {
      if (!id.is_number_integer()) fail(key, "expected a list of token ids, got " + v.dump());
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }
  JsonKeys object(const std::string& key) const {
    const json& v = raw(key);
    if (!v.is_object()) fail(key, "expected an object, got " + v.dump());
    return JsonKeys(v, file_, prefix_ + key + ".");
  }

 private:
  const json& j_;
  std::string file_;
  std::string prefix_;
};

Activation parse_activation(const JsonKeys& k, const std::string& key, const std::string& name) {
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") return Activation::GeluTanh;
  if (name == "gelu") return Activation::GeluErf;
  if (name == "relu") return Activation::Relu;
  if (name == "silu" || name == "swish") return Activation::Silu;
  k.fail(key, "unsupported activation '" + name + "' (supported: gelu_new, gelu_pytorch_tanh, gelu, relu, silu)");
}

// RoPE: transformers 5 writes `rope_parameters` {rope_theta, rope_type, ...};
// transformers 4 writes `rope_theta` and an optional `rope_scaling` {type|rope_type, ...}.
RopeConfig parse_rope(const JsonKeys& k) {
  RopeConfig r;
  r.enabled = true;
  std::optional<JsonKeys> params;
  if (k.has("rope_parameters")) {
    params.emplace(k.object("rope_parameters"));
    // transformers 5 may write them per layer type ({"full_attention": {...},
    // "sliding_attention": {...}}, as for Ministral): one RoPE for every layer type.
    std::optional<std::string> first;
    for (const char* type : {"full_attention", "sliding_attention"}) {
      if (!params->has(type)) continue;
      if (!first) first = type;
      else if (params->raw(type) != params->raw(*first))
        params->fail(type, std::string("differs from ") + *first + ": RoPE that differs per layer type is not supported");
    }
    if (first) params.emplace(k.object("rope_parameters").object(*first));
  } else if (k.has("rope_scaling")) {
    params.emplace(k.object("rope_scaling"));
  }
  // A positive, finite number (theta, scaling factors); the error names the key.
  const auto positive_real = [](const JsonKeys& keys, const std::string& key) {
    const double v = keys.real(key);
    if (!std::isfinite(v) || !(v > 0)) keys.fail(key, "must be a finite number > 0, got " + format_double(v));
    return v;
  };
  if (k.has("rope_theta")) r.theta = positive_real(k, "rope_theta");
  else r.theta = 10000.0;
  if (!params) return r;
  if (params->has("rope_theta")) r.theta = positive_real(*params, "rope_theta");
  r.type = params->string("rope_type", params->string("type", "default"));
  const std::string key = params->has("rope_type") ? "rope_type" : "type";
  if (r.type == "default") return r;
  if (r.type == "linear") {
    r.factor = positive_real(*params, "factor");
  } else if (r.type == "llama3") {
    r.factor = positive_real(*params, "factor");
    r.low_freq_factor = positive_real(*params, "low_freq_factor");
    r.high_freq_factor = positive_real(*params, "high_freq_factor");
    r.original_max_positions = params->positive("original_max_position_embeddings");
    if (!(r.high_freq_factor > r.low_freq_factor))
      params->fail("high_freq_factor", "must be greater than low_freq_factor");
  } else {
    params->fail(key, "unsupported RoPE type '" + r.type + "' (supported: default, linear, llama3)");
  }
  return r;
}

void parse_gpt2(const JsonKeys& k, ModelConfig& c) {
  c.family = ModelFamily::Gpt2;
  c.hidden_size = k.positive("n_embd");
  c.layers = k.positive("n_layer", kMaxLayers);
  c.q_heads = c.kv_heads = k.positive("n_head");
  if (c.hidden_size % c.q_heads != 0)
    k.fail("n_head", "n_embd " + std::to_string(c.hidden_size) + " is not a multiple of n_head " +
                         std::to_string(c.q_heads));
  c.head_dim = c.hidden_size / c.q_heads;
  c.intermediate_size = k.has("n_inner") ? k.positive("n_inner") : 4 * c.hidden_size;
  c.max_positions = k.positive("n_positions");
  c.norm_eps = k.real("layer_norm_epsilon", 1e-5);
  c.activation = parse_activation(k, "activation_function", k.string("activation_function", "gelu_new"));
  c.gated_mlp = false;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tied_embeddings = k.boolean("tie_word_embeddings", true);
  c.scale_attn_weights = k.boolean("scale_attn_weights", true);
  c.scale_by_inverse_layer_idx = k.boolean("scale_attn_by_inverse_layer_idx", false);
  c.sliding_window.assign(static_cast<size_t>(c.layers), 0);
  c.attention_kinds.assign(static_cast<size_t>(c.layers), AttentionKind::Full);
}

// A layer_types entry: "full_attention" or "sliding_attention"; anything else is an
// error naming the file, the key and the index.
AttentionKind parse_layer_type(const JsonKeys& k, const json& entry, int64_t index) {
  if (entry.is_string()) {
    const std::string s = entry.get<std::string>();
    if (s == "full_attention") return AttentionKind::Full;
    if (s == "sliding_attention") return AttentionKind::Sliding;
  }
  k.fail("layer_types", "entry " + std::to_string(index) + ": unsupported layer type " + entry.dump() +
                            " (supported: \"full_attention\", \"sliding_attention\")");
}

// Per-layer attention as Hugging Face's configs derive it (transformers' config
// classes), into c.attention_kinds and c.sliding_window:
//   MistralForCausalLM   every layer slides over `sliding_window` (default 4096; null:
//                        full attention); HF ignores `layer_types` for Mistral, so a
//                        list that disagrees with that is refused
//   MinistralForCausalLM `layer_types`, else every layer sliding when `sliding_window`
//                        (default 4096) is not null, else every layer full
//   Qwen2ForCausalLM     the window is `sliding_window` (default 4096) only with
//                        `use_sliding_window`; `layer_types`, else layers from
//                        `max_window_layers` (default 28) on slide when there is a window
//   LlamaForCausalLM     full attention (HF's Llama has no window): a sliding layer in
//                        `layer_types` or a `sliding_window` is refused
// `layer_types` must have num_hidden_layers entries.
void parse_attention_types(const JsonKeys& k, ModelConfig& c) {
  const auto n = static_cast<size_t>(c.layers);
  std::optional<std::vector<AttentionKind>> listed;
  if (k.has("layer_types")) {
    const json& types = k.raw("layer_types");
    if (!types.is_array()) k.fail("layer_types", "expected a list of layer types, got " + types.dump());
    if (types.size() != n)
      k.fail("layer_types", "has " + std::to_string(types.size()) + " entries, but num_hidden_layers is " +
                                std::to_string(c.layers) + " (one entry per layer)");
    listed.emplace();
    for (size_t l = 0; l < n; ++l) listed->push_back(parse_layer_type(k, types[l], static_cast<int64_t>(l)));
  }
  // sliding_window: absent takes HF's default 4096, null means none.
  const bool window_given = k.has("sliding_window");
  std::optional<int64_t> window;
  if (window_given) window = k.positive("sliding_window");
  else if (!k.present("sliding_window")) window = 4096;
  const std::string& arch = c.architecture;
  std::vector<AttentionKind> kinds(n, AttentionKind::Full);
  if (arch == "MistralForCausalLM") {
    kinds.assign(n, window ? AttentionKind::Sliding : AttentionKind::Full);
    if (listed)
      for (size_t l = 0; l < n; ++l)
        if ((*listed)[l] != kinds[l])
          k.fail("layer_types", "entry " + std::to_string(l) + " is " + attention_kind_name((*listed)[l]) +
                                    ", but MistralForCausalLM gives every layer " + attention_kind_name(kinds[l]) +
                                    " (Hugging Face ignores layer_types for Mistral); a checkpoint with per-layer "
                                    "attention types is MinistralForCausalLM (model_type \"ministral\")");
  } else if (arch == "MinistralForCausalLM") {
    kinds = listed ? *listed : std::vector<AttentionKind>(n, window ? AttentionKind::Sliding : AttentionKind::Full);
  } else if (arch == "Qwen2ForCausalLM") {
    if (!k.boolean("use_sliding_window", false)) window.reset();
    if (listed) {
      kinds = *listed;
    } else if (window) {
      const int64_t from = k.integer("max_window_layers", 28);
      for (int64_t l = std::max<int64_t>(from, 0); l < c.layers; ++l) kinds[static_cast<size_t>(l)] = AttentionKind::Sliding;
    }
  } else {  // LlamaForCausalLM
    if (listed)
      for (size_t l = 0; l < n; ++l)
        if ((*listed)[l] == AttentionKind::Sliding)
          k.fail("layer_types", "entry " + std::to_string(l) + " is sliding_attention, but " + arch +
                                    " has no sliding-window attention in Hugging Face (which would ignore it)");
    if (window_given)
      k.fail("sliding_window", arch + " has no sliding-window attention in Hugging Face (which would ignore it); "
                                      "remove the key, or set it to null");
  }
  c.attention_kinds = kinds;
  c.sliding_window.assign(n, 0);
  for (size_t l = 0; l < n; ++l) {
    if (kinds[l] == AttentionKind::Full) continue;
    if (!window)
      k.fail("layer_types", "entry " + std::to_string(l) + " is sliding_attention, but there is no window: " +
                                (arch == "Qwen2ForCausalLM" ? std::string("use_sliding_window is false")
                                                            : std::string("sliding_window is null")) +
                                " (Hugging Face fails on it too)");
    c.sliding_window[l] = *window;
  }
}

void parse_llama_family(const JsonKeys& k, ModelConfig& c) {
  c.family = ModelFamily::Llama;
  c.hidden_size = k.positive("hidden_size");
  c.layers = k.positive("num_hidden_layers", kMaxLayers);
  c.q_heads = k.positive("num_attention_heads");
  c.kv_heads = k.has("num_key_value_heads") ? k.positive("num_key_value_heads") : c.q_heads;
  if (c.q_heads % c.kv_heads != 0)
    k.fail("num_key_value_heads", std::to_string(c.kv_heads) + " does not divide num_attention_heads " +
                                      std::to_string(c.q_heads));
  if (k.has("head_dim")) {
    c.head_dim = k.positive("head_dim");
  } else {
    if (c.hidden_size % c.q_heads != 0)
      k.fail("num_attention_heads", "hidden_size is not a multiple of it and no head_dim is given");
    c.head_dim = c.hidden_size / c.q_heads;
  }
  if (c.head_dim % 2 != 0) k.fail("head_dim", "RoPE needs an even head_dim, got " + std::to_string(c.head_dim));
  c.intermediate_size = k.positive("intermediate_size");
  c.max_positions = k.integer("max_position_embeddings", 0);
  c.norm_eps = k.real("rms_norm_eps", 1e-6);
  c.activation = parse_activation(k, "hidden_act", k.string("hidden_act", "silu"));
  c.gated_mlp = true;
  if (c.architecture == "Qwen2ForCausalLM") {
    c.qkv_bias = true;
    c.o_bias = false;
  } else if (c.architecture == "MinistralForCausalLM") {  // Mistral's projections: no biases
    c.qkv_bias = c.o_bias = false;
  } else {
    c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
  }
  c.mlp_bias = k.boolean("mlp_bias", false);
  c.tied_embeddings = k.boolean("tie_word_embeddings", false);
  if (k.has("partial_rotary_factor") && k.real("partial_rotary_factor") != 1.0)
    k.fail("partial_rotary_factor", "only full rotary embeddings (1.0) are supported");
  c.rope = parse_rope(k);
  parse_attention_types(k, c);
}

}  // namespace

namespace {

// The supported architectures (config.json "architectures"[0]) and their model_type.
struct ArchitectureEntry {
  const char* architecture;
  const char* model_type;
};
constexpr ArchitectureEntry kArchitectures[] = {{"GPT2LMHeadModel", "gpt2"},
                                                {"LlamaForCausalLM", "llama"},
                                                {"Qwen2ForCausalLM", "qwen2"},
                                                {"MistralForCausalLM", "mistral"},
                                                {"MinistralForCausalLM", "ministral"}};

}  // namespace

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const ArchitectureEntry& a : kArchitectures) n.push_back(a.architecture);
    return n;
  }();
  return names;
}

float ModelConfig::score_scale(int64_t layer) const {
  double s = scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
  if (scale_by_inverse_layer_idx) s /= static_cast<double>(layer + 1);
  return static_cast<float>(s);
}

std::string ModelConfig::context_warning(int64_t tokens) const {
  if (family == ModelFamily::Gpt2 || max_positions <= 0 || tokens <= max_positions) return {};
  return dir.string() + ": " + std::to_string(tokens) + " tokens exceed max_position_embeddings " +
         std::to_string(max_positions) + " in config.json; RoPE computes the positions, but the model was not "
         "trained on them (expect a much higher PPL)";
}

std::string ModelConfig::summary() const {
  std::ostringstream os;
  os << architecture << ": " << layers << " layers, " << q_heads << "/" << kv_heads << " q/kv heads, head_dim "
     << head_dim << ", hidden " << hidden_size << ", mlp " << intermediate_size << ", vocab " << vocab_size;
  if (rope.enabled) os << ", RoPE theta " << format_double(rope.theta) << (rope.type == "default" ? "" : " " + rope.type);
  const int64_t sliding = sliding_layers();
  if (sliding == layers) {
    os << ", sliding window " << sliding_window.front();
  } else if (sliding > 0) {  // a hybrid: name the layers of each kind
    std::vector<int64_t> which;
    for (int64_t l = 0; l < layers; ++l)
      if (is_sliding(l)) which.push_back(l);
    os << ", hybrid: " << sliding << " sliding-window layers (W " << sliding_window[static_cast<size_t>(which[0])]
       << ": " << format_layer_list(which) << "), " << layers - sliding << " full";
  }
  return os.str();
}

int64_t ModelConfig::sliding_layers() const {
  return static_cast<int64_t>(std::count(attention_kinds.begin(), attention_kinds.end(), AttentionKind::Sliding));
}

const char* attention_kind_name(AttentionKind kind) {
  return kind == AttentionKind::Sliding ? "sliding_attention" : "full_attention";
}

std::string format_layer_list(const std::vector<int64_t>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(layers[i]);
    if (j > i) out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}

ModelConfig load_model_config(const fs::path& dir) {
  ModelConfig c;
  c.dir = dir;
  c.config_file = dir / "config.json";
  const std::string file = c.config_file.string();
  if (!fs::is_directory(dir)) throw Error(dir.string() + ": not a checkpoint directory (no such directory)");
  const json j = read_json_object(c.config_file, "a Hugging Face checkpoint directory holds config.json");
  const JsonKeys k(j, file);

  const json& archs = k.raw("architectures");
  if (!archs.is_array() || archs.empty() || !archs[0].is_string())
    k.fail("architectures", "expected a list of architecture names, got " + archs.dump());
  c.architecture = archs[0].get<std::string>();
  c.model_type = k.string("model_type", "");
  const auto& supported = supported_architectures();
  if (std::find(supported.begin(), supported.end(), c.architecture) == supported.end())
    k.fail("architectures", "unsupported architecture '" + c.architecture + "' (supported: " + join(supported, ", ") + ")");
  // model_type, when given, must be the architecture's (a config edited by hand or a
  // different model family under a familiar class name is not run as something else).
  for (const ArchitectureEntry& a : kArchitectures)
    if (c.architecture == a.architecture && !c.model_type.empty() && c.model_type != a.model_type)
      k.fail("model_type", "model_type '" + c.model_type + "' does not match architecture '" + c.architecture +
                               "' (expected '" + a.model_type + "')");
  if (c.architecture == "GPT2LMHeadModel") parse_gpt2(k, c);
  else parse_llama_family(k, c);

  c.vocab_size = k.positive("vocab_size");
  c.bos_token_id = k.opt_token("bos_token_id");
  c.eos_token_id = k.opt_token("eos_token_id");
  c.eos_token_ids = k.token_list("eos_token_id");
  // Hugging Face's generate stops at generation_config.json's eos_token_id (Llama 3
  // Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>): its ids join config.json's.
  const fs::path generation = dir / "generation_config.json";
  if (fs::exists(generation)) {
    const json g = read_json_object(generation, "generation_config.json beside config.json");
    for (int64_t id : JsonKeys(g, generation.string()).token_list("eos_token_id"))
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
  }
  if (!c.eos_token_id && !c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      throw Error(file + ": eos_token_id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(c.vocab_size) + " tokens");
  if (!(c.norm_eps > 0)) throw Error(file + ": the normalization epsilon must be > 0");
  return c;
}

}  // namespace kvb
