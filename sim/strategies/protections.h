// Protections shared by every strategy type (methods.md §3), defined once here and
// applied in this order before a strategy's allocator spends what is left of the
// budget on the remaining ("open") cells:
//   1. sink heads: the N lowest-entropy KV heads (entropy over the calibration
//      queries, GQA-aggregated), or those with entropy below a threshold, stored
//      whole at a keep format;
//   2. sink tokens: the first N positions, or the N tokens receiving most attention
//      on the calibration queries (over all heads, or per KV head), at a keep format;
//   3. a recency window relative to each query (sliding or chunked, replacing or an
//      extra copy; see sim/plan.h), on every unit that is not a sink head;
//   4. the prompt: queries before it attend exactly (prefill) and windows only hold
//      tokens after it, so the prompt is stored quantized (HF QuantizedCache).
// Each count, format and window setting is per kind (key_/value_ variants).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sim/plan.h"
#include "sim/strategies/statistics.h"
#include "sim/strategies/strategy.h"

namespace kvb {

// The parameter definitions every strategy type includes.
const std::vector<ParamDef>& protection_params();
// points.csv columns the protections add: sink_heads_selected, sink_tokens_selected.
const std::vector<std::string>& protection_columns();

struct KindProtections {
  int64_t sink_heads = 0;                     // count, lowest entropy first
  std::optional<double> sink_head_threshold;  // bits: heads with entropy below it
  FormatPtr sink_head_format;
  int64_t sink_tokens = 0;
  FormatPtr sink_token_format;
  int64_t window = 0;  // tokens; 0 = none
  FormatPtr window_format;
  RecentWindow::Mode window_mode = RecentWindow::Mode::Sliding;
  bool window_extra_copy = false;

  bool selects_sink_heads() const { return sink_heads > 0 || sink_head_threshold.has_value(); }
  // A recency window of `size` tokens with this kind's window format, mode and copy rule.
  RecentWindow window_of(int64_t size) const {
    RecentWindow w;
    w.size = size;
    w.format = window_format;
    w.mode = window_mode;
    w.extra_copy = window_extra_copy;
    return w;
  }
};

class Protections {
 public:
  enum class TokenSelect { First, Attention };
  enum class TokenScope { Global, Head };

  // Reads protection_params(); throws kvb::ConfigError on a bad combination.
  static Protections from_params(const Params& p);

  const KindProtections& kind(Kind k) const { return kinds_[static_cast<int>(k)]; }
  EntropyKind entropy() const { return entropy_; }
  EntropyAverage entropy_average() const { return entropy_average_; }
  GqaAggregate gqa() const { return gqa_; }
  bool needs_statistics() const;
  bool any() const;

  // A plan of the recording's shape with the protections applied. Every cell they
  // leave to the allocator is an open segment: role Allocated, format nullptr.
  // Annotates the selected sink heads/tokens. Throws kvb::Error when a count exceeds
  // what the recording has.
  Plan apply(const StrategyInput& in) const;

  // Prompt length (prefill) for a recording of T tokens.
  int64_t prompt_tokens(int64_t T) const;

 private:
  KindProtections kinds_[2];
  TokenSelect token_select_ = TokenSelect::First;
  TokenScope token_scope_ = TokenScope::Global;
  EntropyKind entropy_ = EntropyKind::Renyi2;
  EntropyAverage entropy_average_ = EntropyAverage::Mean;
  GqaAggregate gqa_ = GqaAggregate::Mean;
  int64_t prompt_ = 0;
  double prompt_fraction_ = 0;
};

// Whether a segment still needs a format from the allocator.
inline bool is_open(const Segment& s) { return s.format == nullptr; }

// Splits every open segment that straddles `boundary` in two (phase strategies).
void split_open_segments(Plan& plan, int64_t boundary);

// Formats every open segment with `format` (fixed-format strategies).
void fill_open_segments(Plan& plan, Kind kind, const FormatPtr& format);

// The KV heads a strategy reads statistics from must exist: throws kvb::Error when
// `in.stats` is missing.
RecordingStats& require_stats(const StrategyInput& in, const std::string& who);

}  // namespace kvb
