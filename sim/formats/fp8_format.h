// FP8 (OCP E4M3 and E5M2) with a scale: x is stored as fp8(x / scale), round to
// nearest even, saturating at ±max (E4M3 448, E5M2 57344); decoded as fp8 * scale.
//
// Name grammar: fp8-<e4m3|e5m2>[-s<scale>|-cal<N>|-tok]
//   (none)     static scale 1 (what vLLM does without calibrated scales); stores no scale
//   -s<scale>  static scale, a decimal such as s0.25; a constant of the configuration,
//              not stored per span
//   -cal<N>    one fp32 scale per span (the unit's [tokens, head_dim] tensor, i.e. per
//              layer, KV head and K/V): absmax of the span's first N tokens / fp8 max.
//              Later tokens beyond that range saturate. +32 bits per span.
//   -tok       one fp32 scale per token vector, absmax(row) / fp8 max. +32 bits per token.
// A model-wide per-layer scale shared by all heads is a static scale here (a Format
// sees one head).
#pragma once
#include <string>

#include "sim/formats/format.h"

namespace kvb {

enum class Fp8Scale { Static, Calibrated, PerToken };

struct Fp8Spec {
  bool e5m2 = false;
  Fp8Scale scale = Fp8Scale::Static;
  float static_scale = 1.0f;
  int64_t calibration_tokens = 0;  // Calibrated only
  std::string name() const;
};

class Fp8Format final : public Format {
 public:
  explicit Fp8Format(Fp8Spec spec) : spec_(spec) {}
  const Fp8Spec& spec() const { return spec_; }
  std::string name() const override { return spec_.name(); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  double nominal_bits() const override { return 8; }
  bool splits_at_groups() const override { return spec_.scale != Fp8Scale::Calibrated; }  // -cal: one scale a span
  // -cal<N>: only the new rows while the grown span's scale is the first m rows' (always
  // once m >= N).
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;
  int64_t clipped_values(ConstMatView x, const SpanInfo& span) const override;

 private:
  // The scale of row r (same for every row unless per token).
  float span_scale(ConstMatView x) const;
  // x's rows through fp8 with the span's scale `shared` (unless per token) into out.
  void roundtrip_rows(ConstMatView x, float shared, MatView out) const;
  Fp8Spec spec_;
};

FormatPtr parse_fp8_format(std::string_view name);

}  // namespace kvb
