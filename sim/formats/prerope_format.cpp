#include "sim/formats/prerope_format.h"

#include <cmath>
#include <vector>

#include "sim/core/error.h"
#include "sim/formats/registry.h"

namespace kvb {

void rope_rotate_row(float* x, int64_t d, double position, double theta) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) {
    const double a = position * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const double c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + h];
    x[i] = static_cast<float>(x0 * c - x1 * s);
    x[i + h] = static_cast<float>(x1 * c + x0 * s);
  }
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
  const ConstMatView pre = pre_rope_keys(x, span);
  inner_->roundtrip(pre, out, span);
  // cos/sin depend on (position, pair): evaluated once per pair frequency.
  const int64_t d = x.cols, h = d / 2;
  std::vector<double> inv_freq(static_cast<size_t>(h));
  for (int64_t i = 0; i < h; ++i)
    inv_freq[i] = std::pow(span.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  for (int64_t r = 0; r < x.rows; ++r) {
    const double pos = span.positions ? static_cast<double>(span.positions[r]) : static_cast<double>(span.first_token + r);
    float* o = out.row(r);
    for (int64_t i = 0; i < h; ++i) {
      const double a = pos * inv_freq[i];
      const double c = std::cos(a), s = std::sin(a);
      const double x0 = o[i], x1 = o[i + h];
      o[i] = static_cast<float>(x0 * c - x1 * s);
      o[i + h] = static_cast<float>(x1 * c + x0 * s);
    }
  }
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
  if (inner->keys_only())
    throw ConfigError("format '" + std::string(name) + "': " + inner->name() +
                      " estimates logits from post-RoPE keys; it cannot be wrapped in prerope:");
  return std::make_shared<PreRopeFormat>(std::move(inner));
}

}  // namespace kvb
