#include "sim/metrics/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

namespace kvb {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMat>;
using RowMap = Eigen::Map<RowMat>;

void attention_scores(const float* q, const float* k, int64_t T, int64_t d, int64_t t0, int64_t t1,
                      float* out) {
  ConstRowMap Q(q + t0 * d, t1 - t0, d);
  ConstRowMap K(k, T, d);
  RowMap S(out, t1 - t0, T);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  S.noalias() = (Q * K.transpose()) * inv_sqrt_d;
}

double softmax_row(const float* scores, int64_t n, double* p) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(scores[j]));
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(static_cast<double>(scores[j]) - mx);
    sum += p[j];
  }
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
  return mx + std::log(sum);
}

double shannon_entropy_bits(const double* p, int64_t n) {
  double h = 0;
  for (int64_t j = 0; j < n; ++j)
    if (p[j] > 0) h -= p[j] * std::log2(p[j]);
  return h;
}

double renyi2_entropy_bits(const double* p, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += p[j] * p[j];
  return -std::log2(s);
}

HeadEntropy head_entropy(const Recording& rec, int64_t li, int64_t q_head,
                         const std::vector<int64_t>& positions) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(li)];
  const int64_t T = rec.tokens, d = rec.head_dim;
  const float* k = L.key.slice(rec.kv_head_of(q_head));
  std::vector<float> s(static_cast<size_t>(T));
  std::vector<double> p(static_cast<size_t>(T));
  HeadEntropy out;
  if (positions.empty()) return out;
  for (int64_t t : positions) {
    attention_scores(L.query_row(q_head, t), k, t + 1, d, 0, 1, s.data());
    softmax_row(s.data(), t + 1, p.data());
    out.shannon += shannon_entropy_bits(p.data(), t + 1);
    out.renyi2 += renyi2_entropy_bits(p.data(), t + 1);
  }
  out.shannon /= static_cast<double>(positions.size());
  out.renyi2 /= static_cast<double>(positions.size());
  return out;
}

std::vector<int64_t> spread_positions(int64_t T, int64_t max_positions) {
  std::vector<int64_t> pos;
  if (T <= 1 || max_positions <= 0) return pos;
  const int64_t avail = T - 1;
  const int64_t n = std::min(avail, max_positions);
  for (int64_t i = 0; i < n; ++i) pos.push_back(1 + (i * avail) / n);
  return pos;
}

void attention_output(const float* q, const float* k, const float* v, int64_t T, int64_t d, int64_t t0,
                      int64_t t1, float* out) {
  std::vector<float> s(static_cast<size_t>((t1 - t0) * T));
  attention_scores(q, k, T, d, t0, t1, s.data());
  std::vector<double> p(static_cast<size_t>(T));
  for (int64_t t = t0; t < t1; ++t) {
    softmax_row(s.data() + (t - t0) * T, t + 1, p.data());
    float* o = out + (t - t0) * d;
    for (int64_t c = 0; c < d; ++c) {
      double acc = 0;
      for (int64_t j = 0; j <= t; ++j) acc += p[static_cast<size_t>(j)] * v[j * d + c];
      o[c] = static_cast<float>(acc);
    }
  }
}

}  // namespace kvb
