// kvbudget._core: the library for Python (pybind11). The pure-Python package
// (python/kvbudget/__init__.py) wraps it: DataFrames, TOML from dicts, arrays from
// torch. Errors are the library's exceptions with the CLI's messages:
// kvbudget.ConfigError (a ValueError: bad config, option or input) and kvbudget.Error
// (a RuntimeError: bad data, a failed run).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <exception>
#include <atomic>
#include <cmath>
#include <csignal>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "experiments/crash_marker.h"
#include "experiments/experiment.h"
#include "experiments/frontier.h"
#include "experiments/point_log.h"
#include "experiments/query_positions.h"
#include "experiments/report.h"
#include "experiments/run_state.h"
#include "experiments/runner.h"
#include "kvb/build_config.h"
#include "sim/core/error.h"
#include "sim/core/sgemm.h"
#include "sim/core/strings.h"
#include "sim/formats/prerope_format.h"
#include "sim/formats/registry.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/recording_writer.h"
#include "sim/io/tensor_writer.h"
#include "sim/metrics/metric_table.h"
#include "sim/metrics/model_metrics.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/strategy.h"
#include "sim/model/layer_selection.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"
#include "sim/recording.h"

namespace py = pybind11;

namespace kvb::python {

namespace {

// ---------------------------------------------------------------------------
// The format table
// ---------------------------------------------------------------------------

// One row per example name of each family, then one per preset: name, family, bpe of
// one span of `tokens` x `head_dim` (all metadata counted; NaN where the shape does
// not fit the format), cuda (has a CUDA twin), description (the family's, or what a
// preset reproduces) and canonical (a preset's format; the name itself otherwise).
py::list format_table(int64_t head_dim, int64_t tokens) {
  if (head_dim < 1 || tokens < 1) throw ConfigError("head_dim and tokens must be >= 1");
  if (const std::string why = table_span_error(tokens, head_dim); !why.empty()) throw ConfigError(why);
  py::list rows;
  auto row = [&](const std::string& name, const std::string& family, const std::string& canonical,
                 const std::string& description) {
    const FormatPtr f = make_format(name);
    const bool fits = f->check_shape(tokens, head_dim).empty();
    py::dict r;
    r["name"] = name;
    r["family"] = family;
    r["canonical"] = canonical;
    r["bpe"] = fits ? f->bpe(tokens, head_dim) : NAN;
    r["cuda"] = has_cuda_twin(*f);
    r["keys_only"] = f->keys_only();
    r["description"] = description;
    rows.append(r);
  };
  for (const FormatFamily& fam : format_families())
    for (const FormatExample& ex : fam.examples) row(ex.name, fam.name, ex.name, fam.description);
  for (const FormatAlias& a : format_aliases()) {
    std::string family;
    for (const FormatFamily& fam : format_families())
      if (fam.parse(a.canonical)) family = fam.name;
    row(a.alias, family, a.canonical, a.reproduces);
  }
  return rows;
}

// ---------------------------------------------------------------------------
// quantize
// ---------------------------------------------------------------------------

// A float array quantized and dequantized with one format, as `kvbudget quantize`
// does: rows of the last axis (head_dim), rows_per_span rows per span.
struct Quantized {
  std::string format;
  py::array values;           // dequantized, x's shape and dtype
  py::array_t<uint8_t> codes;  // the stored bit stream (codes with their scales), code_layout describes it
  uint64_t code_bits = 0;
  std::string code_layout;
  uint64_t storage_bits = 0;  // all metadata counted
  double bpe = 0;
  double relative_mse = 0, snr_db = 0, max_abs_error = 0;
  int64_t nonfinite = 0, clipped = 0;  // nonfinite: of `values` as returned (after the cast to x's dtype)
  int64_t spans = 0, rows_per_span = 0;
  std::vector<std::string> warnings;  // as `kvbudget quantize` prints them: non-finite values, and why
};

// A format by name, as `kvbudget quantize --format` reads it: a strategy preset given
// instead (kivi-2) is refused with where it goes (evaluate's strategy=).
FormatPtr quantize_format(const std::string& format) {
  try {
    return make_format(format);
  } catch (const ConfigError& e) {
    throw ConfigError(e.what() + preset_not_format_hint(format, "quantize takes a format (`kvbudget strategies` lists "
                                                                "the preset's formats; kvbudget.evaluate(..., "
                                                                "strategy=\"" + format + "\") applies it)"));
  }
}

// `values` (float32) as `dtype`, without NumPy's overflow warning (the caller counts and
// reports what overflowed).
py::array cast_values(const py::array_t<float>& values, const py::dtype& dtype) {
  py::object quiet = py::module_::import("numpy").attr("errstate")(py::arg("over") = "ignore");
  quiet.attr("__enter__")();
  try {
    py::array cast = values.attr("astype")(dtype);
    quiet.attr("__exit__")(py::none(), py::none(), py::none());
    return cast;
  } catch (...) {  // NumPy's error state goes back as it was whatever astype does
    quiet.attr("__exit__")(py::none(), py::none(), py::none());
    throw;
  }
}

// How many values are finite in `computed` (float32) but not in `returned` (the same
// values cast to another dtype; same size).
int64_t newly_nonfinite(const py::array_t<float>& computed, const py::array& returned) {
  const auto back = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(returned);
  const float* a = computed.data();
  const double* b = back.data();
  int64_t count = 0;
  for (py::ssize_t i = 0; i < computed.size(); ++i) count += std::isfinite(a[i]) && !std::isfinite(b[i]);
  return count;
}

// rows_per_span: std::nullopt = the default (all rows; with pre_rope, the second-to-last
// axis), else >= 1 as `kvbudget quantize --rows-per-span` requires.
Quantized quantize(const py::array& x_in, const std::string& format, const std::string& kind,
                   std::optional<int64_t> rows_per_span_in, uint64_t seed, const std::optional<py::array>& pre_rope_in,
                   double rope_theta) {
  const FormatPtr f = quantize_format(format);
  if (rows_per_span_in && *rows_per_span_in < 1)
    throw ConfigError("rows_per_span must be >= 1 (None: the default), got " + std::to_string(*rows_per_span_in));
  int64_t rows_per_span = rows_per_span_in.value_or(0);
  if (kind != "key" && kind != "value") throw ConfigError("kind must be 'key' or 'value', got '" + kind + "'");
  const py::dtype dtype = x_in.dtype();
  if (dtype.kind() != 'f')
    throw ConfigError("quantize needs a float array (float16, float32 or float64), got dtype " +
                      py::cast<std::string>(dtype.attr("name")));
  if (pre_rope_in && pre_rope_in->dtype().kind() != 'f')
    throw ConfigError("quantize needs pre_rope as a float array (float16, float32 or float64), got dtype " +
                      py::cast<std::string>(pre_rope_in->dtype().attr("name")));
  if (f->keys_only() && kind == "value")
    throw ConfigError("format '" + f->name() + "' stores keys only (a sketch for attention logits); it cannot " +
                      "quantize values (kind = 'value')");
  if (f->reads_pre_rope_keys() && kind == "key" && !pre_rope_in)
    throw ConfigError("format '" + f->name() + "' quantizes keys before RoPE: give pre_rope=, the array of pre-RoPE " +
                      "keys (x's shape), or kind='value'");
  // float32 C-contiguous input is read in place; other dtypes are converted once.
  const auto x = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(x_in);
  if (!x) throw ConfigError("quantize: x cannot be read as a float32 array");
  if (x.ndim() < 1) throw ConfigError("quantize needs at least one axis (x is a scalar)");
  if (x.size() == 0) throw ConfigError("quantize: x is empty");
  const int64_t d = x.shape(x.ndim() - 1), rows = x.size() / d;
  const float* xp = x.data();
  for (int64_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(xp[i])) throw Error("x[flat " + std::to_string(i) + "] is not finite (" + format_double(xp[i]) + ")");
  py::array_t<float, py::array::c_style | py::array::forcecast> pre_rope;
  if (pre_rope_in) {
    pre_rope = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(*pre_rope_in);
    if (!pre_rope || pre_rope.ndim() != x.ndim() ||
        !std::equal(x.shape(), x.shape() + x.ndim(), pre_rope.shape()))
      throw ConfigError("pre_rope must have x's shape");
    const float* pp = pre_rope.data();
    for (int64_t i = 0; i < pre_rope.size(); ++i)
      if (!std::isfinite(pp[i]))
        throw Error("pre_rope[flat " + std::to_string(i) + "] is not finite (" + format_double(pp[i]) + ")");
    if (!(std::isfinite(rope_theta) && rope_theta > 0))
      throw ConfigError("rope_theta must be a finite number > 0, got " + format_double(rope_theta));
    if (rows_per_span <= 0 && x.ndim() >= 2) rows_per_span = x.shape(x.ndim() - 2);
  }
  if (rows_per_span <= 0) rows_per_span = rows;
  if (pre_rope_in && kind == "key") {
    // RoPE at positions 0..rows_per_span-1 of each span must give x from pre_rope:
    // else a prerope: format re-applies another rotation than the keys had.
    SpanInfo base{0, 0, true, 0, seed};
    base.rope_applied = true;
    base.rope_theta = rope_theta;
    check_pre_rope_key_rows(xp, pre_rope.data(), rows, d, rows_per_span, base, "kvbudget.quantize(pre_rope=)",
                            "a wrong rope_theta= (give the model's; a model with RoPE scaling cannot be checked here: "
                            "quantize its recording with kvbudget run), or spans whose rows are not positions 0.." +
                                std::to_string(rows_per_span - 1) + " (rows_per_span=" + std::to_string(rows_per_span) +
                                ": each span restarts at position 0; give the tokens per head, the default)");
  }

  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  py::array_t<float> out(shape);
  float* outp = out.mutable_data();
  BitWriter codes;
  Quantized q;
  q.format = f->name();
  double err2 = 0, norm2 = 0;
  {
    py::gil_scoped_release release;
    const BlasCallScope blas_scope;  // OpenBLAS one thread per call; NumPy's count put back after
    for (int64_t s = 0, r0 = 0; r0 < rows; ++s, r0 += rows_per_span) {
      const int64_t n = std::min(rows_per_span, rows - r0);
      const std::string bad = f->check_shape(n, d);
      if (!bad.empty()) throw ConfigError("format '" + f->name() + "': " + bad);
      SpanInfo span{0, s, kind == "key", 0, seed};
      span.recording = "kvbudget.quantize";
      if (pre_rope_in) {
        span.rope_applied = true;
        span.rope_theta = rope_theta;
        span.key_pre_rope = pre_rope.data() + r0 * d;
        span.key_pre_rope_stride = d;
      }
      const ConstMatView in{xp + r0 * d, n, d, d};
      f->roundtrip(in, MatView{outp + r0 * d, n, d, d}, span);
      f->encode(in, span, codes);
      q.clipped += f->clipped_values(in, span);
      q.storage_bits += f->storage_bits(n, d);
      ++q.spans;
    }
    for (int64_t i = 0; i < rows * d; ++i) {
      const double a = xp[i], b = outp[i];
      if (!std::isfinite(b)) {
        ++q.nonfinite;
        q.max_abs_error = INFINITY;
        continue;
      }
      err2 += (a - b) * (a - b);
      norm2 += a * a;
      q.max_abs_error = std::max(q.max_abs_error, std::fabs(a - b));
    }
  }
  q.rows_per_span = rows_per_span;
  q.relative_mse = q.nonfinite ? INFINITY : (norm2 > 0 ? err2 / norm2 : 0.0);
  q.snr_db = q.nonfinite ? -INFINITY : (err2 > 0 ? 10.0 * std::log10(norm2 / err2) : INFINITY);
  q.bpe = static_cast<double>(q.storage_bits) / static_cast<double>(x.size());
  q.code_bits = codes.bits();  // before the writer moves into the array below
  q.code_layout = f->code_layout() + (q.spans > 1 ? "; spans follow each other in the bit stream" : "");
  // The codes' bytes stay where the format wrote them: the array owns the writer.
  auto* owned = new BitWriter(std::move(codes));
  const py::capsule owner(owned, [](void* p) { delete static_cast<BitWriter*>(p); });
  q.codes = py::array_t<uint8_t>(static_cast<py::ssize_t>(owned->bytes().size()), owned->bytes().data(), owner);
  if (q.nonfinite)
    q.warnings.push_back(std::to_string(q.nonfinite) + " of " + std::to_string(x.size()) +
                         " dequantized values are NaN or infinite: the input overflows " + f->name() +
                         " (e.g. fp16 scales saturate beyond 65504)");
  // Same dtype as x: float32 is returned as computed, others converted back.
  const bool is_float32 = dtype.itemsize() == 4;
  q.values = is_float32 ? py::array(out) : cast_values(out, dtype);
  if (dtype.itemsize() < 4) {
    // A narrower dtype can overflow where float32 did not (float16 beyond 65504): the
    // values returned are the ones counted. (float64 holds every float32.)
    const int64_t overflowed = newly_nonfinite(out, q.values);
    if (overflowed) {
      q.nonfinite += overflowed;
      q.relative_mse = INFINITY;
      q.snr_db = -INFINITY;
      q.max_abs_error = INFINITY;
      q.warnings.push_back(std::to_string(overflowed) + " of " + std::to_string(x.size()) +
                           " dequantized values overflow " + py::cast<std::string>(dtype.attr("name")) +
                           " (x's dtype) and come back infinite; pass x as float32 to keep them");
    }
  }
  return q;
}

// ---------------------------------------------------------------------------
// Recordings
// ---------------------------------------------------------------------------

using RecordingPtr = std::shared_ptr<Recording>;

// A view of a recording's tensor as a NumPy array that keeps the recording alive.
py::object tensor_view(const RecordingPtr& rec, const Tensor& t) {
  if (t.empty()) return py::none();
  std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
  auto* keep = new RecordingPtr(rec);
  py::capsule owner(keep, [](void* p) { delete static_cast<RecordingPtr*>(p); });
  py::array a(py::dtype::of<float>(), shape, t.ptr(), owner);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

// `shown_as`, when given, stands for `path` in errors and as the recording's source
// (recording_from_arrays: a temporary file the caller never sees); `name`, when given,
// is the recording's name (else the file's, as the loader names it).
RecordingPtr load(const std::filesystem::path& path, const std::string& layout, const std::string& query,
                  const std::string& key, const std::string& value, const std::vector<int>& layers,
                  int64_t max_tokens, std::optional<double> rope_theta, const std::string& shown_as,
                  const std::string& name) {
  if (max_tokens < 0)
    throw ConfigError((shown_as.empty() ? std::string("load_recording") : shown_as) +
                      ": max_tokens must be >= 0 (0 keeps every token), got " + std::to_string(max_tokens));
  RecordingSpec spec;
  spec.path = path;
  spec.layout = layout;
  spec.query = query;
  spec.key = key;
  spec.value = value;
  spec.layers = layers;
  spec.max_tokens = max_tokens;
  spec.rope_theta = rope_theta;
  py::gil_scoped_release release;
  const BlasCallScope blas_scope;  // OpenBLAS one thread per call; NumPy's count put back after
  if (shown_as.empty()) {
    auto rec = std::make_shared<Recording>(load_recording(spec));
    if (!name.empty()) rec->name = name;
    return rec;
  }
  auto shown = [&](const std::string& message) {
    std::string out = message;
    const std::string hidden = path.string();
    for (size_t at = out.find(hidden); at != std::string::npos; at = out.find(hidden, at + shown_as.size()))
      out.replace(at, hidden.size(), shown_as);
    return out;
  };
  try {
    auto rec = std::make_shared<Recording>(load_recording(spec));
    rec->source = shown_as;
    if (!name.empty()) rec->name = name;
    return rec;
  } catch (const ConfigError& e) {
    throw ConfigError(shown(e.what()));
  } catch (const Error& e) {
    throw Error(shown(e.what()));
  }
}

// Writes tensors {name: array} as one safetensors file (the package's way of handing
// arrays to the recording loader with its layouts and checks): integer arrays (token
// ids) as I64, every other array as F32.
void write_safetensors_dict(const std::filesystem::path& path, const py::dict& tensors,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<py::array_t<float, py::array::c_style | py::array::forcecast>> keep_floats;
  std::vector<py::array_t<int64_t, py::array::c_style | py::array::forcecast>> keep_ints;
  std::vector<TensorToWrite> named;
  keep_floats.reserve(tensors.size());
  keep_ints.reserve(tensors.size());
  for (const auto& [key, value] : tensors) {
    const std::string name = py::cast<std::string>(key);
    const py::array given = py::array::ensure(value);
    if (given && (given.dtype().kind() == 'i' || given.dtype().kind() == 'u')) {
      auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(given);
      if (!a) throw ConfigError("tensor '" + name + "' cannot be read as an int64 array");
      named.push_back(TensorToWrite::of_ints(name, std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), a.data()));
      keep_ints.push_back(std::move(a));
      continue;
    }
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(value);
    if (!a) throw ConfigError("tensor '" + name + "' cannot be read as a float32 array");
    named.push_back(TensorToWrite::of_floats(name, std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), a.data()));
    keep_floats.push_back(std::move(a));
  }
  write_safetensors(path, named, metadata);
}

// A tensor of a float array's shape and values (any float dtype, converted to float32
// once); `what` names it in errors.
Tensor tensor_from_array(const py::handle& value, const std::string& what) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(value);
  if (!a) throw ConfigError(what + " cannot be read as a float32 array");
  Tensor t(std::vector<int64_t>(a.shape(), a.shape() + a.ndim()));
  std::copy(a.data(), a.data() + a.size(), t.ptr());
  return t;
}

// A Recording from per-layer arrays already in the canonical layout (what the PyTorch
// recorder captured): layers[l] = {"query": [q_heads, T, d], "key", "value":
// [kv_heads, T, d], optionally "key_pre_rope" [kv_heads, T, d] and "attn_output"
// [T, q_heads * d]}; token_ids [T] or empty; RoPE as the model applied it (theta, and
// inv_freq when they are not theta's); metadata as `kvbudget record` writes it. Checked
// as a loaded recording is (shapes, GQA, finite values); rec.save() writes the file.
RecordingPtr recording_from_layers(const py::list& layers, const std::vector<int64_t>& token_ids, bool rope_applied,
                                   double rope_theta, const std::vector<float>& rope_inv_freq,
                                   const std::map<std::string, std::string>& metadata, const std::string& name,
                                   const std::string& source) {
  auto rec = std::make_shared<Recording>();
  rec->name = name;
  rec->source = source;
  rec->metadata = metadata;
  if (layers.empty()) throw ConfigError("recording_from_layers: no layers");
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto parts = py::cast<py::dict>(layers[l]);
    const std::string where = "layer " + std::to_string(l) + " ";
    LayerTensors L;
    for (const auto& [key, value] : parts) {
      const std::string part = py::cast<std::string>(key);
      Tensor* slot = part == "query" ? &L.query : part == "key" ? &L.key : part == "value" ? &L.value
                   : part == "key_pre_rope" ? &L.key_pre_rope : part == "attn_output" ? &L.attn_output : nullptr;
      if (!slot)
        throw ConfigError(where + "has a tensor '" + part +
                          "'; expected query, key, value, key_pre_rope, attn_output");
      if (!value.is_none()) *slot = tensor_from_array(value, where + part);
    }
    for (const auto& [part, t] : {std::pair{"query", &L.query}, std::pair{"key", &L.key}, std::pair{"value", &L.value}})
      if (t->rank() != 3) throw ConfigError(where + part + " has shape " + shape_str(t->shape) + ", expected [heads, tokens, head_dim]");
    rec->layers.push_back(std::move(L));
    rec->layer_ids.push_back(static_cast<int>(l));
  }
  const LayerTensors& first = rec->layers.front();
  rec->q_heads = first.query.dim(0);
  rec->kv_heads = first.key.dim(0);
  rec->tokens = first.query.dim(1);
  rec->head_dim = first.query.dim(2);
  rec->token_ids = token_ids;
  rec->positions.resize(static_cast<size_t>(rec->tokens));
  std::iota(rec->positions.begin(), rec->positions.end(), int64_t{0});
  rec->rope.applied = rope_applied;
  rec->rope.theta = rope_theta;
  rec->rope.inv_freq = rope_inv_freq;
  for (const LayerTensors& L : rec->layers)
    if (L.key_pre_rope.empty() != first.key_pre_rope.empty() || L.attn_output.empty() != first.attn_output.empty())
      throw ConfigError("key_pre_rope and attn_output must be given for every layer or for none");
  rec->validate();
  return rec;
}

// The checkpoint (its load warnings printed) and the tokens to run it on, read as the
// CLI's record and eval read them (one of text or token_file).
std::pair<std::shared_ptr<const Transformer>, std::vector<int64_t>> load_model_and_tokens(
    const std::string& checkpoint, const std::string& text, const std::string& token_file,
    const std::string& tokenizer, std::optional<bool> bos, int64_t max_tokens) {
  const std::shared_ptr<const Transformer> model = Transformer::load(checkpoint);
  for (const std::string& w : model->load_warnings()) std::fprintf(stderr, "kvbudget: warning: %s\n", w.c_str());
  TokenSource src;
  src.text = text;
  src.token_file = token_file;
  src.tokenizer = tokenizer;
  src.add_bos = bos;
  src.max_tokens = max_tokens;
  const std::vector<int64_t> tokens = load_tokens(src, model->config());
  return {model, tokens};
}

// `kvbudget record`: runs checkpoint `checkpoint` on a text (or token ids) and returns
// what attention consumed in every layer; metadata "nll_mean" is the exact run's mean
// next-token NLL (nats).
RecordingPtr record(const std::string& checkpoint, const std::string& text, const std::string& token_file,
                    const std::string& tokenizer, std::optional<bool> bos, int64_t max_tokens) {
  if (text.empty() == token_file.empty()) throw ConfigError("give exactly one of text and tokens");
  if (!token_file.empty() && (tokenizer != "bytes" || bos.has_value()))
    throw ConfigError("tokenizer and bos apply to text only");
  if (max_tokens < 0) throw ConfigError("max_tokens must be >= 0");
  py::gil_scoped_release release;
  const BlasCallScope blas_scope;  // OpenBLAS one thread per call; NumPy's count put back after
  const auto [model, tokens] = load_model_and_tokens(checkpoint, text, token_file, tokenizer, bos, max_tokens);
  const std::string warning = model->config().context_warning(static_cast<int64_t>(tokens.size()));
  if (!warning.empty()) std::fprintf(stderr, "kvbudget: warning: %s\n", warning.c_str());
  RecordedRun run = record_exact_run(*model, tokens, checkpoint, text.empty() ? token_file : text);
  auto rec = std::make_shared<Recording>(std::move(run.recording));
  return rec;
}

// A strategy's parameters from Python values {name: value}, over its defaults and
// its preset's values, checked against the type's definitions (as `kvbudget eval
// --param` reads them from text).
Params strategy_params(const StrategyType& type, const StrategyPreset* preset, const py::dict& given) {
  std::vector<ParamAssignment> typed;
  for (const auto& [k, v] : given) {
    const std::string name = py::cast<std::string>(k);
    py::object value = py::reinterpret_borrow<py::object>(v);
    auto read = [name, value](const ParamDef& def) -> ParamValue {
      try {
        switch (def.type) {
          case ParamType::Bool: return py::cast<bool>(value);
          case ParamType::Int: return py::cast<int64_t>(value);
          case ParamType::Real: return py::cast<double>(value);
          case ParamType::String: return py::cast<std::string>(value);
          case ParamType::IntList: return py::cast<IntList>(value);
        }
      } catch (const py::cast_error&) {
      }
      throw ConfigError("params['" + name + "']: expected a " + std::string(param_type_name(def.type)) + ", got " +
                        std::string(py::str(value)));
    };
    typed.push_back({name, "", read});
  }
  return resolve_strategy_params(type, preset, typed,
                                 [](const std::string& name) { return "params['" + name + "']"; });
}

py::array_t<float> matrix_array(const RowMatrix& m) {
  py::array_t<float> a({static_cast<py::ssize_t>(m.rows()), static_cast<py::ssize_t>(m.cols())});
  std::copy(m.data(), m.data() + m.size(), a.mutable_data());
  return a;
}

// `kvbudget eval`: the exact run of a checkpoint on a text, and with a plan (one
// format, a key and a value format, or a strategy with its parameters) the quantized
// run compared with it: the model metrics of the metric table with their standard
// errors, the logits and per-position NLL of both runs.
py::dict evaluate(const std::string& checkpoint, const std::string& text, const std::string& token_file,
                  const std::string& tokenizer, std::optional<bool> bos, int64_t max_tokens, const std::string& format,
                  const std::string& key_format, const std::string& value_format, const std::string& strategy_in,
                  const py::dict& params, uint64_t seed, const ContinuationSpec& cont, int64_t ctx,
                  const std::string& score_text, const std::string& quantize_layers,
                  const std::string& other_layers_format, double base_memory_mib) {
  const int quant_choices = (format.empty() ? 0 : 1) + (key_format.empty() && value_format.empty() ? 0 : 1) +
                            (strategy_in.empty() ? 0 : 1);
  if (quant_choices > 1) throw ConfigError("give one of format, key_format/value_format and strategy");
  if (key_format.empty() != value_format.empty()) throw ConfigError("key_format and value_format go together");
  if (py::len(params) && strategy_in.empty()) throw ConfigError("params needs strategy");
  if (cont.count < 0 || cont.prompt < 1 || cont.tokens < 1)
    throw ConfigError("continuations must be >= 0, continuation_prompt and continuation_tokens >= 1");
  if (text.empty() == token_file.empty()) throw ConfigError("give exactly one of text and tokens");
  if (max_tokens < 0) throw ConfigError("max_tokens must be >= 0");
  if (ctx < 0 || ctx == 1) throw ConfigError("ctx must be 0 (one window of every token) or >= 2, got " + std::to_string(ctx));
  const ScoreRule score = parse_score_rule(score_text, "score");
  if (score == ScoreRule::SecondHalf && ctx == 0) throw ConfigError("score=\"second_half\" needs windows (ctx > 0)");
  if (!(base_memory_mib >= 0) || base_memory_mib > 1e12)
    throw ConfigError("base_memory_mib must be a number of MiB >= 0, got " + format_double(base_memory_mib));
  std::unique_ptr<Strategy> strat;
  std::string plan_source = "exact";
  py::dict given = params;
  std::string strategy = strategy_in;
  if (!format.empty()) {
    strategy = "uniform";
    given = py::dict(py::arg("format") = format);
  } else if (!key_format.empty()) {
    strategy = "uniform";
    given = py::dict(py::arg("key_format") = key_format, py::arg("value_format") = value_format);
  }
  std::string budget_param;  // a budget the strategy meets over every layer, when given
  if (!strategy.empty()) {
    const NamedStrategy named = resolve_strategy_name(strategy, "strategy", "format =");
    try {
      const Params resolved = strategy_params(*named.type, named.preset, given);
      for (const char* budget : {"budget_bpe", "key_budget_bpe", "value_budget_bpe"})
        if (budget_param.empty() && resolved.has(budget)) budget_param = budget;
      strat = named.type->make(resolved);
    } catch (const ConfigError& e) {
      // A format argument naming a strategy preset (format="kivi-2"): say where it goes,
      // as `kvbudget eval --format kivi-2` does with --strategy.
      std::string hint;
      for (const std::string& value : {format, key_format, value_format})
        if (hint.empty() && !value.empty()) hint = preset_not_format_hint(value, "give strategy=\"" + value + "\"");
      if (hint.empty()) throw;
      throw ConfigError(e.what() + hint);
    }
    std::vector<std::string> parts;
    for (const auto& [k, v] : given) parts.push_back(py::cast<std::string>(k) + "=" + std::string(py::str(v)));
    plan_source = strategy + "(" + join(parts, ",") + ")";
  }
  // Only some layers quantized, as a config's [data] quantize_layers and
  // other_layers_format (and `kvbudget eval --layers`), checked before the weights load.
  if (!other_layers_format.empty() && quantize_layers.empty())
    throw ConfigError("other_layers_format: only used with quantize_layers");
  std::vector<int64_t> quantized_layers;
  FormatPtr other_layers;
  if (!quantize_layers.empty()) {
    if (!strat) throw ConfigError("quantize_layers needs a plan: give format, key_format/value_format or strategy");
    const std::string kept = other_layers_format.empty() ? kDefaultKeptLayerFormat : other_layers_format;
    if (!budget_param.empty())
      throw ConfigError("quantize_layers with " + budget_param +
                        ": the strategy meets its budget over every layer, which quantize_layers would break by "
                        "storing the others at " + kept + "; give a fixed format");
    try {
      other_layers = make_format(kept);
    } catch (ConfigError& e) {
      e.add_context("other_layers_format");
      throw;
    }
    quantized_layers = parse_layer_selection(quantize_layers, load_model_config(checkpoint), "quantize_layers");
    plan_source += " on layers " + format_layer_list(quantized_layers) + " (others " + other_layers->name() + ")";
  }
  py::dict out;
  py::gil_scoped_release release;
  const BlasCallScope blas_scope;  // OpenBLAS one thread per call; NumPy's count put back after
  const auto [model, tokens] = load_model_and_tokens(checkpoint, text, token_file, tokenizer, bos, max_tokens);
  const std::string source = "model " + checkpoint + " on " + std::to_string(tokens.size()) + " tokens";
  // Windows of `ctx` tokens as `kvbudget eval --ctx` runs them (the recording and the
  // calibration positions are the first window's).
  ModelEvalOptions eval_options;
  eval_options.windows = WindowSpec{ctx, score};
  eval_options.max_held_base_bytes = static_cast<int64_t>(base_memory_mib * 1024.0 * 1024.0);
  const ModelEvaluator evaluator(model, tokens, cont, source, nullptr, eval_options);
  RowMatrix quant_logits;
  ErrorStats stats;
  std::string plan_text;
  double plan_bpe = 16;
  if (strat) {
    CalibratedPlan built = build_calibrated_plan(*strat, evaluator.recording(), seed, plan_source);
    if (other_layers) {
      quantize_only_layers(built.plan, quantized_layers, other_layers);
      const std::string bad = built.plan.check();
      if (!bad.empty()) throw Error(plan_source + ": invalid plan: " + bad);
    }
    plan_text = built.plan.describe();
    plan_bpe = built.plan.bpe();
    // The quantized logits [T, vocab] are returned only when the exact ones are held (at
    // most base_memory_mib): a longer run is compared a window at a time and returns neither.
    stats.model = evaluator.evaluate(built.plan, seed, evaluator.base_logits_held() ? &quant_logits : nullptr,
                                     built.calibrated ? &built.positions.evaluation : nullptr);
  }
  py::gil_scoped_acquire acquire;
  const std::vector<double> exact_nll = evaluator.base_scored_nll();
  const double exact_ppl = perplexity(exact_nll);
  out["tokens"] = tokens;
  out["windows"] = evaluator.windows().size();
  out["exact_ppl"] = exact_ppl;
  out["exact_ppl_se"] = exact_ppl * standard_error_of_mean(exact_nll);
  // None when the exact logits exceed the held limit (they were kept in a temporary file).
  out["exact_logits"] = evaluator.base_logits_held() ? py::object(matrix_array(evaluator.base_logits())) : py::none();
  out["exact_nll"] = exact_nll;
  out["plan"] = plan_source;
  if (strat) {
    out["plan_formats"] = plan_text;
    out["bpe"] = plan_bpe;
    py::dict metrics, errors;
    for (const MetricDef& m : metric_table()) {
      // Task metrics (answer_accuracy, flips_*) need a task's problems, which evaluate()
      // has not: left out, as `kvbudget eval --json` leaves them out.
      if (m.level != MetricLevel::Model || !m.defined_for(cont.count, cont.tokens) || m.needs_task) continue;
      metrics[m.name.c_str()] = m.compute(stats);
      if (m.standard_error) errors[m.name.c_str()] = m.standard_error(stats);
    }
    out["metrics"] = metrics;
    out["standard_errors"] = errors;
    out["logits"] = evaluator.base_logits_held() ? py::object(matrix_array(quant_logits)) : py::none();
    out["nll"] = stats.model.nll;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Experiments
// ---------------------------------------------------------------------------

// The stop flag of the run in progress: SIGINT, SIGTERM and SIGHUP set it while run()
// runs, as they stop `kvbudget run` (the previous handlers, Python's, are restored
// afterwards), and g_stop_signal says which. Once everything finished is written, a
// SIGINT raises KeyboardInterrupt; a SIGTERM or SIGHUP is raised again
// (pass_on_stop_signal).
std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal{0};
extern "C" void on_interrupt(int sig) {
  g_stop_signal.store(sig);
  g_stop.store(true);
}

// After a run stopped by SIGTERM or SIGHUP (its files written, the previous handlers
// back): the signal again, so that what the process had for it happens: by default the
// process ends as killed by it (Slurm's pre-emption, a shell's kill); a Python handler
// runs, and an exception it raises propagates. SIGINT is left to run()'s
// KeyboardInterrupt.
void pass_on_stop_signal(int sig) {
  if (sig != SIGTERM && sig != SIGHUP) return;
  std::raise(sig);
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

struct RunOptions {
  std::vector<std::string> overrides;  // "data.max_tokens=128", as --set
  std::vector<std::string> budgets;    // as --budget
  int threads = 0;
  std::string out;
  std::string backend;
  std::optional<bool> plots;
  bool quiet = false;
  std::string shard;
  std::string resume;
  std::string command_line;
  std::string precision;  // as --precision
};

py::dict run(const std::string& config, bool config_is_text, const RunOptions& o) {
  if (o.threads < 0 || o.threads > kMaxThreads)
    throw ConfigError("threads must be between 0 (all cores) and " + std::to_string(kMaxThreads) + ", got " +
                      std::to_string(o.threads));
  RunRequest request;
  if (!config_is_text && config.empty() && !o.resume.empty()) {
    // The resumed folder's config.toml, its relative data paths from the folder of the
    // config the run was started from (experiments/run_state.h).
    request.spec = load_results_config(o.resume, o.overrides);
  } else {
    std::shared_ptr<ConfigDoc> doc = config_is_text ? ConfigDoc::parse(config, "<config>") : ConfigDoc::load(config);
    for (const std::string& s : o.overrides) doc->apply_override(s);
    request.spec = parse_experiment(doc);
  }
  ExperimentSpec& spec = request.spec;
  for (const std::string& b : o.budgets) add_budget_query(spec, b, "budgets");
  if (o.threads > 0) spec.threads = o.threads;
  if (!o.out.empty()) {
    spec.output.dir = o.out;
    spec.output.dir_where = "out";
  }
  if (!o.backend.empty()) spec.backend = parse_backend_request(o.backend, "backend");
  if (!o.precision.empty()) spec.precision = parse_matmul_precision(o.precision, "precision");
  if (!o.backend.empty() || !o.precision.empty())
    check_precision_backend(spec.precision, spec.backend, o.precision.empty() ? "backend" : "precision");
  const bool no_plots = o.plots.has_value() && !*o.plots;
  if (no_plots) spec.output.plots = false;
  if (o.plots.has_value() && *o.plots) spec.output.plots = true;
  record_run_options(spec, RunOptionsInConfig{o.threads, o.out, o.backend, no_plots, o.budgets, o.precision});
  if (!o.shard.empty()) request.shard = parse_shard(o.shard, "shard");
  request.resume_dir = o.resume;
  request.quiet = o.quiet;
  request.command_line = o.command_line;
  g_stop.store(false);
  g_stop_signal.store(0);
  request.stop = &g_stop;
  // As `kvbudget run`: SIGINT and SIGTERM always stop the run; a SIGHUP that nohup set
  // to be ignored stays ignored.
  std::unique_ptr<ScopedSignalHandlers> interrupt, hangup;
  request.on_phase = [&](RunPhase phase) {
    if (phase == RunPhase::Loading) {
      interrupt = std::make_unique<ScopedSignalHandlers>(std::vector<int>{SIGINT, SIGTERM}, on_interrupt, false);
      hangup = std::make_unique<ScopedSignalHandlers>(std::vector<int>{SIGHUP}, on_interrupt, true);
    }
  };
  RunOutcome outcome;
  std::string interrupted_while_loading;
  std::exception_ptr failure;  // rethrown once a stop signal received meanwhile is passed on
  {
    py::gil_scoped_release release;
    const BlasCallScope blas_scope;  // OpenBLAS one thread per call; NumPy's count put back after
    try {
      outcome = run_experiment(request);
    } catch (const RunInterrupted& e) {
      interrupted_while_loading = e.what();
    } catch (...) {
      failure = std::current_exception();
    }
    interrupt.reset();  // Python's own handlers again
    hangup.reset();
  }
  pass_on_stop_signal(g_stop_signal.load());
  if (failure) std::rethrow_exception(failure);
  if (!interrupted_while_loading.empty()) {
    PyErr_SetString(PyExc_KeyboardInterrupt, ("kvbudget.run " + interrupted_while_loading).c_str());
    throw py::error_already_set();
  }
  size_t failed_shown = 0;
  py::list point_errors;
  for (const PointResult& r : outcome.results)
    if (!r.ok && failed_shown++ < 5) point_errors.append(r.error);
  py::dict out;
  out["dir"] = outcome.dir;
  out["status"] = outcome.status;
  out["points"] = outcome.points;
  out["measured"] = outcome.results.size() - outcome.failed;
  out["failed"] = outcome.failed;
  out["interrupted"] = outcome.interrupted;
  out["signal"] = g_stop_signal.load();  // what stopped an interrupted run (SIGINT, or a handled SIGTERM / SIGHUP)
  out["run_errors"] = outcome.run_errors;
  out["point_errors"] = point_errors;
  out["plot_error"] = outcome.plot_error;
  out["plots_written"] = outcome.plots_written;
  out["frontier"] = outcome.frontier;
  out["wall_seconds"] = outcome.wall_seconds;
  out["lost_points_csv"] = outcome.lost_points_csv;
  return out;
}

// Answers a budget query over rows given as columns {name: values} (a results
// folder's points.csv): [(metric, row index or None)], as budgets.json picks. Only the
// picks, for a folder without results.jsonl (budget_answer gives the whole answer).
py::list budget_picks(const std::string& text, const std::map<std::string, std::vector<double>>& columns,
                      const std::vector<std::string>& pareto, const std::string& memory) {
  FrontierInput in;
  in.memory = memory;
  in.pareto_metrics = pareto;
  const std::vector<std::string>& memory_names = memory_columns();
  for (const auto& [name, values] : columns) {
    if (std::find(memory_names.begin(), memory_names.end(), name) != memory_names.end()) {
      frontier_memory_column(in, name) = values;
    } else {
      in.metric_names.push_back(name);
      in.metric_values.push_back(values);
    }
  }
  const BudgetAnswer answer = answer_budget(parse_budget_query(text, "budget"), in);
  py::list picks;
  for (const BudgetAnswer::Pick& p : answer.picks)
    picks.append(py::make_tuple(p.metric, p.index ? py::cast(*p.index) : py::object(py::none())));
  return picks;
}

// The answer to a budget query over a results folder's points, exactly as budgets.json
// gives one (its object for the query: {"query", "kind", "answers": [...]}, as JSON
// text), whether or not the run asked it. The folder's config.toml (as the run resolved
// it) and results.jsonl (every point's result with its intervals and block sums, as
// `kvbudget merge` reads them back) go through the report code of a run
// (Report::frontier, with the query as the only one; nothing is written): each pick's
// interval, meets_bound_for_certain,
// cheaper_within_uncertainty and least_memory_for_certain (an error budget),
// indistinguishable (a memory budget, by the paired bootstrap), and its extrapolation
// on the memory column the query used are the CLI's. ConfigError for a query the run
// cannot answer (bad syntax, a metric it did not measure); {"config_unreadable": why}
// when the folder's config cannot be read (its data moved); Error for a folder without
// results.jsonl or whose config.toml expands to other points than it measured.
std::string budget_answer(const std::filesystem::path& dir, const std::string& query) {
  const std::filesystem::path log = dir / kPointLogFile;
  if (!std::filesystem::is_regular_file(log))
    throw Error(log.string() + ": missing: the points' intervals and block sums behind a budget answer's "
                "uncertainty are read from it (a folder of an older kvbudget: rerun it)");
  // Relative data paths as the run found them. Reading the config needs its data files
  // (a glob's sequences, a model's config.json); when they moved (results copied off a
  // cluster), {"config_unreadable": why}: Result.budget() then answers from points.csv.
  ExperimentSpec spec;
  try {
    spec = load_results_config(dir, {});
  } catch (const std::exception& e) {
    return nlohmann::json{{"config_unreadable", e.what()}}.dump();
  }
  const BudgetQuery q = parse_budget_query(query, "budget");
  const std::vector<std::string>& reported = spec.metrics.report;
  if (!q.memory && std::find(reported.begin(), reported.end(), q.lhs) == reported.end())
    throw ConfigError("budget: budget query '" + query + "': " + dir.string() + " did not measure " + q.lhs +
                      " (its metrics.report: " + join(reported, ", ") + "); rerun with the query in [budgets] or "
                      "--budget, which measures it");
  if (q.memory && spec.metrics.pareto.empty())
    throw ConfigError("budget: budget query '" + query + "' asks for the least error within a memory budget, for "
                      "each metrics.pareto metric, but the run's metrics.pareto is empty");
  spec.budgets = {q};
  const std::vector<SweepPoint> points = expand_sweep(spec);
  std::vector<PointResult> results;
  for (PointLogEntry& e : read_point_log(log)) {
    if (e.result.id >= points.size() || points[e.result.id].key != e.key)
      throw Error(log.string() + ":" + std::to_string(e.line) + ": point " + std::to_string(e.result.id) + " is " +
                  e.key + ", but " + (dir / "config.toml").string() + " expands it to " +
                  (e.result.id < points.size() ? points[e.result.id].key : std::string("no point")));
    results.push_back(std::move(e.result));
  }
  const Report::Frontier frontier = Report(spec, points, dir).frontier(results);
  return nlohmann::json::parse(frontier.budgets_json).at(0).dump();
}

}  // namespace

}  // namespace kvb::python

using namespace kvb;
using namespace kvb::python;

PYBIND11_MODULE(_core, m) {
  m.doc() = "kvbudget's library: formats, quantize, recordings, experiment runs";
  // The source tree this module was built from (configs/, data/): where kvbudget.source_dir()
  // and a config's relative data paths look last, as the CLI's do.
  m.attr("source_dir") = std::string(KVB_SOURCE_DIR);
  // The relative L2 error RoPE(key_pre_rope) vs key that recordings may carry (the
  // loader's check_pre_rope_keys; TorchRecorder checks its captures against the same bound).
  m.attr("PRE_ROPE_KEY_TOLERANCE") = kPreRopeKeyTolerance;
  static py::exception<ConfigError> config_error(m, "ConfigError", PyExc_ValueError);
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      PyErr_SetString(config_error.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  m.def("format_table", &format_table, py::arg("head_dim") = 128, py::arg("tokens") = 4096);

  py::class_<Quantized>(m, "Quantized")
      .def_readonly("format", &Quantized::format)
      .def_readonly("values", &Quantized::values)
      .def_readonly("codes", &Quantized::codes)
      .def_readonly("code_bits", &Quantized::code_bits)
      .def_readonly("code_layout", &Quantized::code_layout)
      .def_readonly("storage_bits", &Quantized::storage_bits)
      .def_readonly("bpe", &Quantized::bpe)
      .def_readonly("relative_mse", &Quantized::relative_mse)
      .def_readonly("snr_db", &Quantized::snr_db)
      .def_readonly("max_abs_error", &Quantized::max_abs_error)
      .def_readonly("nonfinite", &Quantized::nonfinite)
      .def_readonly("clipped", &Quantized::clipped)
      .def_readonly("spans", &Quantized::spans)
      .def_readonly("rows_per_span", &Quantized::rows_per_span)
      .def_readonly("warnings", &Quantized::warnings)
      .def("__repr__", [](const Quantized& q) {
        return "<Quantized " + q.format + ": " + format_double(q.bpe) + " bpe, relative_mse " +
               format_double(q.relative_mse) + ">";
      });
  m.def("quantize", &quantize, py::arg("x"), py::arg("format"), py::arg("kind") = "key",
        py::arg("rows_per_span") = py::none(), py::arg("seed") = 0, py::arg("pre_rope") = py::none(),
        py::arg("rope_theta") = 10000.0);

  py::class_<Recording, RecordingPtr>(m, "Recording")
      .def_readonly("name", &Recording::name)
      .def_readonly("source", &Recording::source)
      .def_readonly("q_heads", &Recording::q_heads)
      .def_readonly("kv_heads", &Recording::kv_heads)
      .def_readonly("head_dim", &Recording::head_dim)
      .def_readonly("tokens", &Recording::tokens)
      .def_readonly("layer_ids", &Recording::layer_ids)
      .def_readonly("token_ids", &Recording::token_ids)
      .def_readonly("positions", &Recording::positions)
      .def_readonly("metadata", &Recording::metadata)
      .def_property_readonly("num_layers", &Recording::num_layers)
      .def_property_readonly("rope_applied", [](const Recording& r) { return r.rope.applied; })
      .def_property_readonly("rope_theta", [](const Recording& r) { return r.rope.theta; })
      .def("summary", &Recording::summary)
      .def(
          "layer",
          [](const RecordingPtr& r, int64_t i) {
            if (i < 0 || i >= r->num_layers())
              throw py::index_error("layer " + std::to_string(i) + " of " + std::to_string(r->num_layers()));
            const LayerTensors& L = r->layers[static_cast<size_t>(i)];
            py::dict d;
            d["query"] = tensor_view(r, L.query);
            d["key"] = tensor_view(r, L.key);
            d["value"] = tensor_view(r, L.value);
            d["key_pre_rope"] = tensor_view(r, L.key_pre_rope);
            d["attn_output"] = tensor_view(r, L.attn_output);
            return d;
          },
          py::arg("index"))
      .def(
          "save",
          [](const Recording& r, const std::filesystem::path& path, const std::string& dtype) {
            if (path.extension() != ".safetensors")
              throw ConfigError(path.string() + ": a recording is written as .safetensors");
            const auto d = dtype_from_name(dtype);
            if (!d || (*d != DType::F32 && *d != DType::F16 && *d != DType::BF16))
              throw ConfigError("dtype must be F32, F16 or BF16, got '" + dtype + "'");
            py::gil_scoped_release release;
            const BlasCallScope blas_scope;  // OpenBLAS one thread per call; NumPy's count put back after
            write_recording(path, r, *d);
          },
          py::arg("path"), py::arg("dtype") = "F32")
      .def("__repr__", [](const Recording& r) { return "<Recording " + r.name + ": " + r.summary() + ">"; });
  m.def("load_recording", &load, py::arg("path"), py::arg("layout") = "heads,tokens,head_dim",
        py::arg("query") = "layers.{layer}.query", py::arg("key") = "layers.{layer}.key",
        py::arg("value") = "layers.{layer}.value", py::arg("layers") = std::vector<int>{},
        py::arg("max_tokens") = 0, py::arg("rope_theta") = py::none(), py::arg("shown_as") = "",
        py::arg("name") = "");
  m.def("record", &record, py::arg("checkpoint"), py::arg("text") = "", py::arg("tokens") = "",
        py::arg("tokenizer") = "bytes", py::arg("bos") = py::none(), py::arg("max_tokens") = 512);
  m.def(
      "evaluate",
      [](const std::string& checkpoint, const std::string& text, const std::string& tokens, const std::string& tokenizer,
         std::optional<bool> bos, int64_t max_tokens, const std::string& format, const std::string& key_format,
         const std::string& value_format, const std::string& strategy, const py::dict& params, uint64_t seed,
         int64_t continuations, int64_t continuation_prompt, int64_t continuation_tokens, int64_t ctx,
         const std::string& score, const std::string& quantize_layers, const std::string& other_layers_format,
         double base_memory_mib) {
        return evaluate(checkpoint, text, tokens, tokenizer, bos, max_tokens, format, key_format, value_format,
                        strategy, params, seed, ContinuationSpec{continuations, continuation_prompt, continuation_tokens},
                        ctx, score, quantize_layers, other_layers_format, base_memory_mib);
      },
      py::arg("checkpoint"), py::arg("text"), py::arg("tokens"), py::arg("tokenizer"), py::arg("bos"),
      py::arg("max_tokens"), py::arg("format"), py::arg("key_format"), py::arg("value_format"), py::arg("strategy"),
      py::arg("params"), py::arg("seed"), py::arg("continuations"), py::arg("continuation_prompt"),
      py::arg("continuation_tokens"), py::arg("ctx"), py::arg("score"), py::arg("quantize_layers") = "",
      py::arg("other_layers_format") = "",
      py::arg("base_memory_mib") = static_cast<double>(kDefaultHeldBaseLogitsBytes) / (1024.0 * 1024.0));
  m.def("write_safetensors", &write_safetensors_dict, py::arg("path"), py::arg("tensors"),
        py::arg("metadata") = std::map<std::string, std::string>{});
  m.def("recording_from_layers", &recording_from_layers, py::arg("layers"), py::arg("token_ids"),
        py::arg("rope_applied"), py::arg("rope_theta"), py::arg("rope_inv_freq"), py::arg("metadata"), py::arg("name"),
        py::arg("source"));

  m.def(
      "run",
      [](const std::string& config, bool config_is_text, const std::vector<std::string>& overrides,
         const std::vector<std::string>& budgets, int threads, const std::string& out, const std::string& backend,
         std::optional<bool> plots, bool quiet, const std::string& shard, const std::string& resume,
         const std::string& command_line, const std::string& precision) {
        return run(config, config_is_text,
                   RunOptions{overrides, budgets, threads, out, backend, plots, quiet, shard, resume, command_line,
                              precision});
      },
      py::arg("config"), py::arg("config_is_text"), py::arg("overrides"), py::arg("budgets"), py::arg("threads"),
      py::arg("out"), py::arg("backend"), py::arg("plots"), py::arg("quiet"), py::arg("shard"), py::arg("resume"),
      py::arg("command_line"), py::arg("precision"));
  // The points.csv columns that hold a point's memory (output.x and memory budgets).
  m.attr("memory_columns") = py::tuple(py::cast(memory_columns()));
  m.def("budget_picks", &budget_picks, py::arg("query"), py::arg("columns"), py::arg("pareto"), py::arg("memory"));
  m.def("budget_answer", &budget_answer, py::arg("dir"), py::arg("query"));
  // The indices of the Pareto frontier of (cost, value) (experiments/frontier.h: NaN
  // rows ignored, cheapest first), in the direction of `higher_is_better`.
  m.def(
      "pareto_front",
      [](const std::vector<double>& cost, const std::vector<double>& value, bool higher_is_better) {
        if (cost.size() != value.size())
          throw ConfigError("pareto_front: " + std::to_string(cost.size()) + " costs but " +
                            std::to_string(value.size()) + " values");
        return pareto_front(cost, value, higher_is_better ? Better::Higher : Better::Lower);
      },
      py::arg("cost"), py::arg("value"), py::arg("higher_is_better"));
  // The metric table's axis label of a metric ("attention KL, mean (nats, lower is
  // better)") and its direction, as the CLI's plots name it; None for another column.
  m.def("metric_axis", [](const std::string& name) -> py::object {
    const MetricDef* def = find_metric(name);
    if (def == nullptr) return py::none();
    return py::make_tuple(metric_axis_label(*def), def->better == Better::Higher);
  });
}
