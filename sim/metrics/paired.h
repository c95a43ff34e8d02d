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
#include <cstdint>
#include <string>
#include <vector>

#include "sim/metrics/bootstrap.h"
#include "sim/metrics/metric_table.h"

namespace kvb {

// Per-block sums of one metric: num[b], den[b] for block b. Empty: not pairable.
// Measured on several sequences (recordings or texts, methods.md §4 "Several
// sequences"), the blocks of sequence 0 come first, then those of sequence 1, ...;
// sequence_blocks[s] is how many belong to sequence s (empty: one sequence).
struct BlockSums {
  std::vector<double> num, den;
  std::vector<uint32_t> sequence_blocks;
  bool empty() const { return num.empty(); }
  size_t sequences() const { return sequence_blocks.empty() ? 1 : sequence_blocks.size(); }
};

// The block sums of one metric on each sequence, joined in sequence order (each
// input one sequence). Empty when any is empty (the metric is not pairable on some
// sequence); a single input is returned as it is.
BlockSums join_sequences(const std::vector<BlockSums>& per_sequence);

// The metric's block sums on `stats` (empty when the metric is not pairable or the
// stats hold none of its samples).
BlockSums metric_block_sums(const MetricDef& metric, const ErrorStats& stats);
// metric_block_sums of each metric, aligned with `metrics`, the rows grouped into
// blocks once for all of them (the grouping sorts every row's position).
// `blocks` (optional): position_blocks(stats.rows), when the caller has it.
std::vector<BlockSums> metric_block_sums(const std::vector<const MetricDef*>& metrics, const ErrorStats& stats,
                                         const PositionBlocks* blocks = nullptr);
// finish(Σ num / Σ den) over all blocks: the metric's value up to summation order.
// Over several sequences: the mean over sequences of that value on each sequence's
// blocks (each sequence weighs the same).
double metric_from_block_sums(const MetricDef& metric, const BlockSums& sums);

// The mean of `values` summed from the first (so that one value is returned bit for
// bit, its sign of zero included); NaN when empty.
double mean_over_sequences(const std::vector<double>& values);

// Resamples of a two-level (hierarchical) bootstrap of metric(b) − metric(a) over
// sequences and blocks (a == nullptr: of metric(b) alone). Resample r draws S
// sequences uniformly with replacement (S = b.sequences()); the k-th drawn sequence
// then draws as many of its blocks as it has, with replacement, from a stream of its
// own for slot k, the same for a and b (paired); the resample's value is the mean
// over the S drawn sequences of finish(Σ num / Σ den) on their drawn blocks. With one
// sequence this is the one-level block bootstrap exactly (slot 0's stream is
// bootstrap_draws(settings, blocks, tag)). Empty when a sequence has fewer than
// kMinIntervalUnits blocks (bootstrap.h: too few to resample). Throws kvb::Error when a
// and b are not made of the same sequences and block counts.
std::vector<double> two_level_resamples(const MetricDef& metric, const BlockSums* a, const BlockSums& b,
                                        const BootstrapSettings& settings, uint64_t tag);

struct PairedDifference {
  double value = 0;    // metric(b) − metric(a)
  Interval interval;   // percentile bootstrap interval of the difference; NaN when not comparable
  bool comparable = false;
};

// metric(b) − metric(a) and its paired bootstrap interval (`settings`: resamples,
// level, seed): two_level_resamples, so over several sequences both the sequences
// and the blocks within each are resampled. Not comparable when either is empty, when
// their sequences or block counts differ (the points were not measured on the same
// positions and sequences), or when a sequence has fewer than kMinIntervalUnits blocks
// (or problems): too few to tell a difference from chance.
PairedDifference paired_difference(const MetricDef& metric, const BlockSums& a, const BlockSums& b,
                                   const BootstrapSettings& settings);

// "better" / "worse" (B against A, in the metric's direction) when the interval
// excludes zero, "no measurable difference" when it holds zero, "not comparable".
std::string paired_verdict(const MetricDef& metric, const PairedDifference& d);

}  // namespace kvb
