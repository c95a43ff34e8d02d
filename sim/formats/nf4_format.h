// NF4 (QLoRA NormalFloat4): blocks of G consecutive channels of a token vector share
// an absmax scale s; each value is stored as the index of the NF4 codebook entry
// (codebook.h, bitsandbytes' table and thresholds) nearest to x/s.
//
// Name grammar: nf4-g<G>[-s<fp16|bf16|fp32>]   (G divides head_dim; scale dtype
// default fp16, omitted). QLoRA's weights use G = 64: nf4-g64 = 4 + 16/64 = 4.25 bpe.
// Normalisation multiplies by 1/s as bitsandbytes does (s as stored).
#pragma once
#include <string>

#include "sim/core/store_dtype.h"
#include "sim/formats/format.h"

namespace kvb {

class Nf4Format final : public Format {
 public:
  Nf4Format(int64_t group, StoreDtype scale_dtype) : group_(group), scale_dtype_(scale_dtype) {}
  int64_t group() const { return group_; }
  StoreDtype scale_dtype() const { return scale_dtype_; }
  std::string name() const override;
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  double nominal_bits() const override { return 4; }
  bool splits_at_groups() const override { return true; }  // blocks along head_dim, per token
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;
  int64_t clipped_values(ConstMatView x, const SpanInfo& span) const override;

 private:
  template <class Fn>
  void for_each_group(ConstMatView x, Fn fn) const;
  int64_t group_;
  StoreDtype scale_dtype_;
};

FormatPtr parse_nf4_format(std::string_view name);

}  // namespace kvb
