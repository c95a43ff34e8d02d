#include "sim/model/weights.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/core/strings.h"
#include "sim/io/store_common.h"

namespace kvb {

namespace fs = std::filesystem;

void* allocate_weight_bytes(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20, kLarge = size_t{4} << 20, kSmallAlign = 64;
  const size_t align = bytes >= kLarge ? kHugePage : kSmallAlign;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;  // aligned_alloc's rule
  void* p = std::aligned_alloc(align, rounded);
  if (!p) throw std::bad_alloc();
  if (align == kHugePage) ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure changes nothing
  return p;
}

void free_weight_bytes(void* p) noexcept { std::free(p); }

namespace {

// The value of element i of a tensor held as 16-bit bits (F16 / BF16).
float half_value(DType dtype, uint16_t bits) {
  return dtype == DType::BF16 ? bf16_bits_to_f32(bits) : f16_bits_to_f32(bits);
}

// Throws the error of require_finite_weight for element i (value v) of a tensor.
[[noreturn]] void throw_non_finite(const std::vector<int64_t>& shape, int64_t i, float v, const std::string& file,
                                   const std::string& name) {
  std::vector<int64_t> idx(shape.size());
  int64_t rem = i;
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
  }
  throw Error(file + ": weight '" + name + "'" + shape_str(idx) + " is " +
              (std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf")) + " (shape " + shape_str(shape) +
              "); weights must be finite");
}

// One pass over a weight as read (before any transpose or stacking), so the index is
// the checkpoint's own: NaN or Inf anywhere (final norm and lm_head included, which
// no recording check would see) is an error naming the file, the weight and the index.
void require_finite_weight(const Tensor& t, const std::string& file, const std::string& name) {
  const float* p = t.ptr();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) throw_non_finite(t.shape, i, p[i], file, name);
}

// The same for 16-bit weights: a value is NaN or Inf exactly when its exponent bits
// are all ones (F16: 5 bits, mask 0x7C00; BF16: 8 bits, mask 0x7F80).
void require_finite_weight(DType dtype, const uint16_t* bits, const std::vector<int64_t>& shape,
                           const std::string& file, const std::string& name) {
  const uint16_t exponent = dtype == DType::BF16 ? 0x7F80 : 0x7C00;
  const int64_t n = Tensor::count(shape);
  // All threads scan blocks of kScanBlock values; the first non-finite index is the
  // smallest one found, whatever the thread count.
  constexpr int64_t kScanBlock = int64_t{1} << 22;
  const int64_t blocks = (n + kScanBlock - 1) / kScanBlock;
  int64_t first = n;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kScanBlock);
    for (int64_t i = b * kScanBlock; i < end; ++i)
      if ((bits[i] & exponent) == exponent) {
        first = std::min(first, i);
        break;
      }
  }
  if (first < n) throw_non_finite(shape, first, half_value(dtype, bits[first]), file, name);
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

  // The weight in fp32, checked: present, a float dtype, the config's shape, finite.
  Tensor read(const std::string& name, const std::vector<int64_t>& shape) const {
    const TensorInfo& info = checked_info(name, shape);
    Tensor t = store_.read_f32(name);
    require_finite_weight(t, info.file, name);
    return t;
  }

  // A [rows, cols] matrix in the checkpoint's dtype (16-bit weights stay 16-bit).
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    return stacked({{name, rows}}, cols);
  }
  // The named [rows_i, cols] matrices' rows one after another, read straight into one
  // buffer when they share a 16-bit dtype (no copy beyond the one read).
  WeightMatrix stacked(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) const {
    int64_t rows = 0;
    bool same_half = true;
    const DType first = checked_info(parts.front().first, {parts.front().second, cols}).dtype;
    for (const auto& [name, n] : parts) {
      same_half = same_half && checked_info(name, {n, cols}).dtype == first && first != DType::F32;
      rows += n;
    }
    if (!same_half) {
      std::vector<WeightMatrix> read_parts;
      for (const auto& [name, n] : parts) {
        const Tensor t = read(name, {n, cols});
        read_parts.emplace_back(RowMatrix(Eigen::Map<const RowMatrix>(t.ptr(), n, cols)));
      }
      return read_parts.size() == 1 ? std::move(read_parts.front()) : WeightMatrix::stack_rows(read_parts);
    }
    WeightMatrix::Bits bits(static_cast<size_t>(rows * cols));
    uint16_t* at = bits.data();
    for (const auto& [name, n] : parts) {
      const TensorInfo& info = store_.info(name);
      store_.read_raw(name, at);
      require_finite_weight(info.dtype, at, info.shape, info.file, name);
      at += n * cols;
    }
    return WeightMatrix(first, rows, cols, std::move(bits));
  }
  // GPT-2 Conv1D: stored [in, out], returned [out, in].
  WeightMatrix conv1d(const std::string& name, int64_t in, int64_t out) const {
    return matrix(name, in, out).transposed();
  }
  Eigen::VectorXf vector(const std::string& name, int64_t n) const {
    const Tensor t = read(name, {n});
    return Eigen::Map<const Eigen::VectorXf>(t.ptr(), n);
  }

 private:
  const TensorInfo& checked_info(const std::string& name, const std::vector<int64_t>& shape) const {
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
    return info;
  }

  const ModelConfig& config_;
  const TensorStore& store_;
};

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
    blk.qkv.weight = r.stacked({{a + "q_proj.weight", qw}, {a + "k_proj.weight", kvw}, {a + "v_proj.weight", kvw}}, H);
    if (c.qkv_bias)
      blk.qkv.bias = stack({r.vector(a + "q_proj.bias", qw), r.vector(a + "k_proj.bias", kvw),
                            r.vector(a + "v_proj.bias", kvw)});
    blk.attn_out.weight = r.matrix(a + "o_proj.weight", H, qw);
    if (c.o_bias) blk.attn_out.bias = r.vector(a + "o_proj.bias", H);
    const std::string m = b + "mlp.";
    blk.mlp_in.weight = r.stacked({{m + "gate_proj.weight", I}, {m + "up_proj.weight", I}}, H);
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

size_t bytes_of(const WeightMatrix& m) { return m.bytes(); }
size_t bytes_of(const Eigen::VectorXf& v) { return static_cast<size_t>(v.size()) * sizeof(float); }
size_t bytes_of(const DenseWeights& d) { return bytes_of(d.weight) + bytes_of(d.bias); }
size_t bytes_of(const NormWeights& n) { return bytes_of(n.weight) + bytes_of(n.bias); }

}  // namespace

WeightMatrix::WeightMatrix(RowMatrix f32) : dtype_(DType::F32), rows_(f32.rows()), cols_(f32.cols()), f32_(std::move(f32)) {}

WeightMatrix::WeightMatrix(DType dtype, int64_t rows, int64_t cols, Bits bits)
    : dtype_(dtype), rows_(rows), cols_(cols), bits_(std::move(bits)) {
  if (dtype != DType::F16 && dtype != DType::BF16) throw Error("WeightMatrix: 16-bit storage must be F16 or BF16");
  if (static_cast<int64_t>(bits_.size()) != rows * cols) throw Error("WeightMatrix: size does not match its shape");
}

size_t WeightMatrix::bytes() const {
  return dtype_ == DType::F32 ? static_cast<size_t>(f32_.size()) * sizeof(float) : bits_.size() * sizeof(uint16_t);
}

void WeightMatrix::rows_to_f32(int64_t first, int64_t count, float* out) const {
  const size_t begin = static_cast<size_t>(first * cols_), n = static_cast<size_t>(count * cols_);
  if (dtype_ == DType::F32) {
    std::copy(f32_.data() + begin, f32_.data() + begin + n, out);
  } else if (dtype_ == DType::BF16) {
    bf16_to_f32_n(bits_.data() + begin, n, out);
  } else {
    f16_to_f32_n(bits_.data() + begin, n, out);
  }
}

WeightMatrix WeightMatrix::transposed() const {
  if (dtype_ == DType::F32) return WeightMatrix(RowMatrix(f32_.transpose()));
  Bits t(bits_.size());
  for (int64_t r = 0; r < rows_; ++r)
    for (int64_t c = 0; c < cols_; ++c) t[static_cast<size_t>(c * rows_ + r)] = bits_[static_cast<size_t>(r * cols_ + c)];
  return WeightMatrix(dtype_, cols_, rows_, std::move(t));
}

WeightMatrix WeightMatrix::stack_rows(const std::vector<WeightMatrix>& parts) {
  int64_t rows = 0;
  bool same_dtype = true;
  for (const WeightMatrix& p : parts) {
    rows += p.rows();
    same_dtype = same_dtype && p.dtype() == parts.front().dtype();
  }
  const int64_t cols = parts.front().cols();
  if (same_dtype && parts.front().dtype() != DType::F32) {
    Bits bits;
    bits.reserve(static_cast<size_t>(rows * cols));
    for (const WeightMatrix& p : parts) bits.insert(bits.end(), p.bits_.begin(), p.bits_.end());
    return WeightMatrix(parts.front().dtype(), rows, cols, std::move(bits));
  }
  RowMatrix out(rows, cols);
  int64_t r = 0;
  for (const WeightMatrix& p : parts) {
    p.rows_to_f32(0, p.rows(), out.row(r).data());
    r += p.rows();
  }
  return WeightMatrix(std::move(out));
}

size_t ModelWeights::bytes() const {
  size_t n = bytes_of(token_embedding) + bytes_of(position_embedding) + bytes_of(final_norm) + bytes_of(lm_head);
  for (const BlockWeights& b : blocks)
    n += bytes_of(b.attn_norm) + bytes_of(b.mlp_norm) + bytes_of(b.qkv) + bytes_of(b.attn_out) + bytes_of(b.mlp_in) +
         bytes_of(b.mlp_out);
  return n;
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
