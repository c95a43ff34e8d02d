#include "sim/metrics/redundancy.h"

#include <cmath>
#include <limits>
#include <string>

#include "sim/core/error.h"

namespace kvb {

namespace {

template <typename Real>
double mean_pairwise_cosine_impl(const Real* rows, int64_t n, int64_t d) {
  std::vector<double> sum_unit(static_cast<size_t>(d), 0.0);  // Σ r̂_i, [d]
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Real* r = rows + i * d;
    double norm2 = 0;
    for (int64_t c = 0; c < d; ++c) norm2 += static_cast<double>(r[c]) * static_cast<double>(r[c]);
    if (!(norm2 > 0)) continue;
    const double inv = 1.0 / std::sqrt(norm2);
    for (int64_t c = 0; c < d; ++c) sum_unit[static_cast<size_t>(c)] += static_cast<double>(r[c]) * inv;
    ++nonzero;
  }
  if (nonzero < 2) return std::numeric_limits<double>::quiet_NaN();
  double s2 = 0;
  for (double v : sum_unit) s2 += v * v;
  const double m = static_cast<double>(nonzero);
  return (s2 - m) / (m * (m - 1));
}

void check_layer(const Recording& rec, int64_t li) {
  if (li < 0 || li >= rec.num_layers())
    throw Error("key rho: layer index " + std::to_string(li) + " outside [0, " + std::to_string(rec.num_layers()) +
                ") of recording '" + rec.name + "'");
}

const Tensor& keys_of(const Recording& rec, int64_t li, KeyFrame frame) {
  check_layer(rec, li);
  const LayerTensors& L = rec.layers[static_cast<size_t>(li)];
  if (frame == KeyFrame::PreRope) {
    if (L.key_pre_rope.empty())
      throw Error("key rho: recording '" + rec.name + "' has no pre-RoPE keys (key_pre_rope)");
    return L.key_pre_rope;
  }
  return L.key;
}

void check_range(const Recording& rec, int64_t t0, int64_t t1) {
  if (t0 < 0 || t1 > rec.tokens || t1 - t0 < 2)
    throw Error("key rho: token range [" + std::to_string(t0) + ", " + std::to_string(t1) +
                ") must hold at least two of the " + std::to_string(rec.tokens) + " tokens of recording '" +
                rec.name + "'");
}

}  // namespace

double mean_pairwise_cosine(const float* rows, int64_t n, int64_t d) { return mean_pairwise_cosine_impl(rows, n, d); }
double mean_pairwise_cosine(const double* rows, int64_t n, int64_t d) {
  return mean_pairwise_cosine_impl(rows, n, d);
}

double key_rho_layer(const Recording& rec, int64_t li, int64_t t0, int64_t t1, KeyFrame frame) {
  check_range(rec, t0, t1);
  const Tensor& keys = keys_of(rec, li, frame);
  const int64_t G = rec.kv_heads, d = rec.head_dim, n = t1 - t0;
  std::vector<double> mean_keys(static_cast<size_t>(n * d), 0.0);  // [n, d], averaged over KV heads
  for (int64_t g = 0; g < G; ++g) {
    const float* k = keys.slice(g) + t0 * d;
    for (int64_t i = 0; i < n * d; ++i) mean_keys[static_cast<size_t>(i)] += k[i];
  }
  // The 1/G factor does not change any cosine; it is applied for readability of the rows.
  for (double& v : mean_keys) v /= static_cast<double>(G);
  return mean_pairwise_cosine(mean_keys.data(), n, d);
}

double key_rho(const Recording& rec, int64_t t0, int64_t t1, const std::vector<int64_t>& layers, KeyFrame frame) {
  std::vector<double> layer_rhos;
  for (int64_t li : key_rho_layers(rec, KeyRhoRange{t0, t1, layers}))
    layer_rhos.push_back(key_rho_layer(rec, li, t0, t1, frame));
  return mean_of_layer_rhos(layer_rhos);
}

std::vector<int64_t> key_rho_layers(const Recording& rec, const KeyRhoRange& range) {
  check_range(rec, range.t0, range.t1);
  std::vector<int64_t> which = range.layers;
  if (which.empty())
    for (int64_t li = 0; li < rec.num_layers(); ++li) which.push_back(li);
  for (int64_t li : which) check_layer(rec, li);
  return which;
}

double mean_of_layer_rhos(const std::vector<double>& layer_rhos) {
  double sum = 0;
  for (double rho : layer_rhos) sum += rho;
  return sum / static_cast<double>(layer_rhos.size());
}

double key_rho_head(const Recording& rec, int64_t li, int64_t kv_head, int64_t t0, int64_t t1, KeyFrame frame) {
  check_range(rec, t0, t1);
  const Tensor& keys = keys_of(rec, li, frame);
  if (kv_head < 0 || kv_head >= rec.kv_heads)
    throw Error("key rho: KV head " + std::to_string(kv_head) + " outside [0, " + std::to_string(rec.kv_heads) + ")");
  return mean_pairwise_cosine(keys.slice(kv_head) + t0 * rec.head_dim, t1 - t0, rec.head_dim);
}

}  // namespace kvb
