// Recording: what attention consumed in a real or synthetic forward pass.
// Read-only once built; shared by every sweep point and thread.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/core/tensor.h"

namespace kvb {

// One transformer layer's attention inputs and output, host fp32.
struct LayerTensors {
  // [q_heads, T, head_dim], or [q_heads, query_positions.size(), head_dim] when only
  // sampled positions' queries are kept; post-RoPE when the model uses RoPE.
  Tensor query;
  Tensor key;           // [kv_heads, T, head_dim]; post-RoPE when the model uses RoPE
  Tensor value;         // [kv_heads, T, head_dim]
  Tensor key_pre_rope;  // [kv_heads, T, head_dim], or empty when not recorded
  Tensor attn_output;   // [T, q_heads * head_dim] (input of o_proj), or empty
  // The positions whose queries `query` holds, sorted and distinct (row i of each head
  // is position query_positions[i]); empty = every position 0..T-1. A run that reads
  // queries at a few sampled positions keeps only those (a long context's queries are
  // the largest tensor: q_heads/kv_heads times the keys).
  std::vector<int64_t> query_positions;

  bool sparse_queries() const { return !query_positions.empty(); }
  // The query of head h at position t, [head_dim]. Throws kvb::Error when the layer
  // keeps sampled positions and t is not one of them.
  const float* query_row(int64_t h, int64_t t) const;
};

// How the recorded keys were rotated (Hugging Face "rotate_half" convention: pair
// channel i with i + head_dim/2, angle position * theta^(-2i/head_dim)).
struct RopeInfo {
  bool applied = false;   // query/key are post-RoPE
  double theta = 10000.0;
  // The inverse frequencies (radians per position, head_dim/2 of them) when they are not
  // theta^(-2i/head_dim): a model with linear or llama3 RoPE scaling. Empty = from theta.
  std::vector<float> inv_freq;
};

// RopeInfo::inv_freq as recording metadata ("rope_inv_freq"): comma-separated floats
// with 9 significant digits (exact round trip).
std::string rope_inv_freq_text(const std::vector<float>& inv_freq);
// The RoPE a recording file's metadata declares (what write_recording writes):
// "rope_theta" (else 10000) and, when present, "rope_inv_freq". `applied` stays false:
// the caller knows whether the keys are post-RoPE. Throws kvb::Error naming `where`
// for a value that is not a positive number, or not head_dim/2 of them.
RopeInfo rope_from_metadata(const std::map<std::string, std::string>& metadata, int64_t head_dim,
                            const std::string& where);

struct Recording {
  std::string name;    // e.g. "gpt2-bytes-record" or "synthetic"
  std::string source;  // file path or "synthetic(seed=...)"
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t tokens = 0;                   // T
  std::vector<int> layer_ids;           // original layer index of layers[i]
  std::vector<LayerTensors> layers;
  std::vector<int64_t> token_ids;       // length T, or empty when unknown
  std::vector<int64_t> positions;       // length T; RoPE positions (default 0..T-1)
  std::optional<int64_t> phase_boundary;  // first token of the second phase, if known
  RopeInfo rope;
  std::map<std::string, std::string> metadata;
  // Per layer (layers[i]), the sliding window W of the model that computed it: its
  // query t attends to t - W < j <= t only (0 = full causal attention); empty when
  // every layer is full causal. The tensors are the model's either way, but what the
  // simulator and the strategies' statistics compute from them is full causal
  // attention, which is the model's only for queries t < W (model_eval.h).
  std::vector<int64_t> attention_windows;
  // A streamed recording's skeleton (sim/layer_stream.h), whose layers hold no tensors
  // until held: what each layer holds then beside its queries, keys and values, for
  // summary(). Unset for a recording that holds its layers (summary() looks at layer 0).
  struct HeldExtras {
    bool key_pre_rope = false;
    bool attn_output = false;
  };
  std::optional<HeldExtras> streamed_extras;

  // Queries t < this attend alike in the recording (full causal) and in the model: the
  // smallest window of attention_windows, or T.
  int64_t full_causal_queries() const;
  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  int64_t group_size() const { return q_heads / kv_heads; }  // query heads per KV head
  int64_t kv_head_of(int64_t q_head) const { return q_head / group_size(); }
  bool has_pre_rope_keys() const;
  bool has_attn_output() const;
  // Whether the layers keep queries at sampled positions only (LayerTensors::query_positions).
  bool has_sparse_queries() const { return !layers.empty() && layers[0].sparse_queries(); }
  // Number of K and V elements: 2 * L * kv_heads * T * head_dim.
  int64_t kv_elements() const { return 2 * num_layers() * kv_heads * tokens * head_dim; }

  // Shapes agree across layers, GQA divides, positions/token ids have length T, every
  // value is finite, and RoPE of the pre-RoPE keys gives the keys. Throws kvb::Error
  // naming the tensor (and index) otherwise.
  void validate() const;
  // validate() in two parts, for a recording whose layers are streamed
  // (sim/layer_stream.h): everything but the layers' tensors, and layer i's tensors
  // (shapes, finite values, score bound; for a post-RoPE layer with pre-RoPE keys, that
  // RoPE with `rope` at `positions` turns key_pre_rope into key in every KV head:
  // check_pre_rope_keys, sim/formats/prerope_format.h) while it is held.
  void validate_except_layer_tensors() const;
  void validate_layer(int64_t i) const;
  // Keeps the first n tokens (n <= T), e.g. for a quick run on a prefix.
  void truncate_tokens(int64_t n);
  // Keeps the queries at `positions` only (sorted, distinct, each < T; a subset of the
  // positions kept so far), in every layer. Empty or every position: nothing changes.
  // Throws kvb::Error naming a position that is out of range or no longer kept.
  void keep_queries_at(const std::vector<int64_t>& positions);
  std::string summary() const;  // "6 layers, 6/6 heads, head_dim 64, 512 tokens"
};

// Where and how to read a recording from tensor files.
struct RecordingSpec {
  std::filesystem::path path;  // .safetensors, sharded index/dir, .npz, dir of .npy
  // Tensor name patterns; {layer} is replaced by the layer index.
  std::string query = "layers.{layer}.query";
  std::string key = "layers.{layer}.key";
  std::string value = "layers.{layer}.value";
  std::string key_pre_rope = "layers.{layer}.key_pre_rope";  // optional tensor
  std::string attn_output = "layers.{layer}.attn_output";    // optional tensor
  std::string token_ids = "input_ids";                       // optional tensor
  // Set when a config names that optional tensor: then it must exist (a typo in its
  // pattern is an error rather than a recording without it).
  bool key_pre_rope_required = false, attn_output_required = false, token_ids_required = false;
  // Axis names of the stored q/k/v tensors, outermost first, from
  // {batch, heads, tokens, head_dim}; a batch axis must have size 1.
  std::string layout = "heads,tokens,head_dim";
  // Axis names of attn_output: {batch, tokens, hidden} (hidden = heads*head_dim) or
  // a q/k/v-like layout with heads and head_dim.
  std::string attn_output_layout = "tokens,hidden";
  std::vector<int> layers;        // subset of layer indices; empty = all found
  int64_t max_tokens = 0;         // keep the first max_tokens; 0 = all
  std::optional<double> rope_theta;  // when set, keys are marked post-RoPE with this theta
};

// Loads and validates (Recording::validate) a recording. Layers are discovered from
// the key pattern. Errors name the file, the tensor and the expected shape.
Recording load_recording(const RecordingSpec& spec);

// load_recording one layer at a time, for a run that streams its layers
// (experiments/streaming.h): the file stays open, and each layer is read (and cut to
// max_tokens) when a pass needs it. skeleton() + load_into() of every layer give
// load_recording's recording bit for bit; the checks of what is not in the layers'
// tensors run on opening (the first layer is read once then, for the shapes), those of
// layer i's tensors in load_into (shapes) and Recording::validate_layer (values).
class RecordingFileLayers {
 public:
  explicit RecordingFileLayers(const RecordingSpec& spec);
  ~RecordingFileLayers();
  RecordingFileLayers(const RecordingFileLayers&) = delete;
  RecordingFileLayers& operator=(const RecordingFileLayers&) = delete;
  // Every field but the layers' tensors.
  Recording skeleton() const;
  // Reads layer i (index into skeleton().layers) into rec.layers[i].
  void load_into(Recording& rec, int64_t i) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Throws kvb::ConfigError "OPTION 'text': why" when `text` is not a valid axis order for
// q/k/v (RecordingSpec::layout) or, with for_attn_output, for attn_output (what
// load_recording checks first), so that a config can name the key.
void check_layout(const std::string& text, const char* option, bool for_attn_output);

}  // namespace kvb
