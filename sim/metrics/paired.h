// Paired comparisons of two points measured on the same data (methods.md §4,
// "Uncertainty"): is point B better or worse than point A in a metric, or is the
// difference within what resampling the evaluated positions moves?
//
// Each pairable metric is finish(Σ numerator / Σ denominator) over independent-ish
// samples: the attention metrics' RatioOfSums over blocks of consecutive query
// positions (the bootstrap's blocks, bootstrap.h), the model metrics' means over
// blocks of consecutive next-token positions (SampleReduction) or over single problems
// of an answer task. A point keeps only those per-block sums (BlockSums), so results
// files stay small and `kvbudget merge` can compare points computed on other machines.
//
// The difference's interval is a paired percentile bootstrap: every resample draws the
// same blocks for A and B, so what the two points share (the hard positions, the
// heads that are always worse) cancels, and the interval is much tighter than two
// separate intervals compared by overlap. Metrics without such a form (quantiles,
// maxima, tensor-level metrics, continuation BLEU) are not compared.
#pragma once
#include <string>
#include <vector>

#include "sim/metrics/bootstrap.h"
#include "sim/metrics/metric_table.h"

namespace kvb {

// Per-block sums of one metric: num[b], den[b] for block b. Empty: not pairable.
struct BlockSums {
  std::vector<double> num, den;
  bool empty() const { return num.empty(); }
};

// The metric's block sums on `stats` (empty when the metric is not pairable or the
// stats hold none of its samples).
BlockSums metric_block_sums(const MetricDef& metric, const ErrorStats& stats);
// finish(Σ num / Σ den) over all blocks: the metric's value up to summation order.
double metric_from_block_sums(const MetricDef& metric, const BlockSums& sums);

struct PairedDifference {
  double value = 0;    // metric(b) − metric(a)
  Interval interval;   // percentile bootstrap interval of the difference; NaN when not comparable
  bool comparable = false;
};

// metric(b) − metric(a) and its paired bootstrap interval (`settings`: resamples,
// level, seed). Not comparable when either is empty or their block counts differ
// (the points were not measured on the same positions).
PairedDifference paired_difference(const MetricDef& metric, const BlockSums& a, const BlockSums& b,
                                   const BootstrapSettings& settings);

// "better" / "worse" (B against A, in the metric's direction) when the interval
// excludes zero, "no measurable difference" when it holds zero, "not comparable".
std::string paired_verdict(const MetricDef& metric, const PairedDifference& d);

}  // namespace kvb
