// Confidence intervals of the attention metrics (methods.md §4, "Uncertainty"): a
// percentile bootstrap over blocks of consecutive evaluated query positions. A block
// holds every row (layer, query head) of its positions, so the correlation between
// layers and heads at one position, and between neighbouring positions, stays inside
// a block. Each resample draws as many blocks as there are, uniformly with
// replacement, and repeats the metric's RowReduction on the rows they hold; the
// interval is the (1 − level)/2 and (1 + level)/2 quantiles of the resampled values.
//
// Cost: the blocks' sums (ratio metrics) and maxima are computed once, so a resample
// of those is O(blocks); a quantile below 1 (p99) gathers the chosen blocks' rows,
// O(rows) per resample, resamples in parallel (OpenMP tasks). Deterministic for a
// seed and any thread count: the draws come from a fixed generator (splitmix64), run
// on one thread, and are the same for every point with the same positions (common
// random numbers, so points' intervals are comparable); each resample's value depends
// on its draws only.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/metrics/metric_table.h"

namespace kvb {

struct BootstrapSettings {
  int resamples = 200;
  double level = 0.95;  // two-sided coverage of the interval
  uint64_t seed = 0;
};

// Positions per block for `positions` evaluated positions: ⌈positions^(1/3)⌉ (at least
// 1), the usual n^(1/3) rule for block length; the last block may be shorter.
int64_t bootstrap_block_positions(int64_t positions);
// Number of blocks of that length.
int64_t bootstrap_blocks(int64_t positions);

// Rows grouped into the blocks above (by the rank of their position among the
// distinct positions): block b holds rows order[start[b] .. start[b + 1]), in row order.
struct RowBlocks {
  std::vector<size_t> start, order;
  size_t blocks() const { return start.empty() ? 0 : start.size() - 1; }
};
RowBlocks group_rows_into_blocks(const std::vector<AttentionRow>& rows);

// The draws of settings.resamples resamples of `blocks` blocks: resample r takes
// blocks draws[r·blocks + k], k < blocks, uniform with replacement, from a
// splitmix64 stream seeded with settings.seed ^ tag (a fixed tag per use, so that
// uses of one seed draw different streams).
std::vector<uint32_t> bootstrap_draws(const BootstrapSettings& settings, size_t blocks, uint64_t tag);

// One interval per metric, aligned with `metrics`; {NaN, NaN} for a metric whose
// RowReduction is Kind::None, or when `stats` has no rows. Rows may come in any order
// (they are grouped by the rank of their position among the distinct positions).
// `resamples` (optional) receives, aligned with `metrics`, each metric's resampled
// values in resample order (empty where the interval is NaN): what a bootstrap over
// several sequences draws from (pooled_sequence_resamples).
std::vector<Interval> bootstrap_intervals(const ErrorStats& stats, const std::vector<const MetricDef*>& metrics,
                                          const BootstrapSettings& settings,
                                          std::vector<std::vector<double>>* resamples = nullptr);

// The percentile interval of `resamples` at `level`: its (1 − level)/2 and
// (1 + level)/2 quantiles; {NaN, NaN} when empty.
Interval percentile_interval(std::vector<double> resamples, double level);

// A two-level bootstrap of the mean over S sequences of a metric (methods.md §4,
// "Several sequences"), from each sequence's own block bootstrap: pools[s] holds
// sequence s's R resampled values (bootstrap_intervals' `resamples`, R =
// settings.resamples). Resample r draws S sequences uniformly with replacement (a
// splitmix64 stream seeded with settings.seed ^ tag); the k-th draw s contributes
// pools[s][(r + k) mod R], a within-sequence resample of its own, so that a sequence
// drawn twice contributes two independent within-sequence draws and different
// sequences never share a pattern of blocks; the resample is their mean. Empty when
// any pool is empty; throws kvb::Error when a pool does not hold R values.
std::vector<double> pooled_sequence_resamples(const std::vector<std::vector<double>>& pools,
                                              const BootstrapSettings& settings, uint64_t tag);

// A metric's RowReduction applied to `rows` (all of them, once): equals the metric's
// value up to summation order; the bootstrap applies it to resampled rows.
double reduce_rows(const RowReduction& reduction, const std::vector<AttentionRow>& rows);

}  // namespace kvb
