#include "sim/plan.h"

#include <algorithm>
#include <map>
#include <sstream>

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
  return (context - first) % size;
}

bool Plan::has_windows() const {
  for (const UnitPlan& u : units_)
    if (u.window.active()) return true;
  return false;
}

uint64_t Plan::storage_bits_at(int64_t context) const {
  uint64_t bits = 0;
  for (const UnitPlan& u : units_) {
    // Segments that reach the recorded end stretch to `context`; a replacing window
    // takes its tokens out of the stored range.
    const int64_t held = u.window.held_at(context, prefill_);
    const int64_t stored_end = u.window.extra_copy ? context : context - held;
    for (const Segment& s : u.segments) {
      const int64_t end = std::min(s.end >= tokens_ ? context : s.end, stored_end);
      const int64_t begin = std::min(s.begin, stored_end);
      if (end > begin) bits += s.format->storage_bits(end - begin, head_dim_);
    }
    if (held > 0) bits += u.window.format->storage_bits(held, head_dim_);
  }
  return bits;
}

double Plan::bpe_at(int64_t context) const {
  const double elements = 2.0 * static_cast<double>(layers_ * kv_heads_ * head_dim_) * static_cast<double>(context);
  return elements > 0 ? static_cast<double>(storage_bits_at(context)) / elements : 0.0;
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
    const RecentWindow& w = unit(0, 0, kind).window;
    if (w.active())
      out += std::string(" ") + kind_name(kind) + "window:" + std::to_string(w.size) + "x" + w.format->name() +
             (w.mode == RecentWindow::Mode::Chunked ? "/chunked" : "/sliding") + (w.extra_copy ? "/copy" : "");
  }
  if (prefill_ > 0) out += " prefill:" + std::to_string(prefill_);
  return out;
}

}  // namespace kvb
