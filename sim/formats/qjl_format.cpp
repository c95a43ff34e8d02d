#include "sim/formats/qjl_format.h"

#include <Eigen/Core>
#include <cmath>

#include "sim/core/error.h"
#include "sim/formats/name_parse.h"
#include "sim/formats/qjl_block.h"
#include "sim/formats/seeded.h"

namespace kvb {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Sketched keys of one span, kept for the estimator.
class QjlEstimator final : public ScoreEstimator {
 public:
  QjlEstimator(RowMat S, RowMat signs, std::vector<float> scales)
      : S_(std::move(S)), signs_(std::move(signs)), scales_(std::move(scales)) {}
  int64_t keys() const override { return signs_.rows(); }
  void estimate(ConstMatView q, int64_t n_keys, MatView out) const override {
    Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> Q(q.data, q.rows, q.cols, Eigen::OuterStride<>(q.stride));
    const RowMat SQ = Q * S_.transpose();                                    // [rows, m]
    const RowMat est = SQ * signs_.topRows(n_keys).transpose();             // [rows, n_keys]
    for (int64_t r = 0; r < q.rows; ++r)
      for (int64_t j = 0; j < n_keys; ++j) out.row(r)[j] = est(r, j) * scales_[j];
  }

 private:
  RowMat S_;                  // [m, d]
  RowMat signs_;              // [keys, m], ±1
  std::vector<float> scales_; // √(π/2)/m · ||k_j||_fp16
};

}  // namespace

uint64_t QjlFormat::storage_bits(int64_t tokens, int64_t /*head_dim*/) const {
  if (tokens <= 0) return 0;
  return static_cast<uint64_t>(tokens) * static_cast<uint64_t>(m_ + 16);
}

std::vector<float> QjlFormat::sketch_matrix(const SpanInfo& span, int64_t head_dim) const {
  const uint64_t stream = unit_stream(span.seed, span.layer, span.kv_head, span.is_key, 0x716a6c00ull);
  std::vector<float> S(static_cast<size_t>(m_ * head_dim));
  const double two_pi = 6.283185307179586476925;
  for (size_t e = 0; e < S.size(); ++e) {
    const uint64_t w1 = stream_word(stream, 2 * e), w2 = stream_word(stream, 2 * e + 1);
    const double u1 = (static_cast<double>(w1 >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(w2 >> 11) * 0x1.0p-53;          // [0, 1)
    S[e] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
  }
  return S;
}

void QjlFormat::sketch(ConstMatView x, const std::vector<float>& S, std::vector<uint8_t>& signs,
                       std::vector<uint16_t>& norms) const {
  const int64_t d = x.cols, m = m_;
  // Sᵀ, so that the m projections of a key accumulate side by side (vectorizable)
  // while each one still sums its d products in index order, as qjl_sign_bit does.
  std::vector<float> St(static_cast<size_t>(d * m));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < d; ++c) St[c * m + i] = S[i * d + c];
  signs.assign(static_cast<size_t>(x.rows * m), 0);
  norms.resize(static_cast<size_t>(x.rows));
  std::vector<float> acc(static_cast<size_t>(m));
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* k = x.row(r);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t c = 0; c < d; ++c) {
      const float kc = k[c];
      const float* s = St.data() + c * m;
      for (int64_t i = 0; i < m; ++i) acc[i] = add_rn(acc[i], mul_rn(s[i], kc));
    }
    for (int64_t i = 0; i < m; ++i) signs[r * m + i] = acc[i] < 0.0f ? 1 : 0;
    norms[r] = qjl_norm_bits(k, static_cast<int>(d));
  }
}

void QjlFormat::require_key(const SpanInfo& span) const {
  if (!span.is_key)
    throw ConfigError("format '" + name() + "' is a key sketch for attention logits (QJL) and cannot store values (layer " +
                      std::to_string(span.layer) + ", kv_head " + std::to_string(span.kv_head) +
                      "); give values another format");
}

void QjlFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const {
  require_key(span);
  const int64_t d = x.cols, m = m_;
  const std::vector<float> S = sketch_matrix(span, d);
  std::vector<uint8_t> signs;
  std::vector<uint16_t> norms;
  sketch(x, S, signs, norms);
  std::vector<float> u(static_cast<size_t>(d));
  for (int64_t r = 0; r < x.rows; ++r) {
    std::fill(u.begin(), u.end(), 0.0f);
    for (int64_t i = 0; i < m; ++i) {  // u = Sᵀ s, each u_c summed over i in order
      const float* Si = S.data() + i * d;
      if (signs[r * m + i])
        for (int64_t c = 0; c < d; ++c) u[c] = add_rn(u[c], -Si[c]);
      else
        for (int64_t c = 0; c < d; ++c) u[c] = add_rn(u[c], Si[c]);
    }
    float ss = 0.0f;
    for (int64_t c = 0; c < d; ++c) ss = add_rn(ss, mul_rn(u[c], u[c]));
    const float un = sqrt_rn(ss);
    const float scale = un > 0.0f ? div_rn(f16_bits_to_f32(norms[r]), un) : 0.0f;
    float* o = out.row(r);
    for (int64_t c = 0; c < d; ++c) o[c] = mul_rn(u[c], scale);
  }
}

std::unique_ptr<ScoreEstimator> QjlFormat::score_estimator(ConstMatView keys, const SpanInfo& span) const {
  require_key(span);
  const int64_t d = keys.cols, m = m_;
  const std::vector<float> S = sketch_matrix(span, d);
  std::vector<uint8_t> signs;
  std::vector<uint16_t> norms;
  sketch(keys, S, signs, norms);
  RowMat Sm = Eigen::Map<const RowMat>(S.data(), m, d);
  RowMat sg(keys.rows, m);
  std::vector<float> scales(static_cast<size_t>(keys.rows));
  for (int64_t r = 0; r < keys.rows; ++r) {
    for (int64_t i = 0; i < m; ++i) sg(r, i) = signs[r * m + i] ? -1.0f : 1.0f;
    scales[r] = qjl_estimator_scale(norms[r], static_cast<int>(m));
  }
  return std::make_unique<QjlEstimator>(std::move(Sm), std::move(sg), std::move(scales));
}

void QjlFormat::encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const {
  require_key(span);
  const std::vector<float> S = sketch_matrix(span, x.cols);
  std::vector<uint8_t> signs;
  std::vector<uint16_t> norms;
  sketch(x, S, signs, norms);
  for (int64_t r = 0; r < x.rows; ++r) {
    out.put(norms[r], 16);
    for (int64_t i = 0; i < m_; ++i) out.put(signs[r * m_ + i], 1);
  }
}

std::string QjlFormat::code_layout() const {
  return "per key row: fp16 norm ||k||, then m sign bits of S k (bit i set: projection i negative), i ascending; "
         "S is regenerated from the seed";
}

FormatPtr parse_qjl_format(std::string_view name) {
  NameParts parts(name);
  if (parts.at(0) != "qjl") return nullptr;
  const auto m = parts.size() == 2 ? parse_int_suffix(parts.at(1), "m") : std::nullopt;
  if (!m || *m < 1 || *m > 65536)
    throw ConfigError("format '" + std::string(name) + "': expected qjl-m<m> with m in 1..65536 sketch bits (e.g. qjl-m256)");
  return std::make_shared<QjlFormat>(*m);
}

}  // namespace kvb
