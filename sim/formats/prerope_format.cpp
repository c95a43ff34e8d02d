#include "sim/formats/prerope_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

RopeTable span_rope_table(const SpanInfo& span, int64_t r0, int64_t r1, int64_t head_dim) {
  // Exactly as the recording's keys were rotated (sim/core/rope.h, Hugging Face's fp32
  // arithmetic); each row's angles from its own position only.
  std::vector<int64_t> positions(static_cast<size_t>(r1 - r0));
  for (int64_t r = r0; r < r1; ++r) positions[r - r0] = span.positions ? span.positions[r] : span.first_token + r;
  return span.rope_inv_freq ? make_rope_table(r1 - r0, positions.data(), *span.rope_inv_freq)
                            : make_rope_table(r1 - r0, head_dim, positions.data(), span.rope_theta);
}

void PreRopeFormat::reapply_rope(const SpanInfo& span, int64_t r0, int64_t r1, MatView out) const {
  const RopeTable table = span_rope_table(span, r0, r1, out.cols);
  for (int64_t r = r0; r < r1; ++r) apply_rope_row(out.row(r), table, r - r0);
}

namespace {

// At most this many rows of a span are compared (evenly spread, the first and last
// included): a wrong theta or keys from other positions give errors of 0.1-1.4 on
// every row, so a sample decides as well as all rows of a 128K-token recording would.
constexpr int64_t kPreRopeCheckedRows = 4096;

// ||RoPE(pre) − key||₂ / ||key||₂ over (a sample of) the span's rows; 0 when both are
// zero, infinite when only the keys are.
double pre_rope_key_error(ConstMatView key, const SpanInfo& span) {
  const int64_t stride = (key.rows + kPreRopeCheckedRows - 1) / kPreRopeCheckedRows;
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < key.rows; r += stride) rows.push_back(r);
  if (rows.back() != key.rows - 1) rows.push_back(key.rows - 1);
  std::vector<float> rotated(static_cast<size_t>(key.cols));
  double diff2 = 0, norm2 = 0;
  for (const int64_t r : rows) {
    const RopeTable table = span_rope_table(span, r, r + 1, key.cols);  // row r's rotation alone
    const float* pre = span.key_pre_rope + r * span.key_pre_rope_stride;
    std::copy(pre, pre + key.cols, rotated.begin());
    apply_rope_row(rotated.data(), table, 0);
    const float* k = key.row(r);
    for (int64_t c = 0; c < key.cols; ++c) {
      const double e = static_cast<double>(rotated[static_cast<size_t>(c)]) - k[c];
      diff2 += e * e;
      norm2 += static_cast<double>(k[c]) * k[c];
    }
  }
  if (norm2 > 0) return std::sqrt(diff2 / norm2);
  return diff2 > 0 ? INFINITY : 0.0;
}

// printf's %g with `digits` significant digits: 500000, 1e+10, 1.04, 0.000296.
std::string format_g(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// "theta 500000", or with the scaled inverse frequencies the recording carries.
std::string rope_description(const SpanInfo& span) {
  return "theta " + format_g(span.rope_theta, 9) +
         (span.rope_inv_freq ? " with the recording's scaled inverse frequencies (rope_inv_freq: RoPE scaling)" : "");
}

std::string positions_description(const SpanInfo& span, int64_t rows) {
  const int64_t first = span.positions ? span.positions[0] : span.first_token;
  const int64_t last = span.positions ? span.positions[rows - 1] : span.first_token + rows - 1;
  return std::to_string(first) + ".." + std::to_string(last);
}

}  // namespace

void check_pre_rope_keys(const std::vector<ConstMatView>& keys, const std::vector<SpanInfo>& spans,
                         const std::string& where, const std::string& unit, const std::string& causes) {
  if (keys.size() != spans.size()) throw Error("internal: check_pre_rope_keys: keys and spans differ in number");
  double worst = -1;
  size_t worst_span = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const ConstMatView& key = keys[i];
    const SpanInfo& span = spans[i];
    if (key.rows == 0) continue;
    if (!span.key_pre_rope) throw Error("internal: check_pre_rope_keys: a span without pre-RoPE keys");
    if (key.cols % 2 != 0)
      throw Error(where + ": has pre-RoPE keys but an odd head_dim (" + std::to_string(key.cols) +
                  "): RoPE (rotate_half) pairs channel i with i + head_dim/2, so these keys cannot be the pre-RoPE "
                  "versions of post-RoPE keys");
    const double error = pre_rope_key_error(key, span);
    if (!(error <= worst)) {  // NaN cannot arise (finite inputs), infinity can
      worst = error;
      worst_span = i;
    }
  }
  if (!(worst > kPreRopeKeyTolerance)) return;
  const SpanInfo& span = spans[worst_span];
  throw Error(where + ": RoPE (" + rope_description(span) + ", positions " +
              positions_description(span, keys[worst_span].rows) +
              ") of the pre-RoPE keys does not give the post-RoPE keys: relative L2 error " + format_g(worst, 3) +
              " at " + unit + " " + std::to_string(span.kv_head) + " (the worst of " + std::to_string(keys.size()) +
              "; fp16/bf16 rounding stays below " + format_g(kPreRopeKeyTolerance, 3) +
              "), so prerope: formats would re-apply another rotation than the model's. Likely: " + causes);
}

void check_pre_rope_key_rows(const float* keys, const float* pre_rope, int64_t rows, int64_t head_dim,
                             int64_t rows_per_span, const SpanInfo& base, const std::string& where,
                             const std::string& causes) {
  std::vector<ConstMatView> views;
  std::vector<SpanInfo> spans;
  for (int64_t s = 0, r0 = 0; r0 < rows; ++s, r0 += rows_per_span) {
    views.push_back(ConstMatView{keys + r0 * head_dim, std::min(rows_per_span, rows - r0), head_dim, head_dim});
    SpanInfo span = base;
    span.kv_head = s;
    span.key_pre_rope = pre_rope + r0 * head_dim;
    span.key_pre_rope_stride = head_dim;
    spans.push_back(span);
  }
  check_pre_rope_keys(views, spans, where, "span", causes);
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
