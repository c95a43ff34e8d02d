// Confidence intervals of the attention metrics (methods.md §4, "Uncertainty"): a
// percentile bootstrap over blocks of consecutive evaluated query positions. A block
// holds every row (layer, query head) of its positions, so the correlation between
// layers and heads at one position, and between neighbouring positions, stays inside
// a block. Each resample draws as many blocks as there are, uniformly with
// replacement, and repeats the metric's RowReduction on the rows they hold; the
// interval is the (1 − level)/2 and (1 + level)/2 quantiles of the resampled values.
//
// Cost: the blocks' sums (ratio metrics) and maxima are computed once, so a resample
// of those is O(blocks); a quantile below 1 (p99) walks the rows' values, sorted once
// from its tail, O(tail rows) per resample (detail::resample_quantiles).
// Deterministic for a seed: the draws come from a fixed generator (splitmix64), run on
// one thread, and are the same for every point with the same positions (common random
// numbers, so points' intervals are comparable).
#pragma once
#include <cstdint>
#include <vector>

#include "sim/metrics/metric_table.h"

namespace kvb {

// The fewest independent units an interval is computed from: blocks of evaluated query
// positions (the attention metrics' and model metrics' block bootstraps, paired
// differences over blocks), an answer task's problems (paired differences over
// problems), and in the bounds report also Gaussian samples, rows and unit vectors behind
// a standard error. With fewer, a percentile bootstrap says nothing: one block resampled
// is itself (a zero-width "interval"), two or three give a handful of distinct resamples.
// Below it there is no interval ({NaN, NaN}) and no paired verdict ("not comparable").
// Over several sequences the rule holds on each sequence (every sequence has the same
// evaluated positions, and the same problems' count).
constexpr int64_t kMinIntervalUnits = 5;
inline bool enough_units_for_interval(int64_t units) { return units >= kMinIntervalUnits; }

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

// The block of each row's position (the rank of the position among the distinct
// positions, over the block length), from a table over [lowest, highest] of the
// positions: what a pass over the rows in their own order needs to add each row to its
// block (bootstrap_intervals' block sums and maxima, metric_block_sums).
struct PositionBlocks {
  int32_t lowest = 0;
  std::vector<uint32_t> block_of;  // [position - lowest]; positions absent: unused
  size_t blocks = 0;
  uint32_t operator()(const AttentionRow& r) const { return block_of[static_cast<size_t>(r.position - lowest)]; }
};
PositionBlocks position_blocks(const std::vector<AttentionRow>& rows);

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

namespace detail {
// The quantile q < 1 of every resample of blocks (bootstrap_intervals' quantile
// metrics, as quantile_in_place computes it on the resample's rows gathered: NaN when a
// drawn block holds a NaN, else NumPy's interpolation between the order statistics at
// ranks floor(q·(n−1)) and the next over the n rows of the drawn blocks, counted with
// their multiplicities). values: the rows' values in block order (block b is
// [start[b], start[b+1])); draws: bootstrap_draws' (resampled.size() resamples).
// Fast: the values are sorted once from the tail q points into (the largest first for
// q >= 1/2), keeping a few times the tail's share; a resample walks that list adding up
// its draw counts of each value's block until it passes the two ranks, O(tail) instead
// of gathering and selecting among all rows (11 s a point for two p99 metrics over the
// 2.1 million rows of a Llama-3-8B-shaped recording at 2048 positions). A resample whose
// ranks lie beyond the kept list is gathered.
// `tail_memory`: where the tail list is built (reused between calls), or nullptr.
struct TailEntry {
  double value;
  uint32_t block;
};
void resample_quantiles(const std::vector<double>& values, const std::vector<size_t>& start, double q,
                        const std::vector<uint32_t>& draws, std::vector<double>& resampled,
                        std::vector<TailEntry>* tail_memory = nullptr);
// The plain reference it is tested against: resamples [first, first + count) gathered
// and quantile_in_place'd.
void resample_quantiles_gathered(const std::vector<double>& values, const std::vector<size_t>& start, double q,
                                 const std::vector<uint32_t>& draws, size_t first, size_t count,
                                 std::vector<double>& resampled);
}  // namespace detail

// Memory bootstrap_intervals may reuse from one call to the next (a sweep's points,
// 2.1 million rows each at the Llama-3-8B shape): without it each call allocates and
// faults in its row-sized buffers again. Nothing in it changes a result.
struct BootstrapScratch {
  std::vector<double> values;            // a quantile metric's rows' values, by block
  std::vector<detail::TailEntry> tail;   // detail::resample_quantiles' tail list
};

// One interval per metric, aligned with `metrics`; {NaN, NaN} for a metric whose
// RowReduction is Kind::None, when `stats` has no rows, or when the rows' positions
// make fewer than kMinIntervalUnits blocks (no resamples then either). Rows may come in any order
// (they are grouped by the rank of their position among the distinct positions).
// `resamples` (optional) receives, aligned with `metrics`, each metric's resampled
// values in resample order (empty where the interval is NaN): what a bootstrap over
// several sequences draws from (pooled_sequence_resamples). `row_blocks` (optional):
// position_blocks(stats.rows), when the caller has it (a sweep point shares it with
// metric_block_sums).
std::vector<Interval> bootstrap_intervals(const ErrorStats& stats, const std::vector<const MetricDef*>& metrics,
                                          const BootstrapSettings& settings,
                                          std::vector<std::vector<double>>* resamples = nullptr,
                                          BootstrapScratch* scratch = nullptr,
                                          const PositionBlocks* row_blocks = nullptr);

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
