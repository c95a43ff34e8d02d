// The metric table (methods.md §4): every metric a result row can carry, in one list
// that configs, CSV columns, Pareto fronts, budget queries and `kvbudget metrics`
// iterate over. Adding a metric means adding one entry in metric_table.cpp (and, for
// a new per-row quantity, one field of AttentionRow, filled by both simulators:
// sim/simulator.cpp and the CUDA kernels in kernels/attention_rows.cu).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "sim/metrics/error_stats.h"

namespace kvb {

enum class Better { Lower, Higher };
enum class MetricLevel { Tensor, Attention, Model };

struct MetricDef {
  std::string name;
  std::string unit;
  std::string description;
  Better better = Better::Lower;
  MetricLevel level = MetricLevel::Attention;
  double (*compute)(const ErrorStats&) = nullptr;
  // Model level only: the metric reduces greedy continuations, so the data source
  // must generate some ([data] continuations > 0).
  bool needs_continuations = false;
  // Shortest continuation (tokens) the metric is defined on: corpus BLEU-4 needs
  // 4-grams, so continuations of fewer than 4 tokens give it nothing to count.
  int64_t min_continuation_tokens = 0;
  // Whether the metric is defined for continuations of `tokens` tokens.
  bool defined_for(int64_t continuations, int64_t tokens) const {
    return !needs_continuations || (continuations > 0 && tokens >= min_continuation_tokens);
  }
};

const std::vector<MetricDef>& metric_table();
// nullptr if unknown.
const MetricDef* find_metric(std::string_view name);
// Throws kvb::ConfigError naming the closest metric when unknown.
const MetricDef& require_metric(std::string_view name, const std::string& where);

const char* level_name(MetricLevel l);

// Quantile with linear interpolation between order statistics (NumPy's default); NaN
// when any value is NaN.
double quantile(std::vector<double> values, double q);

}  // namespace kvb
