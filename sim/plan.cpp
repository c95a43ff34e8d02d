#include "sim/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <utility>

#include "sim/core/error.h"
#include "sim/window_rule.h"

namespace kvb {

Plan::Plan(int64_t layers, int64_t kv_heads, int64_t tokens, int64_t head_dim)
    : layers_(layers), kv_heads_(kv_heads), tokens_(tokens), head_dim_(head_dim),
      units_(static_cast<size_t>(layers * kv_heads * 2)) {}

void Plan::assign_all(Kind kind, const FormatPtr& format) {
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t g = 0; g < kv_heads_; ++g) unit(l, g, kind).segments = {Segment{0, tokens_, format}};
}

bool RecentWindow::holds(int64_t t, int64_t j, int64_t first) const {
  return active() && j <= t && j >= window_first_held(size, mode == Mode::Chunked, t, first);
}

int64_t RecentWindow::held_at(int64_t context, int64_t first) const {
  if (!active() || context <= first) return 0;
  if (mode == Mode::Sliding) return std::min(size, context - first);
  return (context - 1 - first) % size + 1;
}

int64_t open_group_begin(int64_t tokens_per_group, int64_t origin, int64_t t) {
  if (tokens_per_group == 1) return t + 1;
  if (tokens_per_group <= 0) return origin;
  return window_first_held(tokens_per_group, true, t, origin);
}

int64_t open_group_begin(const UnitPlan& unit, int64_t t) {
  // The segment holding t: the last one that begins at or before it.
  auto after = std::upper_bound(unit.segments.begin(), unit.segments.end(), t,
                                [](int64_t token, const Segment& s) { return token < s.begin; });
  if (after == unit.segments.begin()) return t + 1;
  const Segment& s = *std::prev(after);
  if (t >= s.end || !s.format) return t + 1;
  return open_group_begin(s.format->tokens_per_group(), s.begin, t);
}

RowVersions row_versions(const UnitPlan& unit, int64_t prefill, int64_t t) {
  RowVersions v;
  v.all_exact = t < prefill;
  v.residual_window = unit.window.active();
  v.residual_begin = open_group_begin(unit, t);
  if (v.residual_window)
    v.residual_begin = std::min(v.residual_begin, window_first_held(unit.window.size,
                                                                    unit.window.mode == RecentWindow::Mode::Chunked,
                                                                    t, prefill));
  return v;
}

namespace {

// The first token of the group that holds t among groups of `size` tokens from `origin`
// (t >= origin): window_first_held(size, true, t, origin), remembered so that the next
// position in the same group costs no division (ascending positions: one per group).
class GroupStart {
 public:
  int64_t at(int64_t size, int64_t origin, int64_t t) {
    if (size != size_ || origin != origin_ || t < begin_ || t >= begin_ + size) {
      size_ = size;
      origin_ = origin;
      begin_ = window_first_held(size, true, t, origin);
    }
    return begin_;
  }

 private:
  int64_t size_ = 0, origin_ = 0, begin_ = 0;
};

}  // namespace

void residual_begins(const UnitPlan& unit, int64_t prefill, const int32_t* positions, size_t n, int32_t* out) {
  const bool window = unit.window.active();
  const bool chunked = unit.window.mode == RecentWindow::Mode::Chunked;
  const std::vector<Segment>& segments = unit.segments;
  GroupStart open_group, window_chunk;
  // The segment cursor: segments[next] is the first that begins after the last position.
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = positions[i];
    if (next > 0 && t < segments[next - 1].begin) next = 0;  // positions went back: search again
    while (next < segments.size() && segments[next].begin <= t) ++next;
    // open_group_begin(unit, t): t + 1 when t is in no segment, past its end, kept
    // exact, or in a format that quantizes tokens one by one.
    int64_t begin = t + 1;
    if (next > 0) {
      const Segment& s = segments[next - 1];
      const int64_t tokens_per_group = s.format && t < s.end ? s.format->tokens_per_group() : 1;
      if (tokens_per_group > 1) begin = open_group.at(tokens_per_group, s.begin, t);
      else if (tokens_per_group <= 0) begin = s.begin;  // one group over the whole segment
    }
    if (window) {
      const int64_t held = chunked && t >= prefill ? window_chunk.at(unit.window.size, prefill, t)
                                                   : window_first_held(unit.window.size, chunked, t, prefill);
      begin = std::min(begin, held);
    }
    out[i] = static_cast<int32_t>(begin);
  }
}

bool reads_residual(const UnitPlan& unit, int64_t prefill) {
  if (prefill > 0 || unit.window.active()) return true;
  for (const Segment& s : unit.segments)
    if (s.format && s.format->tokens_per_group() != 1) return true;
  return false;
}

namespace {

// The segment that grows (or shrinks) with the context: the last one that is not a
// protected sink token (the allocator's bulk, a second phase, a whole sink head).
// Sink tokens keep their token counts at any context. A unit made only of sink
// tokens stretches its last one. Returns segments.size() for a unit without segments.
size_t stretching_segment(const std::vector<Segment>& segments) {
  for (size_t i = segments.size(); i-- > 0;)
    if (segments[i].role != SegmentRole::SinkToken) return i;
  return segments.empty() ? 0 : segments.size() - 1;
}

int64_t overlap(int64_t b0, int64_t e0, int64_t b1, int64_t e1) {
  return std::max<int64_t>(0, std::min(e0, e1) - std::max(b0, b1));
}

}  // namespace

uint64_t Plan::segment_bits(const UnitPlan& u, int64_t seg_begin, int64_t seg_end, const Format& format,
                            int64_t context) const {
  return segment_bits_from(u, seg_begin, seg_end, format, context, 0);
}

uint64_t Plan::segment_bits_from(const UnitPlan& u, int64_t seg_begin, int64_t seg_end, const Format& format,
                                 int64_t context, int64_t from) const {
  // Tokens [0, stored_end) are stored (a replacing window holds the rest). At a
  // context up to T a segment keeps its positions, cut at the context; beyond T only
  // the stretching segment gains the new tokens [T, context), counted as one run with
  // its own tokens (unit_at gives them a segment of their own when a sink token follows,
  // so formats grouped along tokens, int*-ch*, may differ there by one group's metadata).
  //
  // The residual of the last query t = context - 1: the window's tokens [window_from,
  // context) and the group of `format` open at t when this segment holds t
  // ([group_from, context), methods.md §3). A replacing window (or none) stores tokens
  // [0, min(window_from, group_from)); an extra-copy window leaves the quantized cache
  // every closed group, [0, group_from). Open tokens outside the window are held at
  // the residual precision and counted here. A sliding layer holds only the tokens
  // [from, context): everything is cut there.
  const int64_t held = std::min(u.window.held_at(context, prefill_), context - from);
  const int64_t window_from = context - held, t = context - 1;
  const size_t stretch = stretching_segment(u.segments);
  const bool stretches = context > tokens_ && stretch < u.segments.size() && u.segments[stretch].begin == seg_begin;
  int64_t group_from = context;  // no open group in this segment
  if (stretches)  // t is in the stretched run: one run with the segment's tokens when it is the last segment
    group_from = open_group_begin(format.tokens_per_group(),
                                  &u.segments[stretch] == &u.segments.back() ? seg_begin : tokens_, t);
  else if (seg_begin <= t && t < seg_end)
    group_from = open_group_begin(format.tokens_per_group(), seg_begin, t);
  const int64_t stored_end = u.window.extra_copy ? group_from : std::min(window_from, group_from);
  int64_t tokens = overlap(seg_begin, std::min(seg_end, context), from, stored_end);
  if (stretches) tokens += overlap(tokens_, context, from, stored_end);
  uint64_t bits = tokens > 0 ? format.storage_bits(tokens, head_dim_) : 0;
  if (const int64_t open = window_from - std::max(group_from, from); open > 0)
    bits += u.window.active() ? u.window.format->storage_bits(open, head_dim_)
                              : static_cast<uint64_t>(kResidualBitsWithoutWindow * open * head_dim_);
  return bits;
}

uint64_t Plan::window_bits(const UnitPlan& u, int64_t context) const {
  const int64_t held = u.window.held_at(context, prefill_);
  return held > 0 ? u.window.format->storage_bits(held, head_dim_) : 0;
}

void Plan::set_attention_windows(std::vector<int64_t> windows) {
  if (!windows.empty() && static_cast<int64_t>(windows.size()) != layers_)
    throw Error("internal: " + std::to_string(windows.size()) + " attention windows for a plan of " +
                std::to_string(layers_) + " layers");
  for (int64_t w : windows)
    if (w < 0) throw Error("internal: negative attention window " + std::to_string(w));
  attention_windows_ = std::move(windows);
}

int64_t Plan::held_tokens(int64_t layer, int64_t context) const {
  const int64_t w = attention_windows_.empty() ? 0 : attention_windows_[static_cast<size_t>(layer)];
  return w > 0 ? std::min(w, context) : context;
}

uint64_t Plan::storage_bits_at(int64_t context) const {
  uint64_t bits = 0;
  for (int64_t l = 0; l < layers_; ++l) {
    const int64_t from = context - held_tokens(l, context);
    for (int64_t g = 0; g < kv_heads_; ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = unit(l, g, kind);
        for (const Segment& s : u.segments) bits += segment_bits_from(u, s.begin, s.end, *s.format, context, from);
        const int64_t held = std::min(u.window.held_at(context, prefill_), context - from);
        if (held > 0) bits += u.window.format->storage_bits(held, head_dim_);
      }
  }
  return bits;
}

namespace {

// Segments of a part of a unit that holds `part_tokens` tokens, fitted to `length`
// tokens by storage_bits_at's rule: cut at `length`, or, beyond `part_tokens`, the
// tokens [part_tokens, length) join the stretching segment (its end is extended when
// it is the last segment, else they form a segment of their own).
std::vector<Segment> fit_segments(const std::vector<Segment>& segments, int64_t part_tokens, int64_t length) {
  std::vector<Segment> out;
  for (const Segment& s : segments) {
    Segment at = s;
    at.end = std::min(s.end, length);
    at.begin = std::min(s.begin, length);
    if (at.end > at.begin) out.push_back(at);
  }
  if (length > part_tokens && !segments.empty()) {
    const Segment& grow = segments[stretching_segment(segments)];
    if (&grow == &segments.back())
      out.back().end = length;
    else
      out.push_back(Segment{part_tokens, length, grow.format, grow.role});
  }
  return out;
}

// The segments of `u` within [begin, end), cut there and moved by `shift` tokens.
std::vector<Segment> segments_within(const UnitPlan& u, int64_t begin, int64_t end, int64_t shift) {
  std::vector<Segment> out;
  for (const Segment& s : u.segments) {
    const int64_t b = std::max(s.begin, begin), e = std::min(s.end, end);
    if (e > b) out.push_back(Segment{b + shift, e + shift, s.format, s.role});
  }
  return out;
}

}  // namespace

UnitPlan Plan::unit_at(int64_t layer, int64_t kv_head, Kind kind, int64_t context) const {
  const UnitPlan& u = unit(layer, kv_head, kind);
  UnitPlan out;
  out.window = u.window;
  out.segments = fit_segments(u.segments, tokens_, context);
  return out;
}

UnitPlan Plan::unit_at(int64_t layer, int64_t kv_head, Kind kind, int64_t context,
                       std::optional<int64_t> second_phase) const {
  if (!phase_boundary_ || second_phase == phase_boundary_) return unit_at(layer, kv_head, kind, context);
  const int64_t b = *phase_boundary_;
  const UnitPlan& u = unit(layer, kv_head, kind);
  UnitPlan out;
  out.window = u.window;
  const int64_t first_end = second_phase ? std::min(*second_phase, context) : context;
  out.segments = fit_segments(segments_within(u, 0, b, 0), b, first_end);
  if (second_phase && *second_phase < context) {
    const std::vector<Segment> second =
        fit_segments(segments_within(u, b, tokens_, -b), tokens_ - b, context - *second_phase);
    for (const Segment& s : second)
      out.segments.push_back(Segment{s.begin + *second_phase, s.end + *second_phase, s.format, s.role});
  }
  return out;
}

bool Plan::stores_tokens_alike() const {
  for (const UnitPlan& u : units_) {
    if (u.window.active()) return false;
    for (const Segment& s : u.segments)
      if (!s.format || !u.segments.front().format || s.format->name() != u.segments.front().format->name() ||
          s.format->tokens_per_group() != 1)
        return false;
  }
  return true;
}

void Plan::set_annotation(const std::string& name, std::variant<double, std::string> value) {
  for (Annotation& a : annotations_)
    if (a.name == name) {
      a.value = std::move(value);
      return;
    }
  annotations_.push_back({name, std::move(value)});
}

double Plan::bpe_at(int64_t context) const {
  int64_t held = 0;  // tokens held, summed over layers
  for (int64_t l = 0; l < layers_; ++l) held += held_tokens(l, context);
  const double elements = 2.0 * static_cast<double>(kv_heads_ * head_dim_) * static_cast<double>(held);
  return elements > 0 ? static_cast<double>(storage_bits_at(context)) / elements : 0.0;
}

double Plan::mean_bpe_read(const std::vector<int64_t>& positions) const {
  if (positions.empty()) return std::nan("");
  // The same make-up at every length: bpe_at is bpe() at every t + 1.
  if (prefill_ == 0 && stores_tokens_alike()) return bpe();
  double sum = 0;
  for (int64_t t : positions)
    sum += t < prefill_ ? static_cast<double>(kResidualBitsWithoutWindow) : bpe_at(t + 1);
  return sum / static_cast<double>(positions.size());
}

std::string Plan::check() const {
  if (prefill_ < 0 || prefill_ > tokens_)
    return "prefill " + std::to_string(prefill_) + " outside [0, " + std::to_string(tokens_) + "]";
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t g = 0; g < kv_heads_; ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = unit(l, g, kind);
        std::ostringstream where;
        where << "layer " << l << " kv_head " << g << " " << kind_name(kind);
        int64_t next = 0;
        for (const Segment& s : u.segments) {
          if (!s.format) return where.str() + ": segment without a format";
          if (s.begin != next || s.end <= s.begin)
            return where.str() + ": segments must cover tokens [0, " + std::to_string(tokens_) +
                   ") in order without gaps (segment [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + "))";
          const std::string bad = s.format->check_shape(s.end - s.begin, head_dim_);
          if (!bad.empty()) return where.str() + ": " + s.format->name() + ": " + bad;
          if (kind == Kind::Value && s.format->keys_only())
            return where.str() + ": " + s.format->name() +
                   " stores keys only (a sketch for attention logits); give values another format";
          next = s.end;
        }
        if (next != tokens_)
          return where.str() + ": segments end at token " + std::to_string(next) + ", not " + std::to_string(tokens_);
        if (u.window.size < 0) return where.str() + ": negative window size";
        if (u.window.size > 0 && !u.window.format) return where.str() + ": window without a format";
        if (u.window.size > 0) {
          const std::string bad = u.window.format->check_shape(tokens_, head_dim_);
          if (!bad.empty()) return where.str() + ": window format " + u.window.format->name() + ": " + bad;
        }
        if (u.window.active() && u.window.format->keys_only())
          return where.str() + ": window format " + u.window.format->name() +
                 " stores keys only (a sketch for attention logits); windows are read as decoded keys and values, "
                 "give the window another format";
      }
  return {};
}

std::string Plan::describe() const {
  std::map<std::string, int64_t> k_count, v_count;
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t g = 0; g < kv_heads_; ++g) {
      for (const Segment& s : unit(l, g, Kind::Key).segments) k_count[s.format->name()] += s.end - s.begin;
      for (const Segment& s : unit(l, g, Kind::Value).segments) v_count[s.format->name()] += s.end - s.begin;
    }
  auto list = [](const std::map<std::string, int64_t>& m) {
    std::string out;
    for (const auto& [name, n] : m) out += (out.empty() ? "" : "+") + name;
    return out;
  };
  std::string out = "K:" + list(k_count) + " V:" + list(v_count);
  for (Kind kind : {Kind::Key, Kind::Value}) {
    int64_t windows = 0, sink_heads = 0;
    const RecentWindow* first = nullptr;
    for (int64_t l = 0; l < layers_; ++l)
      for (int64_t g = 0; g < kv_heads_; ++g) {
        const UnitPlan& u = unit(l, g, kind);
        if (u.window.active() && !first) first = &u.window;
        windows += u.window.active() ? 1 : 0;
        sink_heads += (!u.segments.empty() && u.segments.front().role == SegmentRole::SinkHead) ? 1 : 0;
      }
    if (first)
      out += std::string(" ") + kind_name(kind) + "window:" + std::to_string(first->size) + "x" + first->format->name() +
             (first->mode == RecentWindow::Mode::Chunked ? "/chunked" : "/sliding") + (first->extra_copy ? "/copy" : "") +
             (windows < layers_ * kv_heads_ ? "(" + std::to_string(windows) + " units)" : "");
    if (sink_heads > 0) out += std::string(" ") + kind_name(kind) + "sink_heads:" + std::to_string(sink_heads);
  }
  if (prefill_ > 0) out += " prefill:" + std::to_string(prefill_);
  // Sliding layers, grouped by window: " sliding:W16(layers 0,2-3)".
  std::map<int64_t, std::vector<int64_t>> sliding;
  for (size_t l = 0; l < attention_windows_.size(); ++l)
    if (attention_windows_[l] > 0) sliding[attention_windows_[l]].push_back(static_cast<int64_t>(l));
  for (const auto& [w, layers] : sliding) {
    std::string list;
    for (size_t i = 0; i < layers.size();) {
      size_t j = i;
      while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
      list += (list.empty() ? "" : ",") + std::to_string(layers[i]) +
              (j > i ? "-" + std::to_string(layers[j]) : std::string());
      i = j + 1;
    }
    out += " sliding:W" + std::to_string(w) + "(layers " + list + ")";
  }
  return out;
}

}  // namespace kvb
