#include "sim/model/weights.h"

#include <cmath>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/store_common.h"

namespace kvb {

namespace fs = std::filesystem;

namespace {

// One pass over a weight as read (before any transpose or stacking), so the index is
// the checkpoint's own: NaN or Inf anywhere (final norm and lm_head included, which
// no recording check would see) is an error naming the file, the weight and the index.
void require_finite_weight(const Tensor& t, const std::string& file, const std::string& name) {
  const float* p = t.ptr();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(p[i])) continue;
    std::vector<int64_t> idx(t.shape.size());
    int64_t rem = i;
    for (size_t d = t.shape.size(); d-- > 0;) {
      idx[d] = rem % t.shape[d];
      rem /= t.shape[d];
    }
    const float v = p[i];
    throw Error(file + ": weight '" + name + "'" + shape_str(idx) + " is " +
                (std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf")) + " (shape " + shape_str(t.shape) +
                "); weights must be finite");
  }
}

// Reads named tensors with the shapes the config implies; errors name the file and key.
class WeightReader {
 public:
  WeightReader(const ModelConfig& c, const TensorStore& s) : config_(c), store_(s) {}

  bool has(const std::string& name) const { return store_.contains(name); }

  // Throws when the checkpoint holds weights of a layer past the config's count
  // (`layer_prefix` + that index + "."): config.json and the weights disagree, and
  // a forward pass over fewer layers would silently be another model.
  void require_no_layer_beyond(const std::string& layer_prefix, int64_t layers, const char* key) const {
    const std::string first_extra = layer_prefix + std::to_string(layers) + ".";
    for (const TensorInfo& t : store_.list())
      if (t.name.compare(0, first_extra.size(), first_extra) == 0)
        throw Error(store_.path().string() + ": weight '" + t.name + "' belongs to layer " + std::to_string(layers) +
                    ", but " + config_.config_file.string() + " says " + key + " = " + std::to_string(layers) +
                    " (layers 0.." + std::to_string(layers - 1) + "): the config and the weights disagree");
  }

  Tensor read(const std::string& name, const std::vector<int64_t>& shape) const {
    if (!store_.contains(name)) {
      std::vector<std::string> names;
      for (const TensorInfo& t : store_.list()) names.push_back(t.name);
      throw Error(store_.path().string() + ": missing weight '" + name + "' " + shape_str(shape) + ", needed by " +
                  config_.architecture + " (" + config_.config_file.string() + ")" + nearest_names_hint(name, names));
    }
    const TensorInfo& info = store_.info(name);
    if (info.dtype != DType::F32 && info.dtype != DType::F16 && info.dtype != DType::BF16)
      throw Error(info.file + ": weight '" + name + "' has dtype " + dtype_name(info.dtype) +
                  "; weights must be F32, F16 or BF16");
    if (info.shape != shape)
      throw Error(info.file + ": weight '" + name + "' has shape " + shape_str(info.shape) + ", but " +
                  config_.config_file.string() + " implies " + shape_str(shape));
    Tensor t = store_.read_f32(name);
    require_finite_weight(t, info.file, name);
    return t;
  }

  RowMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const Tensor t = read(name, {rows, cols});
    return Eigen::Map<const RowMatrix>(t.ptr(), rows, cols);
  }
  // GPT-2 Conv1D: stored [in, out], returned [out, in].
  RowMatrix conv1d(const std::string& name, int64_t in, int64_t out) const {
    const Tensor t = read(name, {in, out});
    return Eigen::Map<const RowMatrix>(t.ptr(), in, out).transpose();
  }
  Eigen::VectorXf vector(const std::string& name, int64_t n) const {
    const Tensor t = read(name, {n});
    return Eigen::Map<const Eigen::VectorXf>(t.ptr(), n);
  }

 private:
  const ModelConfig& config_;
  const TensorStore& store_;
};

RowMatrix stack_rows(const std::vector<RowMatrix>& parts) {
  int64_t rows = 0;
  for (const RowMatrix& p : parts) rows += p.rows();
  RowMatrix out(rows, parts.front().cols());
  int64_t r = 0;
  for (const RowMatrix& p : parts) {
    out.middleRows(r, p.rows()) = p;
    r += p.rows();
  }
  return out;
}

Eigen::VectorXf stack(const std::vector<Eigen::VectorXf>& parts) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.size();
  Eigen::VectorXf out(n);
  int64_t i = 0;
  for (const auto& p : parts) {
    out.segment(i, p.size()) = p;
    i += p.size();
  }
  return out;
}

ModelWeights load_gpt2(const ModelConfig& c, const WeightReader& r) {
  // GPT2LMHeadModel names its weights "transformer.*"; bare GPT2Model checkpoints
  // (the original OpenAI conversions) drop the prefix.
  const std::string p = !r.has("transformer.wte.weight") && r.has("wte.weight") ? "" : "transformer.";
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  ModelWeights w;
  w.token_embedding = r.matrix(p + "wte.weight", c.vocab_size, H);
  w.position_embedding = r.matrix(p + "wpe.weight", c.max_positions, H);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = p + "h." + std::to_string(l) + ".";
    BlockWeights blk;
    blk.attn_norm = {r.vector(b + "ln_1.weight", H), r.vector(b + "ln_1.bias", H)};
    blk.mlp_norm = {r.vector(b + "ln_2.weight", H), r.vector(b + "ln_2.bias", H)};
    blk.qkv = {r.conv1d(b + "attn.c_attn.weight", H, 3 * H), r.vector(b + "attn.c_attn.bias", 3 * H)};
    blk.attn_out = {r.conv1d(b + "attn.c_proj.weight", H, H), r.vector(b + "attn.c_proj.bias", H)};
    blk.mlp_in = {r.conv1d(b + "mlp.c_fc.weight", H, I), r.vector(b + "mlp.c_fc.bias", I)};
    blk.mlp_out = {r.conv1d(b + "mlp.c_proj.weight", I, H), r.vector(b + "mlp.c_proj.bias", H)};
    w.blocks.push_back(std::move(blk));
  }
  r.require_no_layer_beyond(p + "h.", c.layers, "n_layer");
  w.final_norm = {r.vector(p + "ln_f.weight", H), r.vector(p + "ln_f.bias", H)};
  if (!c.tied_embeddings) w.lm_head = r.matrix("lm_head.weight", c.vocab_size, H);
  return w;
}

ModelWeights load_llama_family(const ModelConfig& c, const WeightReader& r) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, d = c.head_dim;
  const int64_t qw = c.q_heads * d, kvw = c.kv_heads * d;
  ModelWeights w;
  w.token_embedding = r.matrix("model.embed_tokens.weight", c.vocab_size, H);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    BlockWeights blk;
    blk.attn_norm.weight = r.vector(b + "input_layernorm.weight", H);
    blk.mlp_norm.weight = r.vector(b + "post_attention_layernorm.weight", H);
    const std::string a = b + "self_attn.";
    blk.qkv.weight = stack_rows({r.matrix(a + "q_proj.weight", qw, H), r.matrix(a + "k_proj.weight", kvw, H),
                                 r.matrix(a + "v_proj.weight", kvw, H)});
    if (c.qkv_bias)
      blk.qkv.bias = stack({r.vector(a + "q_proj.bias", qw), r.vector(a + "k_proj.bias", kvw),
                            r.vector(a + "v_proj.bias", kvw)});
    blk.attn_out.weight = r.matrix(a + "o_proj.weight", H, qw);
    if (c.o_bias) blk.attn_out.bias = r.vector(a + "o_proj.bias", H);
    const std::string m = b + "mlp.";
    blk.mlp_in.weight = stack_rows({r.matrix(m + "gate_proj.weight", I, H), r.matrix(m + "up_proj.weight", I, H)});
    blk.mlp_out.weight = r.matrix(m + "down_proj.weight", H, I);
    if (c.mlp_bias) {
      blk.mlp_in.bias = stack({r.vector(m + "gate_proj.bias", I), r.vector(m + "up_proj.bias", I)});
      blk.mlp_out.bias = r.vector(m + "down_proj.bias", H);
    }
    w.blocks.push_back(std::move(blk));
  }
  r.require_no_layer_beyond("model.layers.", c.layers, "num_hidden_layers");
  w.final_norm.weight = r.vector("model.norm.weight", H);
  if (!c.tied_embeddings) w.lm_head = r.matrix("lm_head.weight", c.vocab_size, H);
  return w;
}

size_t floats(const RowMatrix& m) { return static_cast<size_t>(m.size()); }
size_t floats(const Eigen::VectorXf& v) { return static_cast<size_t>(v.size()); }
size_t floats(const DenseWeights& d) { return floats(d.weight) + floats(d.bias); }
size_t floats(const NormWeights& n) { return floats(n.weight) + floats(n.bias); }

}  // namespace

size_t ModelWeights::bytes() const {
  size_t n = floats(token_embedding) + floats(position_embedding) + floats(final_norm) + floats(lm_head);
  for (const BlockWeights& b : blocks)
    n += floats(b.attn_norm) + floats(b.mlp_norm) + floats(b.qkv) + floats(b.attn_out) + floats(b.mlp_in) +
         floats(b.mlp_out);
  return n * sizeof(float);
}

std::unique_ptr<TensorStore> open_checkpoint(const fs::path& dir, std::string* warning) {
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    if (fs::exists(index) && warning)
      *warning = dir.string() + " holds both model.safetensors and model.safetensors.index.json; reading " +
                 "model.safetensors, as Hugging Face does (the shards of the index are ignored)";
    return TensorStore::open(single);
  }
  if (fs::exists(index)) return TensorStore::open(index);
  throw Error(dir.string() + ": no model.safetensors or model.safetensors.index.json (a Hugging Face checkpoint "
                             "saved with safetensors)");
}

ModelWeights load_model_weights(const ModelConfig& config, const TensorStore& store) {
  const WeightReader reader(config, store);
  return config.family == ModelFamily::Gpt2 ? load_gpt2(config, reader) : load_llama_family(config, reader);
}

}  // namespace kvb
