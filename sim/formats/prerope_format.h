// Pre-RoPE key quantization (KVQuant): a key span is quantized *before* RoPE with the
// inner format, from the recording's pre-RoPE keys, and RoPE is re-applied after
// dequantization with the recording's positions and theta (Hugging Face rotate_half
// convention, see rope_rotate_row). The reconstructed keys are then compared with the
// recorded post-RoPE keys as usual, so any mismatch between the model's own RoPE
// arithmetic (often bf16) and ours shows up as error.
// Values have no RoPE: a value span is stored with the inner format unchanged, so one
// preset can name both keys and values.
//
// Name grammar: prerope:<format>     e.g. prerope:nuq4-cal256, prerope:int2-asym-ch32
// Errors (kvb::Error naming the format and the recording) when the recording carries
// no pre-RoPE keys or its keys are not post-RoPE.
#pragma once
#include <string>

#include "sim/formats/format.h"

namespace kvb {

// RoPE of one head_dim row x at an integer position, in place (sim/core/rope.h:
// rotate_half pairs (i, i + d/2), Hugging Face's fp32 arithmetic).
void rope_rotate_row(float* x, int64_t d, double position, double theta);

class PreRopeFormat final : public Format {
 public:
  explicit PreRopeFormat(FormatPtr inner) : inner_(std::move(inner)) {}
  const FormatPtr& inner() const { return inner_; }

  std::string name() const override { return "prerope:" + inner_->name(); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override {
    return inner_->storage_bits(tokens, head_dim);
  }
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  double nominal_bits() const override { return inner_->nominal_bits(); }
  bool splits_at_groups() const override { return inner_->splits_at_groups(); }  // RoPE per row's position
  int64_t tokens_per_group() const override { return inner_->tokens_per_group(); }
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;
  bool reads_pre_rope_keys() const override { return true; }

 private:
  // The pre-RoPE keys of a key span; throws when the recording has none.
  ConstMatView pre_rope_keys(ConstMatView x, const SpanInfo& span) const;
  // RoPE applied to rows [r0, r1) of out, at the span's positions of those rows.
  void reapply_rope(const SpanInfo& span, int64_t r0, int64_t r1, MatView out) const;
  FormatPtr inner_;
};

FormatPtr parse_prerope_format(std::string_view name);

}  // namespace kvb
