#include "sim/metrics/paired.h"

#include <cmath>
#include <limits>

#include "sim/core/error.h"

namespace kvb {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Tag mixed into the seed of the paired draws ("pairdiff"), a stream of its own.
constexpr uint64_t kPairedTag = 0x7061697264696666ull;

double finish_of(const MetricDef& metric, double ratio) {
  double (*finish)(double) = metric.level == MetricLevel::Model ? metric.samples.finish : metric.rows.finish;
  return finish ? finish(ratio) : ratio;
}

size_t sample_count(const SampleReduction& s, const ModelStats& m) {
  return s.unit == SampleReduction::Unit::Problems ? m.answers_correct.size() : m.nll.size();
}

BlockSums attention_block_sums(const RowReduction& red, const std::vector<AttentionRow>& rows) {
  BlockSums out;
  if (rows.empty()) return out;
  const RowBlocks g = group_rows_into_blocks(rows);
  out.num.assign(g.blocks(), 0.0);
  out.den.assign(g.blocks(), 0.0);
  for (size_t b = 0; b < g.blocks(); ++b)
    for (size_t j = g.start[b]; j < g.start[b + 1]; ++j) {
      out.num[b] += red.numerator(rows[g.order[j]]);
      out.den[b] += red.denominator(rows[g.order[j]]);
    }
  return out;
}

// Blocks of consecutive samples (positions: the bootstrap's block length; problems:
// one each, since problems are independent).
BlockSums sample_block_sums(const SampleReduction& s, const ModelStats& m) {
  BlockSums out;
  const size_t n = sample_count(s, m);
  if (n == 0) return out;
  const size_t per_block = s.unit == SampleReduction::Unit::Problems
                               ? 1
                               : static_cast<size_t>(bootstrap_block_positions(static_cast<int64_t>(n)));
  const size_t blocks = (n + per_block - 1) / per_block;
  out.num.assign(blocks, 0.0);
  out.den.assign(blocks, 0.0);
  for (size_t i = 0; i < n; ++i) {
    out.num[i / per_block] += s.value(m, i);
    out.den[i / per_block] += 1;
  }
  return out;
}

}  // namespace

BlockSums metric_block_sums(const MetricDef& metric, const ErrorStats& stats) {
  if (metric.level == MetricLevel::Attention && metric.rows.kind == RowReduction::Kind::RatioOfSums)
    return attention_block_sums(metric.rows, stats.rows);
  if (metric.level == MetricLevel::Model && metric.samples.value) return sample_block_sums(metric.samples, stats.model);
  return {};
}

double metric_from_block_sums(const MetricDef& metric, const BlockSums& sums) {
  if (sums.empty()) return kNaN;
  double num = 0, den = 0;
  for (size_t b = 0; b < sums.num.size(); ++b) {
    num += sums.num[b];
    den += sums.den[b];
  }
  return finish_of(metric, den > 0 ? num / den : 0.0);
}

PairedDifference paired_difference(const MetricDef& metric, const BlockSums& a, const BlockSums& b,
                                   const BootstrapSettings& settings) {
  PairedDifference d;
  d.value = metric_from_block_sums(metric, b) - metric_from_block_sums(metric, a);
  d.interval = {kNaN, kNaN};
  if (a.empty() || b.empty() || a.num.size() != b.num.size() || a.den.size() != a.num.size() ||
      b.den.size() != b.num.size())
    return d;
  if (settings.resamples < 1) throw Error("paired bootstrap: resamples must be >= 1");
  if (!(settings.level > 0 && settings.level < 1)) throw Error("paired bootstrap: level must be in (0, 1)");
  const size_t blocks = a.num.size();
  const size_t resamples = static_cast<size_t>(settings.resamples);
  const std::vector<uint32_t> draws = bootstrap_draws(settings, blocks, kPairedTag);
  std::vector<double> diffs(resamples);
  for (size_t r = 0; r < resamples; ++r) {
    const uint32_t* pick = draws.data() + r * blocks;
    double num_a = 0, den_a = 0, num_b = 0, den_b = 0;
    for (size_t k = 0; k < blocks; ++k) {
      num_a += a.num[pick[k]];
      den_a += a.den[pick[k]];
      num_b += b.num[pick[k]];
      den_b += b.den[pick[k]];
    }
    diffs[r] = finish_of(metric, den_b > 0 ? num_b / den_b : 0.0) - finish_of(metric, den_a > 0 ? num_a / den_a : 0.0);
  }
  const double tail = (1 - settings.level) / 2;
  d.interval.lo = quantile(diffs, tail);
  d.interval.hi = quantile_in_place(diffs, 1 - tail);
  d.comparable = true;
  return d;
}

std::string paired_verdict(const MetricDef& metric, const PairedDifference& d) {
  if (!d.comparable || std::isnan(d.interval.lo) || std::isnan(d.interval.hi)) return "not comparable";
  if (d.interval.lo <= 0 && d.interval.hi >= 0) return "no measurable difference";
  const bool higher = d.interval.lo > 0;
  return higher == (metric.better == Better::Higher) ? "better" : "worse";
}

}  // namespace kvb
