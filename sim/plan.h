// Plan: who gets which precision. For every cache unit (layer, KV head, K or V) a
// list of token-range segments, each stored with one Format. A Plan's memory is
// computed from its formats (Format::storage_bits), never assumed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

struct Segment {
  int64_t begin = 0;  // first token, inclusive
  int64_t end = 0;    // last token, exclusive
  FormatPtr format;
};

struct UnitPlan {
  std::vector<Segment> segments;  // sorted, disjoint, covering [0, T)
};

enum class Kind : int { Key = 0, Value = 1 };
inline const char* kind_name(Kind k) { return k == Kind::Key ? "K" : "V"; }

class Plan {
 public:
  Plan() = default;
  Plan(int64_t layers, int64_t kv_heads, int64_t tokens, int64_t head_dim);

  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t tokens() const { return tokens_; }
  int64_t head_dim() const { return head_dim_; }

  UnitPlan& unit(int64_t layer, int64_t kv_head, Kind kind) { return units_[index(layer, kv_head, kind)]; }
  const UnitPlan& unit(int64_t layer, int64_t kv_head, Kind kind) const {
    return units_[index(layer, kv_head, kind)];
  }
  // Every unit of one kind, e.g. to give all keys one format.
  void assign_all(Kind kind, const FormatPtr& format);

  // Exact storage in bits of the whole cache at the recorded context.
  uint64_t storage_bits() const { return storage_bits_at(tokens_); }
  // The same plan at another context length: segments that reach the recorded end
  // are extended (or cut) to `context`; earlier segments (sinks, a first phase) keep
  // their token counts. This is the "memory at a declared target context" of
  // methods.md §1.
  uint64_t storage_bits_at(int64_t context) const;
  double bpe() const { return bpe_at(tokens_); }
  double bpe_at(int64_t context) const;
  // Bytes of the cache at a context: bpe * elements / 8.
  double bytes_at(int64_t context) const { return static_cast<double>(storage_bits_at(context)) / 8.0; }

  // The unit's segments for a sequence of `context` tokens (a cache that has grown to,
  // or beyond, a different length than the plan's T), by storage_bits_at's rule:
  // segments that reach T are extended (or cut) to `context`; earlier ones keep their
  // tokens, cut at `context`; segments starting at or beyond `context` are dropped.
  // The result covers [0, context). The model's KV cache reconstructs through it.
  UnitPlan unit_at(int64_t layer, int64_t kv_head, Kind kind, int64_t context) const;

  // Empty when every unit's segments cover [0, T) in order with formats that accept
  // the shapes; otherwise the first problem, naming the unit.
  std::string check() const;

  // Distinct format names used, "K:int4-asym-g32 V:int2-asym-g32" style summary.
  std::string describe() const;

 private:
  size_t index(int64_t layer, int64_t kv_head, Kind kind) const {
    return static_cast<size_t>((layer * kv_heads_ + kv_head) * 2 + static_cast<int>(kind));
  }
  int64_t layers_ = 0, kv_heads_ = 0, tokens_ = 0, head_dim_ = 0;
  std::vector<UnitPlan> units_;
};

}  // namespace kvb
