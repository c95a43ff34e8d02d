// Dense-and-sparse outliers (KVQuant): in every token vector the k values of largest
// magnitude are kept exactly as fp16 together with their channel index (16 bits), and
// the remaining dense vector (outliers set to 0) is quantized with the inner format.
// k = round(p/100 * head_dim) (halves up), the same for every vector, so the cost is
// exact: inner + k * (16 + 16) bits per token vector (methods.md §1).
// Ties in magnitude keep the lower channel.
//
// Name grammar: outliers<p>%:<format>   e.g. outliers1%:nuq4-cal256, outliers0.5%:int4-asym-g32
#pragma once
#include <string>

#include "sim/formats/format.h"

namespace kvb {

class OutlierFormat final : public Format {
 public:
  OutlierFormat(float percent, FormatPtr inner) : percent_(percent), inner_(std::move(inner)) {}
  float percent() const { return percent_; }
  const FormatPtr& inner() const { return inner_; }
  // Outliers kept per vector of head_dim values.
  int64_t outliers_per_vector(int64_t head_dim) const;

  std::string name() const override;
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  double nominal_bits() const override { return inner_->nominal_bits(); }
  bool splits_at_groups() const override { return inner_->splits_at_groups(); }  // outliers chosen per row
  int64_t tokens_per_group() const override { return inner_->tokens_per_group(); }
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;

  // Channel indices of each row's outliers, ascending ([rows * k]), and the dense
  // remainder (x with those entries set to 0), row-major [rows, cols].
  void split(ConstMatView x, std::vector<int32_t>& idx, std::vector<float>& dense) const;

 private:
  // Rows [r0, r1) of out get their outliers back (fp16), from x and split's idx.
  void restore_outliers(ConstMatView x, const std::vector<int32_t>& idx, int64_t r0, int64_t r1, MatView out) const;
  float percent_;
  FormatPtr inner_;
};

FormatPtr parse_outlier_format(std::string_view name);

}  // namespace kvb
