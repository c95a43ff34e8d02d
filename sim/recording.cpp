#include "sim/recording.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/prerope_format.h"
#include "sim/reconstruction.h"

namespace kvb {

std::string rope_inv_freq_text(const std::vector<float>& inv_freq) {
  std::string out;
  char buf[32];
  for (float f : inv_freq) {
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
    if (!out.empty()) out += ",";
    out += buf;
  }
  return out;
}

namespace {

std::vector<float> parse_rope_inv_freq(const std::string& text, int64_t head_dim, const std::string& where) {
  std::vector<float> out;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  while (p < end) {
    float f = 0;
    const auto res = std::from_chars(p, end, f);
    if (res.ec != std::errc() || !std::isfinite(f) || !(f > 0) || (res.ptr != end && *res.ptr != ','))
      throw Error(where + ": metadata rope_inv_freq: entry " + std::to_string(out.size()) +
                  " is not a positive number");
    out.push_back(f);
    p = res.ptr == end ? end : res.ptr + 1;
  }
  if (static_cast<int64_t>(out.size()) * 2 != head_dim)
    throw Error(where + ": metadata rope_inv_freq has " + std::to_string(out.size()) +
                " numbers; head_dim " + std::to_string(head_dim) + " needs " + std::to_string(head_dim / 2));
  return out;
}

}  // namespace

RopeInfo rope_from_metadata(const std::map<std::string, std::string>& metadata, int64_t head_dim,
                            const std::string& where) {
  RopeInfo rope;
  if (const auto it = metadata.find("rope_theta"); it != metadata.end()) {
    const std::string& text = it->second;
    double theta = 0;
    const auto res = std::from_chars(text.data(), text.data() + text.size(), theta);
    if (res.ec != std::errc() || res.ptr != text.data() + text.size() || !std::isfinite(theta) || !(theta > 0))
      throw Error(where + ": metadata rope_theta = '" + text + "' is not a positive number");
    rope.theta = theta;
  }
  if (const auto it = metadata.find("rope_inv_freq"); it != metadata.end())
    rope.inv_freq = parse_rope_inv_freq(it->second, head_dim, where);
  return rope;
}

namespace {
// Row of position t in a layer's query tensor (kept: LayerTensors::query_positions), or
// -1 when t is not kept.
int64_t query_row_index(const std::vector<int64_t>& kept, int64_t t) {
  const auto it = std::lower_bound(kept.begin(), kept.end(), t);
  return it != kept.end() && *it == t ? static_cast<int64_t>(it - kept.begin()) : -1;
}
}  // namespace

const float* LayerTensors::query_row(int64_t h, int64_t t) const {
  const int64_t d = query.dim(2);
  if (query_positions.empty()) return query.slice(h) + t * d;
  const int64_t row = query_row_index(query_positions, t);
  if (row < 0)
    throw Error("the query at position " + std::to_string(t) + " was not kept: this recording keeps the queries of " +
                std::to_string(query_positions.size()) + " sampled positions only (the run's calibration and "
                "evaluated ones)");
  return query.slice(h) + row * d;
}

bool Recording::has_pre_rope_keys() const { return !layers.empty() && !layers[0].key_pre_rope.empty(); }
bool Recording::has_attn_output() const { return !layers.empty() && !layers[0].attn_output.empty(); }

namespace {
// Whether every value of a tensor is finite, and the largest |value|: one pass in
// parallel blocks (the maximum is exact in any order, so the same for any thread count).
// Called outside a parallel region it runs on every thread (validation is serial
// otherwise, between the generator's or loader's parallel work and the sweep's).
struct TensorScan {
  bool finite = true;
  float max_abs = 0.0f;  // meaningful when finite
};
TensorScan scan_tensor(const Tensor& t) {
  constexpr int64_t kBlock = 1 << 16;  // floats per parallel block
  const int64_t n = t.numel(), blocks = (n + kBlock - 1) / kBlock;
  const float* data = t.data.data();
  float m = 0.0f;
  int finite = 1;
#pragma omp parallel for schedule(static) reduction(max : m) reduction(&& : finite) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    float block_max = 0.0f;
    bool block_finite = true;
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const float a = std::fabs(data[i]);
      block_finite &= a <= std::numeric_limits<float>::max();  // false for Inf and NaN
      block_max = std::max(block_max, a);
    }
    m = std::max(m, block_max);
    finite = finite && block_finite;
  }
  return {finite != 0, m};
}
}  // namespace

namespace {
// validate_layer's RoPE check of layer i's pre-RoPE keys, every KV head; `where` names
// the layer.
void check_layer_pre_rope_keys(const Recording& rec, int64_t i, const std::string& where) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(i)];
  std::vector<ConstMatView> keys;
  std::vector<SpanInfo> spans;
  for (int64_t h = 0; h < rec.kv_heads; ++h) {
    keys.push_back(ConstMatView{L.key.slice(h), rec.tokens, rec.head_dim, rec.head_dim});
    spans.push_back(unit_span(rec, i, h, Kind::Key, 0));
  }
  check_pre_rope_keys(keys, spans, where, "KV head",
                      "a wrong RoPE base (the file's metadata rope_theta, else 10000; a config's [data] rope_theta "
                      "overrides it and the file's scaled rope_inv_freq: give the model's, or leave it out), RoPE "
                      "scaling without its rope_inv_freq metadata, or key and key_pre_rope not recorded together at "
                      "positions 0..T-1 (the pre-RoPE keys of other tokens or another layer)");
}
}  // namespace

int64_t Recording::full_causal_queries() const {
  int64_t n = tokens;
  for (int64_t w : attention_windows)
    if (w > 0) n = std::min(n, w);
  return n;
}

void Recording::validate() const {
  validate_except_layer_tensors();
  for (size_t i = 0; i < layers.size(); ++i) validate_layer(static_cast<int64_t>(i));
}

void Recording::validate_except_layer_tensors() const {
  const std::string where = "recording '" + name + "' (" + source + ")";
  if (layers.empty()) throw Error(where + ": no layers");
  if (q_heads <= 0 || kv_heads <= 0 || head_dim <= 0 || tokens <= 0)
    throw Error(where + ": empty dimensions (" + summary() + ")");
  if (q_heads % kv_heads != 0)
    throw Error(where + ": query heads (" + std::to_string(q_heads) + ") must be a multiple of KV heads (" +
                std::to_string(kv_heads) + ") for GQA");
  if (!rope.inv_freq.empty() && static_cast<int64_t>(rope.inv_freq.size()) * 2 != head_dim)
    throw Error(where + ": " + std::to_string(rope.inv_freq.size()) + " RoPE inverse frequencies for head_dim " +
                std::to_string(head_dim));
  const std::vector<int64_t>& kept = layers[0].query_positions;
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i] < 0 || kept[i] >= tokens || (i > 0 && kept[i] <= kept[i - 1]))
      throw Error(where + ": kept query position " + std::to_string(kept[i]) + " (entry " + std::to_string(i) +
                  ") is not sorted, distinct and within [0, " + std::to_string(tokens) + ")");
  if (!attention_windows.empty() && attention_windows.size() != layers.size())
    throw Error(where + ": " + std::to_string(attention_windows.size()) + " attention windows for " +
                std::to_string(layers.size()) + " layers");
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].query_positions != kept)
      throw Error(where + " layer " + std::to_string(layer_ids.empty() ? int(i) : layer_ids[i]) +
                  ": keeps queries at other positions than layer " +
                  std::to_string(layer_ids.empty() ? 0 : layer_ids[0]));
  if (!token_ids.empty() && static_cast<int64_t>(token_ids.size()) != tokens)
    throw Error(where + ": " + std::to_string(token_ids.size()) + " token ids for " + std::to_string(tokens) + " tokens");
  if (!positions.empty() && static_cast<int64_t>(positions.size()) != tokens)
    throw Error(where + ": " + std::to_string(positions.size()) + " positions for " + std::to_string(tokens) + " tokens");
  if (phase_boundary && (*phase_boundary < 0 || *phase_boundary > tokens))
    throw Error(where + ": phase boundary " + std::to_string(*phase_boundary) + " outside [0, " +
                std::to_string(tokens) + "]");
}

void Recording::validate_layer(int64_t i) const {
  const std::string where = "recording '" + name + "' (" + source + ")";
  const LayerTensors& L = layers[static_cast<size_t>(i)];
  const std::string lw = where + " layer " + std::to_string(layer_ids.empty() ? int(i) : layer_ids[static_cast<size_t>(i)]);
  const std::vector<int64_t>& kept = L.query_positions;
  const int64_t query_rows = kept.empty() ? tokens : static_cast<int64_t>(kept.size());
  const std::vector<int64_t> qshape = {q_heads, query_rows, head_dim};
  const std::vector<int64_t> kvshape = {kv_heads, tokens, head_dim};
  auto need = [&](const Tensor& t, const std::vector<int64_t>& shape, const char* what) {
    if (t.shape != shape)
      throw Error(lw + ": " + what + " has shape " + shape_str(t.shape) + ", expected " + shape_str(shape) +
                  " [heads, tokens, head_dim]");
  };
  need(L.query, qshape, "query");
  need(L.key, kvshape, "key");
  need(L.value, kvshape, "value");
  if (!L.key_pre_rope.empty()) need(L.key_pre_rope, kvshape, "key_pre_rope");
  if (!L.attn_output.empty()) need(L.attn_output, {tokens, q_heads * head_dim}, "attn_output");
  // Each tensor scanned once in parallel; require_finite (serial) names the first
  // non-finite value of one that is not.
  struct Checked {
    const Tensor* tensor;
    const char* what;
    double* max_abs;  // where its largest |value| goes, or nullptr
  };
  double max_abs_query = 0, max_abs_key = 0;
  for (const Checked& c : {Checked{&L.query, " query", &max_abs_query}, Checked{&L.key, " key", &max_abs_key},
                           Checked{&L.value, " value", nullptr}, Checked{&L.key_pre_rope, " key_pre_rope", nullptr},
                           Checked{&L.attn_output, " attn_output", nullptr}}) {
    if (c.tensor->empty()) continue;  // query, key and value are not (their shapes are checked above)
    const TensorScan scan = scan_tensor(*c.tensor);
    if (!scan.finite) require_finite(*c.tensor, lw + c.what);
    if (c.max_abs) *c.max_abs = scan.max_abs;
  }
  // |q·k| / √d <= max|q| · max|k| · √d: finite scores for every pair (and for keys a
  // quantizer moves a little), with margin below fp32's 3.4e38.
  const double score_bound = max_abs_query * max_abs_key * std::sqrt(static_cast<double>(head_dim));
  if (score_bound > 1e36)
    throw Error(lw + ": max|query| · max|key| · √head_dim = " + format_double(score_bound) +
                ": attention scores q·k/√d could overflow fp32 (values this large are not activations)");
  // An odd head_dim has no rotate-half RoPE (the prerope: formats refuse it): nothing to check.
  if (rope.applied && !L.key_pre_rope.empty() && head_dim % 2 == 0) check_layer_pre_rope_keys(*this, i, lw);
}


namespace {
// Keeps the first n rows of dimension 1 of a [H, T, d] tensor.
void truncate_htd(Tensor& t, int64_t n) {
  if (t.empty()) return;
  const int64_t H = t.dim(0), T = t.dim(1), d = t.dim(2);
  Tensor out({H, n, d});
  for (int64_t h = 0; h < H; ++h)
    std::copy(t.slice(h), t.slice(h) + n * d, out.slice(h));
  (void)T;
  t = std::move(out);
}
}  // namespace

void Recording::truncate_tokens(int64_t n) {
  if (n <= 0 || n >= tokens) return;
  const std::vector<int64_t> kept = layers.empty() ? std::vector<int64_t>{} : layers[0].query_positions;
  const int64_t kept_below = std::lower_bound(kept.begin(), kept.end(), n) - kept.begin();
  if (!kept.empty() && kept_below == 0)
    throw Error("recording '" + name + "': keeping the first " + std::to_string(n) +
                " tokens leaves none of its kept query positions (the first is " + std::to_string(kept[0]) + ")");
  for (LayerTensors& L : layers) {
    if (kept.empty()) {
      truncate_htd(L.query, n);
    } else {
      truncate_htd(L.query, kept_below);
      L.query_positions.resize(static_cast<size_t>(kept_below));
    }
    truncate_htd(L.key, n);
    truncate_htd(L.value, n);
    truncate_htd(L.key_pre_rope, n);
    if (!L.attn_output.empty()) {
      const int64_t w = L.attn_output.dim(1);
      L.attn_output.data.resize(static_cast<size_t>(n * w));
      L.attn_output.shape = {n, w};
    }
  }
  if (!token_ids.empty()) token_ids.resize(static_cast<size_t>(n));
  if (!positions.empty()) positions.resize(static_cast<size_t>(n));
  if (phase_boundary && *phase_boundary > n) phase_boundary = n;
  tokens = n;
}

void Recording::keep_queries_at(const std::vector<int64_t>& positions) {
  if (positions.empty() || static_cast<int64_t>(positions.size()) >= tokens) return;
  for (size_t i = 0; i < positions.size(); ++i)
    if (positions[i] < 0 || positions[i] >= tokens || (i > 0 && positions[i] <= positions[i - 1]))
      throw Error("recording '" + name + "': query position " + std::to_string(positions[i]) +
                  " to keep is not sorted, distinct and within [0, " + std::to_string(tokens) + ")");
  const int64_t n = static_cast<int64_t>(positions.size());
  for (LayerTensors& L : layers) {
    const int64_t H = L.query.dim(0), d = L.query.dim(2);
    Tensor kept({H, n, d});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < n; ++r) {
        const float* row = L.query_row(h, positions[static_cast<size_t>(r)]);
        std::copy(row, row + d, kept.slice(h) + r * d);
      }
    L.query = std::move(kept);
    L.query_positions = positions;
  }
}

std::string Recording::summary() const {
  std::ostringstream os;
  os << layers.size() << " layers, " << q_heads << "/" << kv_heads << " q/kv heads, head_dim " << head_dim << ", "
     << tokens << " tokens";
  if (rope.applied) os << ", post-RoPE (theta " << rope.theta << (rope.inv_freq.empty() ? "" : ", scaled") << ")";
  if (has_sparse_queries()) os << ", queries at " << layers[0].query_positions.size() << " positions";
  if (streamed_extras ? streamed_extras->key_pre_rope : has_pre_rope_keys()) os << ", pre-RoPE keys";
  if (streamed_extras ? streamed_extras->attn_output : has_attn_output()) os << ", attn_output";
  return os.str();
}

}  // namespace kvb
