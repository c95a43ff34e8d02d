// load_recording: attention inputs of every layer from a tensor file, permuted into
// the canonical layout ([heads, tokens, head_dim] for q/k/v, [tokens, heads*head_dim]
// for attn_output) and checked for consistent shapes before Recording::validate()
// checks finiteness.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <numeric>
#include <set>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/store_common.h"
#include "sim/io/tensor_store.h"
#include "sim/recording.h"

namespace kvb {

namespace fs = std::filesystem;

namespace {

enum class Axis { Batch, Heads, Tokens, HeadDim, Hidden };

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::Batch: return "batch";
    case Axis::Heads: return "heads";
    case Axis::Tokens: return "tokens";
    case Axis::HeadDim: return "head_dim";
    case Axis::Hidden: return "hidden";
  }
  return "?";
}

// Axis names of a stored tensor, outermost first.
struct Layout {
  std::string text;
  std::vector<Axis> axes;
  bool has(Axis a) const { return std::find(axes.begin(), axes.end(), a) != axes.end(); }
};

// q/k/v layouts: a permutation of {heads, tokens, head_dim}, optionally with batch.
// attn_output layouts (for_attn_output): {tokens, hidden} or {tokens, heads, head_dim},
// optionally with batch. Bad strings are config errors.
Layout parse_layout(const std::string& text, const char* option, bool for_attn_output) {
  Layout L;
  L.text = text;
  const std::string allowed = for_attn_output ? "batch, tokens, hidden, heads, head_dim" : "batch, heads, tokens, head_dim";
  auto bad = [&](const std::string& why) -> void {
    throw ConfigError(std::string(option) + " '" + text + "': " + why + " (axis names from {" + allowed +
                      "}, comma-separated, outermost first, e.g. '" +
                      (for_attn_output ? "tokens,hidden" : "batch,heads,tokens,head_dim") + "')");
  };
  for (const std::string& raw : split(text, ',')) {
    const std::string name = trim(raw);
    Axis a;
    if (name == "batch") a = Axis::Batch;
    else if (name == "heads") a = Axis::Heads;
    else if (name == "tokens") a = Axis::Tokens;
    else if (name == "head_dim") a = Axis::HeadDim;
    else if (name == "hidden" && for_attn_output) a = Axis::Hidden;
    else {
      std::vector<std::string> names = split(allowed, ',');
      for (std::string& n : names) n = trim(n);
      bad("unknown axis '" + name + "'" + did_you_mean(name, names));
      return L;
    }
    if (L.has(a)) bad(std::string("axis '") + axis_name(a) + "' appears twice");
    L.axes.push_back(a);
  }
  if (for_attn_output) {
    const bool split_heads = L.has(Axis::Heads) || L.has(Axis::HeadDim);
    if (!L.has(Axis::Tokens)) bad("needs a tokens axis");
    if (L.has(Axis::Hidden) && split_heads) bad("has both hidden and heads/head_dim");
    if (!L.has(Axis::Hidden) && !(L.has(Axis::Heads) && L.has(Axis::HeadDim)))
      bad("needs hidden, or both heads and head_dim");
  } else if (!L.has(Axis::Heads) || !L.has(Axis::Tokens) || !L.has(Axis::HeadDim)) {
    bad("needs the axes heads, tokens and head_dim");
  }
  return L;
}

// Reorders a tensor stored with `layout` so that its axes follow `order` (each axis of
// `order` must be in the layout; a batch axis must have size 1 and is dropped).
// `what` names the tensor in errors.
Tensor to_axis_order(Tensor t, const Layout& layout, const std::vector<Axis>& order, const std::string& what) {
  if (t.rank() != static_cast<int>(layout.axes.size()))
    throw Error(what + " has shape " + shape_str(t.shape) + " (rank " + std::to_string(t.rank()) + "), but the layout '" +
                   layout.text + "' names " + std::to_string(layout.axes.size()) + " axes");
  std::vector<int64_t> shape;  // the stored shape without the batch axis
  std::vector<Axis> axes;
  for (size_t i = 0; i < layout.axes.size(); ++i) {
    if (layout.axes[i] == Axis::Batch) {
      if (t.shape[i] != 1)
        throw Error(what + " has batch size " + std::to_string(t.shape[i]) + " (shape " + shape_str(t.shape) + ", layout '" +
                       layout.text + "'); a recording holds one sequence, so the batch axis must have size 1");
      continue;
    }
    shape.push_back(t.shape[i]);
    axes.push_back(layout.axes[i]);
  }
  std::vector<size_t> perm;  // output axis i reads source axis perm[i]
  for (Axis a : order) perm.push_back(static_cast<size_t>(std::find(axes.begin(), axes.end(), a) - axes.begin()));
  std::vector<size_t> identity(perm.size());
  std::iota(identity.begin(), identity.end(), size_t{0});
  if (perm == identity) {  // only the batch axis (if any) goes: no data movement
    t.shape = shape;
    return t;
  }
  const size_t rank = shape.size();
  std::vector<int64_t> src_stride(rank, 1);
  for (size_t a = rank; a-- > 1;) src_stride[a - 1] = src_stride[a] * shape[a];
  std::vector<int64_t> out_shape(rank), out_src_stride(rank);
  for (size_t i = 0; i < rank; ++i) {
    out_shape[i] = shape[perm[i]];
    out_src_stride[i] = src_stride[perm[i]];
  }
  Tensor out(out_shape);
  const int64_t n = out.numel();
  std::vector<int64_t> idx(rank, 0);
  int64_t src = 0;
  for (int64_t j = 0; j < n; ++j) {
    out.data[static_cast<size_t>(j)] = t.data[static_cast<size_t>(src)];
    for (size_t a = rank; a-- > 0;) {  // next output multi-index, last axis fastest
      src += out_src_stride[a];
      if (++idx[a] < out_shape[a]) break;
      src -= out_src_stride[a] * out_shape[a];
      idx[a] = 0;
    }
  }
  return out;
}

constexpr int kNoMatch = -1;
constexpr int kUnreadableLayerNumber = -2;  // leading zeros, or more than 9 digits

// The layer index when `name` is an instance of `pattern` (every "{layer}" replaced by
// the same decimal number), kUnreadableLayerNumber when it would be but a number is not
// written as layer_name() writes it, else kNoMatch.
int match_layer(const std::string& pattern, const std::string& name) {
  static const std::string kToken = "{layer}";
  int layer = -1;
  bool readable = true;
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern.compare(p, kToken.size(), kToken) == 0) {
      const size_t start = n;
      while (n < name.size() && std::isdigit(static_cast<unsigned char>(name[n]))) ++n;
      if (n == start) return kNoMatch;
      if (n - start > 9 || (n - start > 1 && name[start] == '0')) {
        readable = false;
        p += kToken.size();
        continue;
      }
      int v = 0;
      std::from_chars(name.data() + start, name.data() + n, v);
      if (layer >= 0 && v != layer) return kNoMatch;
      layer = v;
      p += kToken.size();
    } else {
      if (n >= name.size() || name[n] != pattern[p]) return kNoMatch;
      ++p;
      ++n;
    }
  }
  if (n != name.size()) return kNoMatch;
  return readable ? layer : kUnreadableLayerNumber;
}

std::string layer_name(const std::string& pattern, int layer) {
  return replace_all(pattern, "layer", std::to_string(layer));
}

// The recording's name: the file stem, or the directory's name for a directory or a
// sharded checkpoint index.
std::string recording_name(const fs::path& path) {
  fs::path p = path;
  if (p.filename().empty()) p = p.parent_path();  // trailing slash
  const std::string file = p.filename().string();
  if (fs::is_directory(p)) return file;
  if (file.ends_with(".index.json")) return p.parent_path().filename().string();
  return p.stem().string();
}

class LayerReader {
 public:
  LayerReader(const TensorStore& store, const RecordingSpec& spec)
      : store_(store),
        where_(store.path().string()),
        qkv_layout_(parse_layout(spec.layout, "layout", false)),
        out_layout_(parse_layout(spec.attn_output_layout, "attn_output_layout", true)) {
    for (const TensorInfo& t : store.list()) names_.push_back(t.name);
  }

  const std::vector<std::string>& names() const { return names_; }

  bool has(const std::string& name) const { return !name.empty() && store_.contains(name); }

  // A float tensor in [heads, tokens, head_dim]. `role` is "query", "key", ... for errors.
  Tensor read_htd(const std::string& pattern, int layer, const char* role) const {
    const std::string name = layer_name(pattern, layer);
    Tensor t = read_float(name, pattern, layer, role);
    return to_axis_order(std::move(t), qkv_layout_, {Axis::Heads, Axis::Tokens, Axis::HeadDim},
                         where_ + ": " + role + " tensor '" + name + "'");
  }

  // attn_output in [tokens, heads*head_dim].
  Tensor read_attn_output(const std::string& pattern, int layer) const {
    const std::string name = layer_name(pattern, layer);
    Tensor t = read_float(name, pattern, layer, "attn_output");
    const std::string what = where_ + ": attn_output tensor '" + name + "'";
    if (out_layout_.has(Axis::Hidden)) return to_axis_order(std::move(t), out_layout_, {Axis::Tokens, Axis::Hidden}, what);
    t = to_axis_order(std::move(t), out_layout_, {Axis::Tokens, Axis::Heads, Axis::HeadDim}, what);
    t.shape = {t.shape[0], t.shape[1] * t.shape[2]};  // [tokens, heads, head_dim] is [tokens, hidden] in memory
    return t;
  }

 private:
  Tensor read_float(const std::string& name, const std::string& pattern, int layer, const char* role) const {
    if (!store_.contains(name))
      fail(where_, "layer " + std::to_string(layer) + " has no " + role + " tensor '" + name + "' (pattern '" +
                       pattern + "')" + nearest_names_hint(name, names_));
    const TensorInfo& inf = store_.info(name);
    if (!dtype_is_float(inf.dtype))
      fail(inf.file, std::string(role) + " tensor '" + name + "' has dtype " + dtype_name(inf.dtype) +
                         "; recording tensors must be floating point (F32, F16, BF16, F64)");
    return store_.read_f32(name);
  }

  const TensorStore& store_;
  std::string where_;
  Layout qkv_layout_, out_layout_;
  std::vector<std::string> names_;
};

// The layers named by the key pattern, numerically sorted, restricted to spec.layers
// (also sorted, duplicates dropped). Without spec.layers they must be 0..N-1.
std::vector<int> select_layers(const LayerReader& reader, const RecordingSpec& spec, const std::string& where) {
  if (spec.key.find("{layer}") == std::string::npos)
    throw ConfigError("key pattern '" + spec.key + "' has no {layer} placeholder");
  std::set<int> found;
  for (const std::string& n : reader.names()) {
    const int l = match_layer(spec.key, n);
    if (l == kUnreadableLayerNumber)
      fail(where, "tensor '" + n + "' matches the key pattern '" + spec.key +
                      "' but its layer number has leading zeros or more than 9 digits; layer numbers are "
                      "read as written without leading zeros ('" + layer_name(spec.key, 1) + "')");
    if (l >= 0) found.insert(l);
  }
  if (found.empty())
    fail(where, "no tensor matches the key pattern '" + spec.key + "'" +
                    nearest_names_hint(layer_name(spec.key, 0), reader.names()));
  std::vector<std::string> have;
  for (int f : found) have.push_back(std::to_string(f));
  if (spec.layers.empty()) {
    // The key pattern alone decides which layers there are; a layer whose query or
    // value is there but whose key is not (misnamed, say 'layers.5.keys') would
    // otherwise be left out without a word when it is the last one.
    for (const auto& [role, pattern] : {std::pair{"query", &spec.query}, std::pair{"value", &spec.value}}) {
      for (const std::string& n : reader.names()) {
        const int l = match_layer(*pattern, n);
        if (l < 0 || found.count(l)) continue;
        const std::string key = layer_name(spec.key, l);
        std::vector<std::string> others;  // what the key may have been named instead: not another layer's key
        for (const std::string& m : reader.names())
          if (match_layer(spec.key, m) == kNoMatch) others.push_back(m);
        fail(where, "layer " + std::to_string(l) + " has a " + role + " tensor '" + n + "' but no key tensor '" + key +
                        "' (key pattern '" + spec.key + "', which matches layers " + join(have, ", ") + ")" +
                        nearest_names_hint(key, others));
      }
    }

    // Discovered by pattern, the layers must be 0..N-1: a gap is a layer the file lost
    // (or a misnamed tensor), not one to skip silently. A subset is loaded by listing it.
    int expected = 0;
    for (int l : found) {
      if (l != expected)
        fail(where, "layer " + std::to_string(expected) + " is missing: the key pattern '" + spec.key +
                        "' matches layers " + join(have, ", ") +
                        " (a recording holds layers 0..N-1; to load some of them, list them in [data] layers)");
      ++expected;
    }
    return {found.begin(), found.end()};
  }
  std::vector<int> chosen;
  for (int l : spec.layers) {
    if (!found.count(l)) {
      fail(where, "layer " + std::to_string(l) + " requested, but the file has layers " + join(have, ", ") +
                      " (from key pattern '" + spec.key + "')");
    }
    chosen.push_back(l);
  }
  std::sort(chosen.begin(), chosen.end());  // file order, whatever order they were listed in
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  return chosen;
}

// Checks one layer's canonical shapes against each other and against the first layer.
void check_layer_shapes(Recording& rec, const LayerTensors& L, int layer, const RecordingSpec& spec,
                        const std::string& where) {
  const std::string lw = where + ": layer " + std::to_string(layer);  // fail() adds ": "
  const std::string qn = "query '" + layer_name(spec.query, layer) + "'";
  const std::string kn = "key '" + layer_name(spec.key, layer) + "'";
  const std::string vn = "value '" + layer_name(spec.value, layer) + "'";
  const auto& q = L.query.shape;
  const auto& k = L.key.shape;
  if (L.value.shape != k)
    fail(lw, vn + " has shape " + shape_str(L.value.shape) + " but " + kn + " has " + shape_str(k) +
                 " ([heads, tokens, head_dim] after layout '" + spec.layout + "')");
  if (q[2] != k[2])
    fail(lw, qn + " has head_dim " + std::to_string(q[2]) + " but " + kn + " has head_dim " + std::to_string(k[2]) +
                 " (shapes " + shape_str(q) + " and " + shape_str(k) + ", [heads, tokens, head_dim])");
  if (q[1] != k[1])
    fail(lw, qn + " has " + std::to_string(q[1]) + " tokens but " + kn + " has " + std::to_string(k[1]) +
                 " (shapes " + shape_str(q) + " and " + shape_str(k) + ", [heads, tokens, head_dim])");
  if (k[0] == 0 || q[0] % k[0] != 0)
    fail(lw, qn + " has " + std::to_string(q[0]) + " heads, not a multiple of the " + std::to_string(k[0]) +
                 " key/value heads of " + kn + " (grouped-query attention needs q_heads = group x kv_heads)");
  if (rec.layers.empty()) {
    rec.q_heads = q[0];
    rec.kv_heads = k[0];
    rec.tokens = q[1];
    rec.head_dim = q[2];
  } else if (q[0] != rec.q_heads || k[0] != rec.kv_heads || q[1] != rec.tokens || q[2] != rec.head_dim) {
    fail(lw, "shapes " + qn + " " + shape_str(q) + " and " + kn + " " + shape_str(k) + " differ from layer " +
                 std::to_string(rec.layer_ids.front()) + "'s [" + std::to_string(rec.q_heads) + "|" +
                 std::to_string(rec.kv_heads) + ", " + std::to_string(rec.tokens) + ", " +
                 std::to_string(rec.head_dim) + "] (q|kv heads, tokens, head_dim)");
  }
  if (!L.key_pre_rope.empty() && L.key_pre_rope.shape != k)
    fail(lw, "key_pre_rope '" + layer_name(spec.key_pre_rope, layer) + "' has shape " +
                 shape_str(L.key_pre_rope.shape) + " but " + kn + " has " + shape_str(k));
  const std::vector<int64_t> out_shape = {q[1], q[0] * q[2]};
  if (!L.attn_output.empty() && L.attn_output.shape != out_shape)
    fail(lw, "attn_output '" + layer_name(spec.attn_output, layer) + "' has shape " + shape_str(L.attn_output.shape) +
                 " (as [tokens, hidden] after layout '" + spec.attn_output_layout + "'), expected " +
                 shape_str(out_shape) + " = [tokens, q_heads*head_dim]");
}

std::vector<int64_t> read_token_ids(const TensorStore& store, const std::string& name, int64_t tokens) {
  const TensorInfo& inf = store.info(name);
  if (dtype_is_float(inf.dtype) || inf.dtype == DType::BOOL)
    fail(inf.file, "token ids tensor '" + name + "' has " + (inf.dtype == DType::BOOL ? "boolean" : "float") +
                       " dtype " + dtype_name(inf.dtype) + "; expected an integer dtype");
  const int64_t n = Tensor::count(inf.shape);
  int64_t non_unit = 0;
  for (int64_t d : inf.shape) non_unit += d != 1;
  if (n != tokens || non_unit > 1)
    fail(inf.file, "token ids tensor '" + name + "' has shape " + shape_str(inf.shape) + ", expected " +
                       std::to_string(tokens) + " ids (shape [" + std::to_string(tokens) + "] or [1, " +
                       std::to_string(tokens) + "])");
  return store.read_i64(name);
}

}  // namespace

void check_layout(const std::string& text, const char* option, bool for_attn_output) {
  (void)parse_layout(text, option, for_attn_output);
}

namespace {

// A recording file opened: its store, reader, selected layers and which optional tensors
// it has (checked for the first selected layer, and by read_layer for the others).
struct OpenRecording {
  std::unique_ptr<TensorStore> store;
  std::string where;
  std::unique_ptr<LayerReader> reader;
  std::vector<int> layers;
  bool pre_rope = false, attn_out = false;
};

OpenRecording open_recording(const RecordingSpec& spec) {
  OpenRecording o;
  o.store = TensorStore::open(spec.path);
  o.where = spec.path.string();
  o.reader = std::make_unique<LayerReader>(*o.store, spec);
  const LayerReader& reader = *o.reader;
  o.layers = select_layers(reader, spec, o.where);
  // Optional tensors must be present for every layer or for none, and where the
  // config names one, present.
  auto require_named = [&](bool required, const std::string& name, const std::string& pattern, const char* key) {
    if (required && !reader.has(name))
      fail(o.where, "no tensor '" + name + "' (data." + key + " = \"" + pattern + "\")" +
                        nearest_names_hint(name, reader.names()));
  };
  require_named(spec.key_pre_rope_required, layer_name(spec.key_pre_rope, o.layers.front()), spec.key_pre_rope,
                "key_pre_rope");
  require_named(spec.attn_output_required, layer_name(spec.attn_output, o.layers.front()), spec.attn_output,
                "attn_output");
  require_named(spec.token_ids_required, spec.token_ids, spec.token_ids, "token_ids");
  o.pre_rope = reader.has(layer_name(spec.key_pre_rope, o.layers.front()));
  o.attn_out = reader.has(layer_name(spec.attn_output, o.layers.front()));
  return o;
}

// Layer l's tensors in canonical order, its shapes checked (check_layer_shapes: the first
// layer read sets rec's dimensions).
LayerTensors read_layer(const OpenRecording& o, const RecordingSpec& spec, int l, Recording& rec) {
  const LayerReader& reader = *o.reader;
  LayerTensors L;
  L.query = reader.read_htd(spec.query, l, "query");
  L.key = reader.read_htd(spec.key, l, "key");
  L.value = reader.read_htd(spec.value, l, "value");
  auto optional = [&](bool wanted, const std::string& pattern, const char* role) {
    const std::string name = layer_name(pattern, l);
    if (reader.has(name) != wanted)
      fail(o.where, std::string(role) + " tensors are present for some layers but not others: layer " +
                        std::to_string(o.layers.front()) + (wanted ? " has " : " lacks ") + "'" +
                        layer_name(pattern, o.layers.front()) + "', layer " + std::to_string(l) +
                        (wanted ? " lacks " : " has ") + "'" + name + "'");
    return wanted;
  };
  if (optional(o.pre_rope, spec.key_pre_rope, "key_pre_rope"))
    L.key_pre_rope = reader.read_htd(spec.key_pre_rope, l, "key_pre_rope");
  if (optional(o.attn_out, spec.attn_output, "attn_output")) L.attn_output = reader.read_attn_output(spec.attn_output, l);
  check_layer_shapes(rec, L, l, spec, o.where);
  return L;
}

// What follows the layers: token ids, positions and the RoPE (rec's dimensions set).
void read_after_layers(const OpenRecording& o, const RecordingSpec& spec, Recording& rec) {
  if (o.reader->has(spec.token_ids)) rec.token_ids = read_token_ids(*o.store, spec.token_ids, rec.tokens);
  rec.positions.resize(static_cast<size_t>(rec.tokens));
  std::iota(rec.positions.begin(), rec.positions.end(), int64_t{0});

  if (o.pre_rope || spec.rope_theta) {
    if (spec.rope_theta) {  // the config's theta: unscaled RoPE
      if (!std::isfinite(*spec.rope_theta) || !(*spec.rope_theta > 0))
        throw ConfigError("[data] rope_theta = " + format_double(*spec.rope_theta) + " for " + o.where +
                          ": must be a finite number > 0");
      rec.rope.theta = *spec.rope_theta;
    } else {  // the file's theta, and its scaled frequencies (`kvbudget record`) if any
      rec.rope = rope_from_metadata(rec.metadata, rec.head_dim, o.where);
    }
    rec.rope.applied = true;
  }
}

}  // namespace

Recording load_recording(const RecordingSpec& spec) {
  const OpenRecording o = open_recording(spec);
  Recording rec;
  rec.name = recording_name(spec.path);
  rec.source = o.where;
  rec.metadata = o.store->metadata();
  for (int l : o.layers) {
    LayerTensors L = read_layer(o, spec, l, rec);
    rec.layers.push_back(std::move(L));
    rec.layer_ids.push_back(l);
  }
  read_after_layers(o, spec, rec);
  if (spec.max_tokens > 0) rec.truncate_tokens(spec.max_tokens);
  rec.validate();
  return rec;
}

struct RecordingFileLayers::State {
  RecordingSpec spec;
  OpenRecording file;
  Recording shapes;  // the untruncated dimensions, with one layer entry (check_layer_shapes compares against it)
  Recording skeleton;
};

RecordingFileLayers::RecordingFileLayers(const RecordingSpec& spec) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.spec = spec;
  s.file = open_recording(spec);
  Recording& rec = s.skeleton;
  rec.name = recording_name(spec.path);
  rec.source = s.file.where;
  rec.metadata = s.file.store->metadata();
  // The dimensions, from the first layer (read once here, then dropped), and what every
  // layer holds (load_recording requires the same tensors of each).
  LayerTensors first = read_layer(s.file, spec, s.file.layers.front(), rec);
  rec.streamed_extras = Recording::HeldExtras{!first.key_pre_rope.empty(), !first.attn_output.empty()};
  for (int l : s.file.layers) {
    rec.layers.emplace_back();
    rec.layer_ids.push_back(l);
  }
  read_after_layers(s.file, spec, rec);
  s.shapes.q_heads = rec.q_heads;
  s.shapes.kv_heads = rec.kv_heads;
  s.shapes.tokens = rec.tokens;
  s.shapes.head_dim = rec.head_dim;
  s.shapes.layer_ids = {s.file.layers.front()};
  s.shapes.layers.resize(1);
  // Truncated as load_recording truncates (no layer holds tensors yet).
  if (spec.max_tokens > 0 && spec.max_tokens < rec.tokens) {
    rec.token_ids.resize(std::min(rec.token_ids.size(), static_cast<size_t>(spec.max_tokens)));
    rec.positions.resize(static_cast<size_t>(spec.max_tokens));
    rec.tokens = spec.max_tokens;
  }
  rec.validate_except_layer_tensors();
  // The first layer's values too, while it is here (Recording::validate_layer: finite,
  // the score bound, RoPE of the pre-RoPE keys against the keys), so that a wrong
  // rope_theta is refused before a streamed run writes anything (the other layers are
  // checked when held).
  Recording one = s.shapes;
  one.name = rec.name;
  one.source = rec.source;
  one.rope = rec.rope;
  one.layers[0] = std::move(first);
  if (spec.max_tokens > 0) one.truncate_tokens(spec.max_tokens);
  one.positions = rec.positions;
  one.validate_layer(0);
}

RecordingFileLayers::~RecordingFileLayers() = default;

Recording RecordingFileLayers::skeleton() const { return state_->skeleton; }

void RecordingFileLayers::load_into(Recording& rec, int64_t i) const {
  State& s = *state_;
  if (i < 0 || i >= static_cast<int64_t>(s.file.layers.size()) || rec.num_layers() != static_cast<int64_t>(s.file.layers.size()))
    throw Error("internal: RecordingFileLayers::load_into: layer " + std::to_string(i) + " of a recording of " +
                std::to_string(rec.num_layers()) + " layers");
  Recording one = s.shapes;  // this layer alone, truncated as load_recording truncates every layer
  one.layers[0] = read_layer(s.file, s.spec, s.file.layers[static_cast<size_t>(i)], one);
  if (s.spec.max_tokens > 0) one.truncate_tokens(s.spec.max_tokens);
  rec.layers[static_cast<size_t>(i)] = std::move(one.layers[0]);
}

}  // namespace kvb
