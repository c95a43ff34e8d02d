// "keep": values stored at full or half precision (fp32, fp16, bf16), no metadata.
// Used for sink tokens, recency windows and skipped heads.
// Name grammar: keep-<fp16|bf16|fp32>
#pragma once
#include "sim/core/store_dtype.h"
#include "sim/formats/format.h"

namespace kvb {

class KeepFormat final : public Format {
 public:
  explicit KeepFormat(StoreDtype dt) : dtype_(dt) {}
  StoreDtype dtype() const { return dtype_; }
  std::string name() const override;
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override {
    return static_cast<uint64_t>(tokens * head_dim) * static_cast<uint64_t>(store_dtype_bits(dtype_));
  }
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  bool lossless() const override { return dtype_ == StoreDtype::F32; }
  double nominal_bits() const override { return store_dtype_bits(dtype_); }
  bool splits_at_groups() const override { return true; }
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;

 private:
  StoreDtype dtype_;
};

FormatPtr parse_keep_format(std::string_view name);

}  // namespace kvb
