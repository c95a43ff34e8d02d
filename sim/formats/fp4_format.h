// FP4 (E2M1: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) with block scales, along head_dim.
//
// Name grammar: mxfp4 | nvfp4
//   mxfp4  OCP Microscaling: blocks of 32 share an E8M0 power-of-two scale
//          X = 2^(floor(log2 absmax) - 2) (OCP MX v1.0 §6.3); 4 + 8/32 = 4.25 bits/element.
//   nvfp4  NVIDIA NVFP4: blocks of 16 share an E4M3 scale, times one fp32 scale per
//          tensor (here: per span); 4 + 8/16 = 4.5 bits/element + 32 bits per span.
// Element rounding is to nearest even with saturation at ±6 (fp_blocks.h).
#pragma once
#include <string>

#include "sim/formats/format.h"

namespace kvb {

class Fp4Format final : public Format {
 public:
  explicit Fp4Format(bool nv) : nv_(nv) {}
  bool nv() const { return nv_; }
  int block() const { return nv_ ? 16 : 32; }

  std::string name() const override { return nv_ ? "nvfp4" : "mxfp4"; }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  double nominal_bits() const override { return 4; }
  bool splits_at_groups() const override { return !nv_; }  // NVFP4's tensor scale is the span's
  // Only the new rows' blocks while the grown span's tensor scale is the first m rows'.
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;

 private:
  // Calls fn(row, col, scale_code, codes) for every block; g is NVFP4's tensor scale.
  template <class Fn>
  void for_each_block(ConstMatView x, float g, Fn fn) const;
  // x's blocks through E2M1 with tensor scale g (NVFP4) into out.
  void roundtrip_blocks(ConstMatView x, float g, MatView out) const;
  bool nv_;
};

FormatPtr parse_fp4_format(std::string_view name);

}  // namespace kvb
