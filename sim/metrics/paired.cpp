#include "sim/metrics/paired.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

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

// `block_of`: position_blocks(rows). Each row is added to its block in row order (a
// block's rows in the order group_rows_into_blocks lists them).
BlockSums attention_block_sums(const RowReduction& red, const std::vector<AttentionRow>& rows,
                               const PositionBlocks& block_of) {
  BlockSums out;
  if (rows.empty()) return out;
  out.num.assign(block_of.blocks, 0.0);
  out.den.assign(block_of.blocks, 0.0);
  for (const AttentionRow& r : rows) {
    const uint32_t b = block_of(r);
    out.num[b] += red.numerator(r);
    out.den[b] += red.denominator(r);
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

// Whether the metric's block sums come from the attention rows.
bool sums_attention_rows(const MetricDef& metric) {
  return metric.level == MetricLevel::Attention && metric.rows.kind == RowReduction::Kind::RatioOfSums;
}

// metric_block_sums with the rows' blocks (`block_of`: position_blocks of stats.rows,
// read only when the metric sums attention rows and there are some).
BlockSums metric_block_sums(const MetricDef& metric, const ErrorStats& stats, const PositionBlocks& block_of) {
  if (sums_attention_rows(metric)) return attention_block_sums(metric.rows, stats.rows, block_of);
  if (metric.level == MetricLevel::Model && metric.samples.value) return sample_block_sums(metric.samples, stats.model);
  return {};
}

}  // namespace

BlockSums metric_block_sums(const MetricDef& metric, const ErrorStats& stats) {
  const bool need_rows = sums_attention_rows(metric) && !stats.rows.empty();
  return metric_block_sums(metric, stats, need_rows ? position_blocks(stats.rows) : PositionBlocks{});
}

std::vector<BlockSums> metric_block_sums(const std::vector<const MetricDef*>& metrics, const ErrorStats& stats,
                                         const PositionBlocks* blocks) {
  const bool need_rows = !stats.rows.empty() && std::any_of(metrics.begin(), metrics.end(), [](const MetricDef* m) {
    return sums_attention_rows(*m);
  });
  PositionBlocks own_blocks;
  if (!blocks) {
    if (need_rows) own_blocks = position_blocks(stats.rows);
    blocks = &own_blocks;
  }
  std::vector<BlockSums> out;
  out.reserve(metrics.size());
  for (const MetricDef* m : metrics) out.push_back(metric_block_sums(*m, stats, *blocks));
  return out;
}

BlockSums join_sequences(const std::vector<BlockSums>& per_sequence) {
  if (per_sequence.size() == 1) return per_sequence.front();
  BlockSums out;
  for (const BlockSums& s : per_sequence) {
    if (s.empty()) return {};
    if (!s.sequence_blocks.empty()) throw Error("join_sequences: an input already spans several sequences");
    out.num.insert(out.num.end(), s.num.begin(), s.num.end());
    out.den.insert(out.den.end(), s.den.begin(), s.den.end());
    out.sequence_blocks.push_back(static_cast<uint32_t>(s.num.size()));
  }
  return out;
}

double mean_over_sequences(const std::vector<double>& values) {
  if (values.empty()) return kNaN;
  double sum = values[0];
  for (size_t k = 1; k < values.size(); ++k) sum += values[k];
  return sum / static_cast<double>(values.size());
}

namespace {

// [first, end) block range of each sequence of `sums`.
std::vector<size_t> sequence_starts(const BlockSums& sums) {
  std::vector<size_t> start{0};
  if (sums.sequence_blocks.empty()) {
    start.push_back(sums.num.size());
    return start;
  }
  for (uint32_t n : sums.sequence_blocks) start.push_back(start.back() + n);
  if (start.back() != sums.num.size()) throw Error("block sums: sequence_blocks do not add up to the blocks");
  return start;
}

// Stream of slot k of a two-level resample (tag ^ a mix of k; slot 0: tag itself).
uint64_t slot_tag(uint64_t tag, size_t slot) { return tag ^ (static_cast<uint64_t>(slot) * 0x9E3779B97F4A7C15ull); }

// Tag of the sequence draws of a two-level bootstrap ("seqdraws").
constexpr uint64_t kSequenceTag = 0x7365716472617773ull;

}  // namespace

double metric_from_block_sums(const MetricDef& metric, const BlockSums& sums) {
  if (sums.empty()) return kNaN;
  const std::vector<size_t> start = sequence_starts(sums);
  std::vector<double> per_sequence;
  for (size_t s = 0; s + 1 < start.size(); ++s) {
    double num = 0, den = 0;
    for (size_t b = start[s]; b < start[s + 1]; ++b) {
      num += sums.num[b];
      den += sums.den[b];
    }
    per_sequence.push_back(finish_of(metric, den > 0 ? num / den : 0.0));
  }
  return mean_over_sequences(per_sequence);
}

std::vector<double> two_level_resamples(const MetricDef& metric, const BlockSums* a, const BlockSums& b,
                                        const BootstrapSettings& settings, uint64_t tag) {
  if (settings.resamples < 1) throw Error("bootstrap: resamples must be >= 1");
  if (!(settings.level > 0 && settings.level < 1)) throw Error("bootstrap: level must be in (0, 1)");
  const std::vector<size_t> start = sequence_starts(b);
  if (a && (a->num.size() != b.num.size() || a->den.size() != a->num.size() ||
            sequence_starts(*a) != start))
    throw Error("two-level bootstrap: the two points were not measured on the same sequences and blocks");
  if (b.den.size() != b.num.size()) throw Error("block sums: numerators and denominators differ in length");
  const size_t sequences = start.size() - 1;
  for (size_t s = 0; s < sequences; ++s)
    if (!enough_units_for_interval(static_cast<int64_t>(start[s + 1] - start[s]))) return {};
  const size_t resamples = static_cast<size_t>(settings.resamples);
  // Which sequence each slot of each resample takes (one sequence: always 0, no draw).
  std::vector<uint32_t> chosen(resamples * sequences, 0);
  if (sequences > 1) chosen = bootstrap_draws(settings, sequences, tag ^ kSequenceTag);
  // Block draws per (slot, block count): slot k of resample r reads draws[r·blocks ...].
  std::map<std::pair<size_t, size_t>, std::vector<uint32_t>> streams;
  auto stream = [&](size_t slot, size_t blocks) -> const std::vector<uint32_t>& {
    auto [it, fresh] = streams.try_emplace({slot, blocks});
    if (fresh) it->second = bootstrap_draws(settings, blocks, slot_tag(tag, slot));
    return it->second;
  };
  std::vector<double> out(resamples), value_a(sequences), value_b(sequences);
  for (size_t r = 0; r < resamples; ++r) {
    for (size_t k = 0; k < sequences; ++k) {
      const size_t s = chosen[r * sequences + k];
      const size_t first = start[s], blocks = start[s + 1] - start[s];
      const uint32_t* pick = stream(k, blocks).data() + r * blocks;
      double num_a = 0, den_a = 0, num_b = 0, den_b = 0;
      for (size_t j = 0; j < blocks; ++j) {
        const size_t at = first + pick[j];
        if (a) {
          num_a += a->num[at];
          den_a += a->den[at];
        }
        num_b += b.num[at];
        den_b += b.den[at];
      }
      value_b[k] = finish_of(metric, den_b > 0 ? num_b / den_b : 0.0);
      if (a) value_a[k] = finish_of(metric, den_a > 0 ? num_a / den_a : 0.0);
    }
    out[r] = a ? mean_over_sequences(value_b) - mean_over_sequences(value_a) : mean_over_sequences(value_b);
  }
  return out;
}

PairedDifference paired_difference(const MetricDef& metric, const BlockSums& a, const BlockSums& b,
                                   const BootstrapSettings& settings) {
  PairedDifference d;
  d.value = metric_from_block_sums(metric, b) - metric_from_block_sums(metric, a);
  d.interval = {kNaN, kNaN};
  if (a.empty() || b.empty() || a.num.size() != b.num.size() || a.den.size() != a.num.size() ||
      b.den.size() != b.num.size() || a.sequence_blocks != b.sequence_blocks)
    return d;
  std::vector<double> diffs = two_level_resamples(metric, &a, b, settings, kPairedTag);
  if (diffs.empty()) return d;  // too few blocks or problems to resample
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
