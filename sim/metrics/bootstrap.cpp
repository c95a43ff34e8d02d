#include "sim/metrics/bootstrap.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
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

// Tag mixed into the seed of the intervals' draws ("bootstra"), so that the stream
// differs from other users of the experiment's seed.
constexpr uint64_t kIntervalTag = 0x626f6f7473747261ull;

}  // namespace

namespace detail {

void resample_quantiles_gathered(const std::vector<double>& values, const std::vector<size_t>& start, double q,
                                 const std::vector<uint32_t>& draws, size_t first, size_t count,
                                 std::vector<double>& resampled) {
  const size_t blocks = start.size() - 1;
  std::vector<double> gathered;
  for (size_t r = first; r < first + count; ++r) {
    const uint32_t* pick = draws.data() + r * blocks;
    gathered.clear();
    for (size_t k = 0; k < blocks; ++k)
      gathered.insert(gathered.end(), values.begin() + static_cast<long>(start[pick[k]]),
                      values.begin() + static_cast<long>(start[pick[k] + 1]));
    resampled[r] = quantile_in_place(gathered, q);
  }
}

void resample_quantiles(const std::vector<double>& values, const std::vector<size_t>& start, double q,
                        const std::vector<uint32_t>& draws, std::vector<double>& resampled,
                        std::vector<TailEntry>* tail_memory) {
  const size_t blocks = start.size() - 1, rows = values.size(), resamples = resampled.size();
  // Each block's NaN (a resample drawing it is NaN), and the tail list: the non-NaN
  // rows nearest the tail q points into, as (value, block), in walk order (descending
  // for q >= 1/2, else ascending), at most `kept` of them.
  using Entry = TailEntry;
  std::vector<char> block_nan(blocks, 0);
  std::vector<Entry> local;
  std::vector<Entry>& tail = tail_memory ? *tail_memory : local;
  tail.clear();
  tail.reserve(rows);
  for (size_t b = 0; b < blocks; ++b)
    for (size_t j = start[b]; j < start[b + 1]; ++j) {
      if (std::isnan(values[j])) block_nan[b] = 1;
      else tail.push_back({values[j], static_cast<uint32_t>(b)});
    }
  const bool from_top = q >= 0.5;
  const double share = from_top ? 1 - q : q;
  const size_t kept_goal = std::max<size_t>(1024, 4 * static_cast<size_t>(std::ceil(share * static_cast<double>(rows))) + 4);
  auto before = [&](const Entry& a, const Entry& b) { return from_top ? a.value > b.value : a.value < b.value; };
  const size_t kept = std::min(kept_goal, tail.size());
  if (kept > 0 && kept < tail.size())
    std::nth_element(tail.begin(), tail.begin() + static_cast<long>(kept - 1), tail.end(), before);
  tail.resize(kept);
  std::sort(tail.begin(), tail.end(), before);

  std::vector<uint32_t> count(blocks);
  for (size_t r = 0; r < resamples; ++r) {
    const uint32_t* pick = draws.data() + r * blocks;
    std::fill(count.begin(), count.end(), 0u);
    size_t n = 0;
    bool nan = false;
    for (size_t k = 0; k < blocks; ++k) {
      ++count[pick[k]];
      n += start[pick[k] + 1] - start[pick[k]];
      nan = nan || block_nan[pick[k]];
    }
    if (n == 0) {
      resampled[r] = 0.0;  // quantile_in_place of nothing
      continue;
    }
    if (nan) {
      resampled[r] = std::nan("");
      continue;
    }
    // Ascending ranks lo and hi = min(lo + 1, n − 1), as quantile_in_place; their
    // ranks counted from the walk's start.
    const double pos = q * static_cast<double>(n - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, n - 1);
    const size_t walk_lo = from_top ? n - 1 - lo : lo, walk_hi = from_top ? n - 1 - hi : hi;
    double a = 0, b = 0;
    size_t seen = 0;  // rows of the resample passed so far
    bool found_lo = false, found_hi = false;
    for (size_t i = 0; i < tail.size() && !(found_lo && found_hi); ++i) {
      seen += count[tail[i].block];
      if (!found_lo && seen > walk_lo) a = tail[i].value, found_lo = true;
      if (!found_hi && seen > walk_hi) b = tail[i].value, found_hi = true;
    }
    if (!(found_lo && found_hi)) {  // beyond the kept tail: gather
      resample_quantiles_gathered(values, start, q, draws, r, 1, resampled);
      continue;
    }
    resampled[r] = a + (pos - static_cast<double>(lo)) * (b - a);
  }
}

}  // namespace detail

PositionBlocks position_blocks(const std::vector<AttentionRow>& rows) {
  // A point's rows repeat a few thousand positions over every layer and head: a table
  // over [min, max] of the positions, not a sort.
  PositionBlocks pb;
  if (rows.empty()) return pb;
  int32_t lowest = rows.front().position, highest = lowest;
  for (const AttentionRow& r : rows) {
    lowest = std::min(lowest, r.position);
    highest = std::max(highest, r.position);
  }
  std::vector<int64_t> rank_of(static_cast<size_t>(static_cast<int64_t>(highest) - lowest + 1), 0);
  for (const AttentionRow& r : rows) rank_of[static_cast<size_t>(r.position - lowest)] = 1;  // present
  int64_t distinct = 0;
  for (int64_t& rank : rank_of) rank = rank ? distinct++ : -1;
  const int64_t per_block = bootstrap_block_positions(distinct);
  pb.lowest = lowest;
  pb.blocks = static_cast<size_t>(bootstrap_blocks(distinct));
  pb.block_of.resize(rank_of.size());
  for (size_t p = 0; p < rank_of.size(); ++p)
    pb.block_of[p] = rank_of[p] < 0 ? 0 : static_cast<uint32_t>(rank_of[p] / per_block);
  return pb;
}

RowBlocks group_rows_into_blocks(const std::vector<AttentionRow>& rows) {
  if (rows.empty()) return RowBlocks{{0}, {}};
  const PositionBlocks block_of = position_blocks(rows);
  RowBlocks g;
  g.start.assign(block_of.blocks + 1, 0);
  for (const AttentionRow& r : rows) ++g.start[block_of(r) + 1];
  std::partial_sum(g.start.begin(), g.start.end(), g.start.begin());
  g.order.resize(rows.size());
  std::vector<size_t> next(g.start.begin(), g.start.end() - 1);
  for (size_t i = 0; i < rows.size(); ++i) g.order[next[block_of(rows[i])]++] = i;
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
                                          std::vector<std::vector<double>>* resamples_out,
                                          BootstrapScratch* scratch, const PositionBlocks* row_blocks) {
  if (resamples_out) resamples_out->assign(metrics.size(), {});
  if (settings.resamples < 1) throw Error("bootstrap: resamples must be >= 1");
  if (!(settings.level > 0 && settings.level < 1)) throw Error("bootstrap: level must be in (0, 1)");
  std::vector<Interval> out(metrics.size(), Interval{kNaN, kNaN});
  const std::vector<AttentionRow>& rows = stats.rows;
  if (rows.empty()) return out;

  // Block sums and maxima add each row to its block in row order; a quantile's values
  // are listed by block, each block's in row order (as group_rows_into_blocks lists
  // them), from the blocks' starts counted once.
  std::optional<PositionBlocks> own_blocks;
  const PositionBlocks& block_of = row_blocks ? *row_blocks : own_blocks.emplace(position_blocks(rows));
  std::vector<size_t> start;  // block b's values: [start[b], start[b + 1])
  const size_t blocks = block_of.blocks;
  if (!enough_units_for_interval(static_cast<int64_t>(blocks))) return out;
  const size_t resamples = static_cast<size_t>(settings.resamples);
  const std::vector<uint32_t> draws = bootstrap_draws(settings, blocks, kIntervalTag);

  const double tail = (1 - settings.level) / 2;
  std::vector<double> resampled(resamples), block_num(blocks), block_den(blocks), local_values;
  std::vector<double>& values = scratch ? scratch->values : local_values;
  for (size_t m = 0; m < metrics.size(); ++m) {
    const RowReduction& red = metrics[m]->rows;
    if (red.kind == RowReduction::Kind::None) continue;
    if (red.kind == RowReduction::Kind::RatioOfSums || red.q >= 1) {
      // Per-block sums (ratio) or maxima (q = 1): a resample is O(blocks).
      const bool ratio = red.kind == RowReduction::Kind::RatioOfSums;
      std::fill(block_num.begin(), block_num.end(), ratio ? 0.0 : -std::numeric_limits<double>::infinity());
      std::fill(block_den.begin(), block_den.end(), 0.0);
      for (const AttentionRow& row : rows) {
        const uint32_t b = block_of(row);
        if (ratio) {
          block_num[b] += red.numerator(row);
          block_den[b] += red.denominator(row);
        } else {
          block_num[b] = nan_max(block_num[b], red.numerator(row));
        }
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
      // A quantile below 1: each resample walks the values sorted once from the tail.
      if (start.empty()) {
        start.assign(blocks + 1, 0);
        for (const AttentionRow& row : rows) ++start[block_of(row) + 1];
        std::partial_sum(start.begin(), start.end(), start.begin());
      }
      values.resize(rows.size());
      std::vector<size_t> next(start.begin(), start.end() - 1);
      for (const AttentionRow& row : rows) values[next[block_of(row)]++] = red.numerator(row);
      detail::resample_quantiles(values, start, red.q, draws, resampled, scratch ? &scratch->tail : nullptr);
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
