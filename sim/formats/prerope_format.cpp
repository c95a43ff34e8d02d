#include "sim/formats/prerope_format.h"

#include <cmath>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/rope.h"
#include "sim/formats/registry.h"

namespace kvb {

void rope_rotate_row(float* x, int64_t d, double position, double theta) {
  const int64_t pos = static_cast<int64_t>(position);
  apply_rope(x, 1, d, &pos, theta);
}

std::string PreRopeFormat::check_shape(int64_t tokens, int64_t head_dim) const {
  if (head_dim % 2 != 0) return "RoPE needs an even head_dim, got " + std::to_string(head_dim);
  return inner_->check_shape(tokens, head_dim);
}

ConstMatView PreRopeFormat::pre_rope_keys(ConstMatView x, const SpanInfo& span) const {
  const std::string rec = span.recording && *span.recording ? span.recording : "(unnamed)";
  if (!span.rope_applied)
    throw Error("format '" + name() + "': recording '" + rec +
                "' has no RoPE (its keys are not rotated), so there is nothing to quantize before RoPE; use '" +
                inner_->name() + "'");
  if (!span.key_pre_rope)
    throw Error("format '" + name() + "': recording '" + rec +
                "' has no pre-RoPE keys (key_pre_rope); record them, or use '" + inner_->name() + "' on post-RoPE keys");
  return ConstMatView{span.key_pre_rope, x.rows, x.cols, span.key_pre_rope_stride};
}

void PreRopeFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const {
  if (!span.is_key) {
    inner_->roundtrip(x, out, span);
    return;
  }
  inner_->roundtrip(pre_rope_keys(x, span), out, span);
  reapply_rope(span, 0, x.rows, out);
}

int64_t PreRopeFormat::roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                                      GrowthMemo* memo) const {
  if (!span.is_key) return inner_->roundtrip_grown(x, m, out, span, memo);
  const int64_t first = inner_->roundtrip_grown(pre_rope_keys(x, span), m, out, span, memo);
  reapply_rope(span, first, x.rows, out);
  return first;
}

void PreRopeFormat::reapply_rope(const SpanInfo& span, int64_t r0, int64_t r1, MatView out) const {
  // Exactly as the recording's keys were rotated (sim/core/rope.h, Hugging Face's fp32
  // arithmetic); each row's angles from its own position only.
  std::vector<int64_t> positions(static_cast<size_t>(r1 - r0));
  for (int64_t r = r0; r < r1; ++r) positions[r - r0] = span.positions ? span.positions[r] : span.first_token + r;
  const RopeTable table = span.rope_inv_freq ? make_rope_table(r1 - r0, positions.data(), *span.rope_inv_freq)
                                             : make_rope_table(r1 - r0, out.cols, positions.data(), span.rope_theta);
  for (int64_t r = r0; r < r1; ++r) apply_rope_row(out.row(r), table, r - r0);
}

void PreRopeFormat::encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const {
  inner_->encode(span.is_key ? pre_rope_keys(x, span) : x, span, out);
}

std::string PreRopeFormat::code_layout() const {
  return "the inner format's encoding (" + inner_->name() + ": " + inner_->code_layout() +
         ") of the pre-RoPE keys (of the values, for value spans)";
}

FormatPtr parse_prerope_format(std::string_view name) {
  if (name.substr(0, 8) != "prerope:") {
    if (name.substr(0, 7) == "prerope")
      throw ConfigError("format '" + std::string(name) + "': expected prerope:<format>, e.g. prerope:nuq4-cal256");
    return nullptr;
  }
  FormatPtr inner = make_format(name.substr(8));
  if (inner->reads_pre_rope_keys())
    throw ConfigError("format '" + std::string(name) + "': " + inner->name() +
                      " already quantizes the pre-RoPE keys and re-applies RoPE; one prerope: is enough");
  if (inner->keys_only())
    throw ConfigError("format '" + std::string(name) + "': " + inner->name() +
                      " estimates logits from post-RoPE keys; it cannot be wrapped in prerope:");
  return std::make_shared<PreRopeFormat>(std::move(inner));
}

}  // namespace kvb
