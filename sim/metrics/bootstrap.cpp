#include "sim/metrics/bootstrap.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "sim/core/error.h"

namespace kvb {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// splitmix64 (Steele, Lea and Flood 2014): the same stream on every platform.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) by multiply-shift (Lemire 2019); the bias is below n / 2^64.
uint32_t uniform_below(uint64_t& state, uint64_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(splitmix64(state)) * n) >> 64);
}

double finish_ratio(const RowReduction& r, double num, double den) {
  const double ratio = den > 0 ? num / den : 0.0;
  return r.finish ? r.finish(ratio) : ratio;
}

// Maximum that keeps a NaN (as quantile() does).
double nan_max(double a, double b) { return std::isnan(a) || a > b ? a : b; }

// Runs body(r) for r = 0 .. n-1 as OpenMP tasks, each writing only its own results.
// Called inside a parallel region (a sweep finalizing a point while the other threads
// wait at the end of its task loop), the team's idle threads take tasks; outside one,
// in a region of its own. Which thread runs r changes nothing: body(r) is one
// resample from fixed inputs.
// At most 4 tasks a thread: libgomp runs a taskloop's tasks undeferred, all on the
// encountering thread, once its team would hold more than 64 a thread.
template <class Body>
void for_each_resample(size_t n, const Body& body) {
  const auto tasks = [&] {
    const size_t count = std::min(n, 4 * static_cast<size_t>(omp_get_num_threads()));
#pragma omp taskloop num_tasks(count)
    for (size_t r = 0; r < n; ++r) body(r);
  };
  if (omp_in_parallel()) {
    tasks();
  } else {
#pragma omp parallel
#pragma omp single
    tasks();
  }
}

// Tag mixed into the seed of the intervals' draws ("bootstra"), so that the stream
// differs from other users of the experiment's seed.
constexpr uint64_t kIntervalTag = 0x626f6f7473747261ull;

}  // namespace

RowBlocks group_rows_into_blocks(const std::vector<AttentionRow>& rows) {
  // Block of each row: the rank of its position among the distinct positions, over
  // the block length.
  std::vector<int32_t> positions;
  positions.reserve(rows.size());
  for (const AttentionRow& r : rows) positions.push_back(r.position);
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  const int64_t per_block = bootstrap_block_positions(static_cast<int64_t>(positions.size()));
  const size_t blocks = static_cast<size_t>(bootstrap_blocks(static_cast<int64_t>(positions.size())));
  std::vector<uint32_t> block_of(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto rank = std::lower_bound(positions.begin(), positions.end(), rows[i].position) - positions.begin();
    block_of[i] = static_cast<uint32_t>(rank / per_block);
  }
  RowBlocks g;
  g.start.assign(blocks + 1, 0);
  for (uint32_t b : block_of) ++g.start[b + 1];
  std::partial_sum(g.start.begin(), g.start.end(), g.start.begin());
  g.order.resize(rows.size());
  std::vector<size_t> next(g.start.begin(), g.start.end() - 1);
  for (size_t i = 0; i < rows.size(); ++i) g.order[next[block_of[i]]++] = i;
  return g;
}

std::vector<uint32_t> bootstrap_draws(const BootstrapSettings& settings, size_t blocks, uint64_t tag) {
  uint64_t state = settings.seed ^ tag;
  std::vector<uint32_t> draws(static_cast<size_t>(settings.resamples) * blocks);
  for (uint32_t& d : draws) d = uniform_below(state, blocks);
  return draws;
}

int64_t bootstrap_block_positions(int64_t positions) {
  int64_t b = 1;
  while (b * b * b < positions) ++b;
  return b;
}

int64_t bootstrap_blocks(int64_t positions) {
  if (positions <= 0) return 0;
  const int64_t b = bootstrap_block_positions(positions);
  return (positions + b - 1) / b;
}

double reduce_rows(const RowReduction& reduction, const std::vector<AttentionRow>& rows) {
  switch (reduction.kind) {
    case RowReduction::Kind::RatioOfSums: {
      double num = 0, den = 0;
      for (const AttentionRow& r : rows) {
        num += reduction.numerator(r);
        den += reduction.denominator(r);
      }
      return finish_ratio(reduction, num, den);
    }
    case RowReduction::Kind::Quantile: {
      std::vector<double> values;
      values.reserve(rows.size());
      for (const AttentionRow& r : rows) values.push_back(reduction.numerator(r));
      return quantile_in_place(values, reduction.q);
    }
    default: return kNaN;
  }
}

std::vector<Interval> bootstrap_intervals(const ErrorStats& stats, const std::vector<const MetricDef*>& metrics,
                                          const BootstrapSettings& settings,
                                          std::vector<std::vector<double>>* resamples_out) {
  if (resamples_out) resamples_out->assign(metrics.size(), {});
  if (settings.resamples < 1) throw Error("bootstrap: resamples must be >= 1");
  if (!(settings.level > 0 && settings.level < 1)) throw Error("bootstrap: level must be in (0, 1)");
  std::vector<Interval> out(metrics.size(), Interval{kNaN, kNaN});
  const std::vector<AttentionRow>& rows = stats.rows;
  if (rows.empty()) return out;

  const RowBlocks grouped = group_rows_into_blocks(rows);
  const std::vector<size_t>& start = grouped.start;
  const std::vector<size_t>& order = grouped.order;
  const size_t blocks = grouped.blocks();
  const size_t resamples = static_cast<size_t>(settings.resamples);
  const std::vector<uint32_t> draws = bootstrap_draws(settings, blocks, kIntervalTag);

  const double tail = (1 - settings.level) / 2;
  std::vector<double> resampled(resamples), block_num(blocks), block_den(blocks), values;
  for (size_t m = 0; m < metrics.size(); ++m) {
    const RowReduction& red = metrics[m]->rows;
    if (red.kind == RowReduction::Kind::None) continue;
    if (red.kind == RowReduction::Kind::RatioOfSums || red.q >= 1) {
      // Per-block sums (ratio) or maxima (q = 1): a resample is O(blocks).
      const bool ratio = red.kind == RowReduction::Kind::RatioOfSums;
      for (size_t b = 0; b < blocks; ++b) {
        double num = ratio ? 0.0 : -std::numeric_limits<double>::infinity(), den = 0;
        for (size_t j = start[b]; j < start[b + 1]; ++j) {
          const AttentionRow& row = rows[order[j]];
          if (ratio) {
            num += red.numerator(row);
            den += red.denominator(row);
          } else {
            num = nan_max(num, red.numerator(row));
          }
        }
        block_num[b] = num;
        block_den[b] = den;
      }
      for (size_t r = 0; r < resamples; ++r) {
        const uint32_t* pick = draws.data() + r * blocks;
        double num = ratio ? 0.0 : -std::numeric_limits<double>::infinity(), den = 0;
        for (size_t k = 0; k < blocks; ++k) {
          if (ratio) {
            num += block_num[pick[k]];
            den += block_den[pick[k]];
          } else {
            num = nan_max(num, block_num[pick[k]]);
          }
        }
        resampled[r] = ratio ? finish_ratio(red, num, den) : num;
      }
    } else {
      // A quantile below 1 gathers the rows of the chosen blocks: O(rows) a resample,
      // the bootstrap's cost (200 resamples of a point's rows), in parallel.
      values.resize(rows.size());
      for (size_t j = 0; j < rows.size(); ++j) values[j] = red.numerator(rows[order[j]]);
      for_each_resample(resamples, [&](size_t r) {
        const uint32_t* pick = draws.data() + r * blocks;
        std::vector<double> gathered;
        gathered.reserve(rows.size());
        for (size_t k = 0; k < blocks; ++k)
          gathered.insert(gathered.end(), values.begin() + static_cast<long>(start[pick[k]]),
                          values.begin() + static_cast<long>(start[pick[k] + 1]));
        resampled[r] = quantile_in_place(gathered, red.q);
      });
    }
    if (resamples_out) (*resamples_out)[m] = resampled;
    out[m].lo = quantile(resampled, tail);
    out[m].hi = quantile_in_place(resampled, 1 - tail);
  }
  return out;
}

Interval percentile_interval(std::vector<double> resamples, double level) {
  if (resamples.empty()) return {kNaN, kNaN};
  const double tail = (1 - level) / 2;
  Interval out;
  out.lo = quantile(resamples, tail);
  out.hi = quantile_in_place(resamples, 1 - tail);
  return out;
}

std::vector<double> pooled_sequence_resamples(const std::vector<std::vector<double>>& pools,
                                              const BootstrapSettings& settings, uint64_t tag) {
  const size_t sequences = pools.size();
  const size_t resamples = static_cast<size_t>(settings.resamples);
  if (sequences == 0) return {};
  for (const std::vector<double>& p : pools) {
    if (p.empty()) return {};
    if (p.size() != resamples)
      throw Error("bootstrap over sequences: a sequence has " + std::to_string(p.size()) + " resamples, not " +
                  std::to_string(resamples));
  }
  const std::vector<uint32_t> chosen = bootstrap_draws(settings, sequences, tag);
  std::vector<double> out(resamples);
  for (size_t r = 0; r < resamples; ++r) {
    double sum = 0;
    for (size_t k = 0; k < sequences; ++k) {
      const double v = pools[chosen[r * sequences + k]][(r + k) % resamples];
      sum = k == 0 ? v : sum + v;
    }
    out[r] = sum / static_cast<double>(sequences);
  }
  return out;
}

}  // namespace kvb
