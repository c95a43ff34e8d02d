#include "sim/reconstruction.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "sim/core/strings.h"

namespace kvb {

SpanSource span_source(const Recording& rec) {
  SpanSource s;
  s.name = rec.name.c_str();
  s.rope_applied = rec.rope.applied;
  s.rope_theta = rec.rope.theta;
  s.rope_inv_freq = &rec.rope.inv_freq;
  if (!rec.positions.empty()) s.positions = rec.positions.data();
  return s;
}

SpanInfo unit_span(const SpanSource& source, int64_t layer, int64_t kv_head, Kind kind, uint64_t seed,
                   const float* key_pre_rope, int64_t head_dim) {
  SpanInfo span{layer, kv_head, kind == Kind::Key, 0, seed};
  span.recording = source.name;
  span.rope_applied = source.rope_applied;
  span.rope_theta = source.rope_theta;
  if (source.rope_inv_freq && !source.rope_inv_freq->empty()) span.rope_inv_freq = source.rope_inv_freq;
  span.positions = source.positions;
  if (kind == Kind::Key && key_pre_rope) {
    span.key_pre_rope = key_pre_rope;
    span.key_pre_rope_stride = head_dim;
  }
  return span;
}

SpanInfo unit_span(const Recording& rec, int64_t layer, int64_t kv_head, Kind kind, uint64_t seed) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const float* pre = L.key_pre_rope.empty() ? nullptr : L.key_pre_rope.slice(kv_head);
  return unit_span(span_source(rec), layer, kv_head, kind, seed, pre, rec.head_dim);
}

SpanInfo span_from(const SpanInfo& unit_span, int64_t offset) {
  SpanInfo span = unit_span;
  span.first_token += offset;
  if (span.key_pre_rope) span.key_pre_rope += offset * span.key_pre_rope_stride;
  if (span.positions) span.positions += offset;
  return span;
}

namespace {

// Throws NonFiniteReconstruction when `format` turned a finite value of x [n, d] into
// Inf or NaN in out (a value beyond its range: keep-fp16 beyond 65504, an fp16 scale
// that overflows): every metric of the point would be meaningless (a KL of 0 next to
// a NaN output error), so the point fails instead.
void require_finite_reconstruction(const Format& format, const float* x, const float* out, int64_t n, int64_t d,
                                   const SpanInfo& span) {
  // A branch-free count first (this runs on every reconstruction); the details only
  // when something is wrong.
  int64_t nonfinite = 0;
  for (int64_t i = 0; i < n * d; ++i) nonfinite += (std::bit_cast<uint32_t>(out[i]) & 0x7f800000u) == 0x7f800000u;
  if (nonfinite == 0) return;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n * d; ++i)
    if (!std::isfinite(out[i]) && std::isfinite(x[i]) && bad++ == 0) first = i;
  if (bad == 0) return;  // the input was not finite either (a model's own overflow)
  const int64_t row = first / d;
  // The callers name the layer, KV head and kind.
  throw NonFiniteReconstruction("format '" + format.name() + "' turned " + std::to_string(bad) + " finite " +
                                (span.is_key ? "key" : "value") + " element(s) into Inf or NaN (the first at token " +
                                std::to_string(span.first_token + row) + ", channel " + std::to_string(first % d) +
                                ": " + format_double(x[first]) + "): they exceed the format's range");
}

// Rows [begin, end) of a unit (x and out [*, d] from its token 0) through `format` as
// one span starting at `begin`, checked for values it made non-finite.
void roundtrip_rows(const Format& format, const float* x, int64_t begin, int64_t end, int64_t d,
                    const SpanInfo& unit_span, float* out) {
  if (end <= begin) return;
  const SpanInfo span = span_from(unit_span, begin);
  const int64_t n = end - begin;
  format.roundtrip(ConstMatView{x + begin * d, n, d, d}, MatView{out + begin * d, n, d, d}, span);
  require_finite_reconstruction(format, x + begin * d, out + begin * d, n, d, span);
}

bool same_format(const FormatPtr& a, const FormatPtr& b) { return a == b || (a && b && a->name() == b->name()); }

// The first row of `seg` whose stored version must be re-quantized, given what was
// built for `before`: past the groups complete in both seg and before's segment with
// the same first token and format, when that format splits at groups; else seg.begin.
int64_t first_row_to_quantize(const Segment& seg, const UnitPlan& before) {
  if (!seg.format->splits_at_groups()) return seg.begin;
  for (const Segment& old : before.segments)
    if (old.begin == seg.begin && same_format(old.format, seg.format)) {
      const int64_t G = seg.format->tokens_per_group();
      return seg.begin + G * ((std::min(old.end, seg.end) - seg.begin) / G);
    }
  return seg.begin;
}

// Of a segment whose format is fitted to its span (does not split at groups): how many
// of its first rows hold the round trip of a span that began at its first token, in the
// same format, and ended inside it (before's segment of that first token), else 0.
int64_t kept_fitted_rows(const Segment& seg, const UnitPlan& before) {
  if (seg.format->splits_at_groups()) return 0;
  for (const Segment& old : before.segments)
    if (old.begin == seg.begin && same_format(old.format, seg.format) && old.end <= seg.end) return old.end - old.begin;
  return 0;
}

// Rows [begin, end) of a unit through a format fitted to their span, whose rows
// [begin, begin + kept) in out hold the round trip of that span's first `kept` rows (0:
// none): the format rewrites the rows that differ (Format::roundtrip_grown, with the
// segment's memo), checked as roundtrip_rows checks its rows.
void grow_rows(const Format& format, const float* x, int64_t begin, int64_t kept, int64_t end, int64_t d,
               const SpanInfo& unit_span, float* out, GrowthMemo* memo) {
  const int64_t n = end - begin;
  if (kept >= n) return;  // the same rows as one span: the same bits
  const int64_t first =
      begin + format.roundtrip_grown(ConstMatView{x + begin * d, n, d, d}, kept, MatView{out + begin * d, n, d, d},
                                     span_from(unit_span, begin), memo);
  require_finite_reconstruction(format, x + first * d, out + first * d, end - first, d, span_from(unit_span, first));
}

// The memo kept for the fitted segment that begins at `begin`, if any.
GrowthMemo memo_of(const UnitGrowthMemos* memos, int64_t begin) {
  if (memos)
    for (const auto& [first_token, memo] : memos->segments)
      if (first_token == begin) return memo;
  return {};
}

// The first row of the window version to re-quantize, given what was built for `before`.
int64_t first_window_row(const UnitPlan& before, int64_t T_before, const UnitPlan& unit) {
  const FormatPtr& f = unit.window.format;
  const bool kept = before.window.active() && same_format(before.window.format, f) && f->splits_at_groups();
  return kept ? f->tokens_per_group() * (T_before / f->tokens_per_group()) : 0;
}

void estimate_key_segments(const UnitPlan& unit, const float* x, int64_t d, const SpanInfo& unit_span,
                           std::vector<EstimatedKeys>& estimated) {
  estimated.clear();
  if (unit_span.is_key)
    for (const Segment& seg : unit.segments)
      if (auto est = seg.format->score_estimator(ConstMatView{x + seg.begin * d, seg.end - seg.begin, d, d},
                                                 span_from(unit_span, seg.begin)))
        estimated.push_back({seg.begin, seg.end, std::move(est), seg.begin, seg.end});
}

}  // namespace

void reconstruct_unit(const UnitPlan& unit, const float* x, int64_t T, int64_t d, const SpanInfo& unit_span,
                      float* out) {
  for (const Segment& seg : unit.segments) {
    if (seg.end > T) throw Error("internal: plan segment beyond the unit's " + std::to_string(T) + " tokens");
    roundtrip_rows(*seg.format, x, seg.begin, seg.end, d, unit_span, out);
  }
}

void reconstruct_window(const UnitPlan& unit, const float* x, int64_t T, int64_t d, const SpanInfo& unit_span,
                        float* out) {
  roundtrip_rows(*unit.window.format, x, 0, T, d, unit_span, out);
}

void reconstruct_unit_versions(const UnitPlan& unit, const float* x, int64_t T, int64_t d, const SpanInfo& unit_span,
                               float* stored, float* window, std::vector<EstimatedKeys>& estimated) {
  reconstruct_unit(unit, x, T, d, unit_span, stored);
  estimate_key_segments(unit, x, d, unit_span, estimated);
  if (unit.window.active()) reconstruct_window(unit, x, T, d, unit_span, window);
}

int64_t rows_to_update(const UnitPlan& before, int64_t T_before, const UnitPlan& unit, int64_t T) {
  int64_t rows = unit.window.active() ? T - first_window_row(before, T_before, unit) : 0;
  for (const Segment& seg : unit.segments)
    rows += seg.format->keys_only() ? seg.end - seg.begin : seg.end - first_row_to_quantize(seg, before);
  return rows;
}

void update_unit_versions(const UnitPlan& before, int64_t T_before, const UnitPlan& unit, const float* x, int64_t T,
                          int64_t d, const SpanInfo& unit_span, float* stored, float* window,
                          std::vector<EstimatedKeys>& estimated, UnitGrowthMemos* memos) {
  if (T_before > T)
    throw Error("internal: a unit cannot shrink from " + std::to_string(T_before) + " to " + std::to_string(T) + " tokens");
  UnitGrowthMemos next;
  for (const Segment& seg : unit.segments) {
    if (seg.end > T) throw Error("internal: plan segment beyond the unit's " + std::to_string(T) + " tokens");
    if (seg.format->splits_at_groups()) {
      roundtrip_rows(*seg.format, x, first_row_to_quantize(seg, before), seg.end, d, unit_span, stored);
      continue;
    }
    const int64_t kept = kept_fitted_rows(seg, before);
    GrowthMemo memo = kept > 0 ? memo_of(memos, seg.begin) : GrowthMemo{};
    grow_rows(*seg.format, x, seg.begin, kept, seg.end, d, unit_span, stored, &memo);
    next.segments.emplace_back(seg.begin, std::move(memo));
  }
  estimate_key_segments(unit, x, d, unit_span, estimated);
  if (unit.window.active()) {
    const FormatPtr& w = unit.window.format;
    if (w->splits_at_groups()) {
      roundtrip_rows(*w, x, first_window_row(before, T_before, unit), T, d, unit_span, window);
    } else {
      const bool kept = before.window.active() && same_format(before.window.format, w);
      next.window = kept && memos ? memos->window : GrowthMemo{};
      grow_rows(*w, x, 0, kept ? T_before : 0, T, d, unit_span, window, &next.window);
    }
  }
  if (memos) *memos = std::move(next);
}

double TensorQuantization::relative_mse() const {
  return nonfinite ? INFINITY : (norm2 > 0 ? err2 / norm2 : 0.0);
}

double TensorQuantization::snr_db() const {
  return nonfinite ? -INFINITY : (err2 > 0 ? 10.0 * std::log10(norm2 / err2) : INFINITY);
}

TensorQuantization quantize_tensor(const Tensor& x, const Format& f, int64_t rows_per_span, Kind kind, uint64_t seed,
                                   const SpanSource& source, const Tensor* key_pre_rope) {
  const int64_t d = x.shape.back();
  const int64_t rows = d > 0 ? x.numel() / d : 0;
  if (rows_per_span < 1) throw Error("internal: quantize_tensor needs rows_per_span >= 1");
  TensorQuantization r;
  r.dequantized = Tensor(x.shape);
  for (int64_t s = 0, r0 = 0; r0 < rows; ++s, r0 += rows_per_span) {
    const int64_t n = std::min(rows_per_span, rows - r0);
    const std::string bad = f.check_shape(n, d);
    if (!bad.empty()) throw ConfigError("format '" + f.name() + "' on " + source.name + ": " + bad);
    const SpanInfo span =
        unit_span(source, 0, s, kind, seed, key_pre_rope ? key_pre_rope->ptr() + r0 * d : nullptr, d);
    const ConstMatView in{x.ptr() + r0 * d, n, d, d};
    f.roundtrip(in, MatView{r.dequantized.ptr() + r0 * d, n, d, d}, span);
    f.encode(in, span, r.codes);
    r.clipped += f.clipped_values(in, span);
    r.storage_bits += f.storage_bits(n, d);
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double a = x.data[i], b = r.dequantized.data[i];
    if (!std::isfinite(b)) {
      ++r.nonfinite;
      r.max_abs = INFINITY;
      continue;
    }
    r.err2 += (a - b) * (a - b);
    r.norm2 += a * a;
    r.max_abs = std::max(r.max_abs, std::fabs(a - b));
  }
  return r;
}

}  // namespace kvb
