// QJL: keys stored as a 1-bit sketch sign(S k) (S: m x head_dim, i.i.d. N(0, 1),
// seeded per unit) plus the fp16 norm ||k||; m + 16 bits per key vector.
// Attention does not decode these keys: the simulator takes their logits from the
// unbiased estimator (score_estimator())
//     <q, k> ≈ √(π/2)/m · ||k|| · <S q, sign(S k)>,   Var ≤ π/(2m) · ||q||² ||k||².
// roundtrip() (used only for tensor-level metrics) returns the sketch's direction
// at the stored norm, ||k|| · u/||u|| with u = Sᵀ sign(S k). QJL cannot store values.
//
// Name grammar: qjl-m<m>   (m >= 1 sketch bits per key, e.g. qjl-m256)
// S is generated on the host (Box-Muller in double from the unit's seeded stream,
// rounded to fp32); a device implementation must upload it rather than regenerate it.
#pragma once
#include <string>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

class QjlFormat final : public Format {
 public:
  explicit QjlFormat(int64_t m) : m_(m) {}
  int64_t m() const { return m_; }

  std::string name() const override { return "qjl-m" + std::to_string(m_); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  double nominal_bits() const override { return 1; }
  bool splits_at_groups() const override { return true; }  // projections seeded per unit, one row at a time
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;
  bool keys_only() const override { return true; }
  std::unique_ptr<ScoreEstimator> score_estimator(ConstMatView keys, const SpanInfo& span) const override;

  // The unit's sketch matrix S, row-major [m, head_dim] (fp32).
  std::vector<float> sketch_matrix(const SpanInfo& span, int64_t head_dim) const;
  // Sign bits (1 = negative projection) [rows, m] and fp16 norms [rows] of a span.
  void sketch(ConstMatView x, const std::vector<float>& S, std::vector<uint8_t>& signs,
              std::vector<uint16_t>& norms) const;

 private:
  void require_key(const SpanInfo& span) const;
  int64_t m_;
};

FormatPtr parse_qjl_format(std::string_view name);

}  // namespace kvb
