#include "sim/plan.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace kvb {

Plan::Plan(int64_t layers, int64_t kv_heads, int64_t tokens, int64_t head_dim)
    : layers_(layers), kv_heads_(kv_heads), tokens_(tokens), head_dim_(head_dim),
      units_(static_cast<size_t>(layers * kv_heads * 2)) {}

void Plan::assign_all(Kind kind, const FormatPtr& format) {
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t g = 0; g < kv_heads_; ++g) unit(l, g, kind).segments = {Segment{0, tokens_, format}};
}

namespace {

// A segment of a plan for `tokens` tokens, placed in a sequence of `context` tokens:
// segments reaching the plan's end follow the context's end. Empty when it vanishes.
Segment segment_at(const Segment& s, int64_t tokens, int64_t context) {
  Segment out = s;
  out.end = s.end >= tokens ? context : std::min(s.end, context);
  out.begin = std::min(s.begin, context);
  return out;
}

}  // namespace

uint64_t Plan::storage_bits_at(int64_t context) const {
  uint64_t bits = 0;
  for (const UnitPlan& u : units_) {
    for (const Segment& s : u.segments) {
      const Segment at = segment_at(s, tokens_, context);
      if (at.end > at.begin) bits += s.format->storage_bits(at.end - at.begin, head_dim_);
    }
  }
  return bits;
}

UnitPlan Plan::unit_at(int64_t layer, int64_t kv_head, Kind kind, int64_t context) const {
  UnitPlan out;
  for (const Segment& s : unit(layer, kv_head, kind).segments) {
    const Segment at = segment_at(s, tokens_, context);
    if (at.end > at.begin) out.segments.push_back(at);
  }
  return out;
}

double Plan::bpe_at(int64_t context) const {
  const double elements = 2.0 * static_cast<double>(layers_ * kv_heads_ * head_dim_) * static_cast<double>(context);
  return elements > 0 ? static_cast<double>(storage_bits_at(context)) / elements : 0.0;
}

std::string Plan::check() const {
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
          next = s.end;
        }
        if (next != tokens_)
          return where.str() + ": segments end at token " + std::to_string(next) + ", not " + std::to_string(tokens_);
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
  return "K:" + list(k_count) + " V:" + list(v_count);
}

}  // namespace kvb
