// The bootstrap over several sequences (sim/metrics/bootstrap.h pooled_sequence_resamples,
// sim/metrics/paired.h two_level_resamples; methods.md §4 "Several sequences"): one
// sequence reproduces the one-level block bootstrap bit for bit, a seed gives the same
// resamples every time, and sequences that disagree widen the interval.
#include <cmath>
#include <random>

#include "sim/core/error.h"
#include "sim/metrics/bootstrap.h"
#include "sim/metrics/metric_table.h"
#include "sim/metrics/paired.h"
#include "test_util.h"

using namespace kvb;

namespace {

// `positions` rows (1 layer, 2 heads) whose KL is `level` plus noise of its own seed.
ErrorStats rows_around(int positions, double level, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> noise(50.0);
  ErrorStats s;
  for (int h = 0; h < 2; ++h)
    for (int p = 0; p < positions; ++p) {
      AttentionRow r;
      r.layer = 0;
      r.q_head = h;
      r.position = p;
      r.kl = static_cast<float>(level + noise(rng));
      r.out_err2 = 0.5f;
      r.out_norm2 = 1.0f;
      r.topk_overlap = 0.9f;
      s.rows.push_back(r);
    }
  return s;
}

const MetricDef& kl_mean() { return require_metric("attn_kl_mean", "test"); }

BlockSums sums_of(const ErrorStats& s) { return metric_block_sums(kl_mean(), s); }

double width(const Interval& i) { return i.hi - i.lo; }

}  // namespace

TEST_CASE("two-level resamples of one sequence are the one-level paired block bootstrap, bit for bit") {
  const BlockSums a = sums_of(rows_around(300, 0.02, 1)), b = sums_of(rows_around(300, 0.03, 2));
  BootstrapSettings settings;
  settings.seed = 11;
  const uint64_t tag = 0x1234;
  const std::vector<double> two_level = two_level_resamples(kl_mean(), &a, b, settings, tag);
  // The one-level bootstrap, written out: resample r takes blocks draws[r·blocks + k].
  const size_t blocks = a.num.size();
  const std::vector<uint32_t> draws = bootstrap_draws(settings, blocks, tag);
  REQUIRE(two_level.size() == static_cast<size_t>(settings.resamples));
  for (size_t r = 0; r < two_level.size(); ++r) {
    double na = 0, da = 0, nb = 0, db = 0;
    for (size_t k = 0; k < blocks; ++k) {
      na += a.num[draws[r * blocks + k]];
      da += a.den[draws[r * blocks + k]];
      nb += b.num[draws[r * blocks + k]];
      db += b.den[draws[r * blocks + k]];
    }
    CHECK(two_level[r] == nb / db - na / da);  // exact: the same sums in the same order
  }
  // And the value over all blocks is the metric's.
  CHECK(metric_from_block_sums(kl_mean(), b) == doctest::Approx(kl_mean().compute(rows_around(300, 0.03, 2))));
}

TEST_CASE("pooled resamples of one sequence are that sequence's resamples") {
  const ErrorStats s = rows_around(200, 0.02, 3);
  BootstrapSettings settings;
  settings.seed = 5;
  std::vector<std::vector<double>> resamples;
  const std::vector<Interval> one = bootstrap_intervals(s, {&kl_mean()}, settings, &resamples);
  REQUIRE(resamples.size() == 1);
  REQUIRE(resamples[0].size() == static_cast<size_t>(settings.resamples));
  const std::vector<double> pooled = pooled_sequence_resamples(resamples, settings, 99);
  CHECK(pooled == resamples[0]);
  const Interval again = percentile_interval(pooled, settings.level);
  CHECK(again.lo == one[0].lo);
  CHECK(again.hi == one[0].hi);
}

TEST_CASE("join_sequences keeps each sequence's blocks; the value is the mean over sequences") {
  const BlockSums a = sums_of(rows_around(125, 0.01, 4)), b = sums_of(rows_around(125, 0.05, 5));
  const BlockSums joined = join_sequences({a, b});
  REQUIRE(joined.sequences() == 2);
  CHECK(joined.sequence_blocks == std::vector<uint32_t>{static_cast<uint32_t>(a.num.size()),
                                                        static_cast<uint32_t>(b.num.size())});
  CHECK(joined.num.size() == a.num.size() + b.num.size());
  const double mean = (metric_from_block_sums(kl_mean(), a) + metric_from_block_sums(kl_mean(), b)) / 2;
  CHECK(metric_from_block_sums(kl_mean(), joined) == doctest::Approx(mean).epsilon(1e-14));
  // A sequence where the metric is not pairable leaves nothing to pair.
  CHECK(join_sequences({a, BlockSums{}}).empty());
  // One sequence is itself.
  const BlockSums one = join_sequences({a});
  CHECK(one.num == a.num);
  CHECK(one.sequence_blocks.empty());
}

TEST_CASE("the bootstrap over sequences is deterministic for a seed") {
  const BlockSums joined = join_sequences({sums_of(rows_around(125, 0.01, 6)), sums_of(rows_around(125, 0.02, 7)),
                                           sums_of(rows_around(125, 0.03, 8))});
  BootstrapSettings settings;
  settings.seed = 42;
  const std::vector<double> first = two_level_resamples(kl_mean(), nullptr, joined, settings, 7);
  CHECK(first == two_level_resamples(kl_mean(), nullptr, joined, settings, 7));
  settings.seed = 43;
  CHECK(first != two_level_resamples(kl_mean(), nullptr, joined, settings, 7));
}

TEST_CASE("sequences that disagree widen the interval of the mean") {
  BootstrapSettings settings;
  settings.seed = 3;
  const ErrorStats low = rows_around(216, 0.02, 9), low_again = rows_around(216, 0.02, 10),
                   high = rows_around(216, 0.2, 10);
  // Block sums (two-level over sequences and blocks).
  const Interval agree = percentile_interval(
      two_level_resamples(kl_mean(), nullptr, join_sequences({sums_of(low), sums_of(low_again)}), settings, 1),
      settings.level);
  const Interval disagree = percentile_interval(
      two_level_resamples(kl_mean(), nullptr, join_sequences({sums_of(low), sums_of(high)}), settings, 1),
      settings.level);
  CHECK(width(disagree) > 10 * width(agree));
  // The spread between sequences is in the interval: it reaches both sequences' levels.
  CHECK(disagree.lo < 0.05);
  CHECK(disagree.hi > 0.15);
  // Pools of the block bootstrap's resamples (what points.csv's intervals use).
  std::vector<std::vector<double>> pool_low, pool_low_again, pool_high;
  bootstrap_intervals(low, {&kl_mean()}, settings, &pool_low);
  bootstrap_intervals(low_again, {&kl_mean()}, settings, &pool_low_again);
  bootstrap_intervals(high, {&kl_mean()}, settings, &pool_high);
  const Interval pooled_agree =
      percentile_interval(pooled_sequence_resamples({pool_low[0], pool_low_again[0]}, settings, 2), settings.level);
  const Interval pooled_disagree =
      percentile_interval(pooled_sequence_resamples({pool_low[0], pool_high[0]}, settings, 2), settings.level);
  CHECK(width(pooled_disagree) > 10 * width(pooled_agree));
}

TEST_CASE("paired differences over sequences: the same sequences and blocks for both points") {
  BootstrapSettings settings;
  settings.seed = 1;
  // Point b is point a plus 0.01 on every sequence, while the sequences differ a lot:
  // pairing within each sequence finds the shift.
  const BlockSums a = join_sequences({sums_of(rows_around(216, 0.02, 11)), sums_of(rows_around(216, 0.3, 12))});
  const BlockSums b = join_sequences({sums_of(rows_around(216, 0.03, 11)), sums_of(rows_around(216, 0.31, 12))});
  const PairedDifference d = paired_difference(kl_mean(), a, b, settings);
  REQUIRE(d.comparable);
  CHECK(d.value == doctest::Approx(0.01).epsilon(1e-4));
  CHECK(d.interval.lo > 0);
  CHECK(paired_verdict(kl_mean(), d) == "worse");
  // Measured on other sequences (another split of the blocks): not comparable.
  BlockSums other = b;
  other.sequence_blocks = {other.sequence_blocks[0] + 1, other.sequence_blocks[1] - 1};
  CHECK_FALSE(paired_difference(kl_mean(), a, other, settings).comparable);
  BlockSums one_sequence = b;
  one_sequence.sequence_blocks.clear();
  CHECK_FALSE(paired_difference(kl_mean(), a, one_sequence, settings).comparable);
}

TEST_CASE("pooled resamples refuse pools of the wrong size") {
  BootstrapSettings settings;
  CHECK_THROWS_AS(pooled_sequence_resamples({std::vector<double>(3, 0.0), std::vector<double>(200, 0.0)}, settings, 1),
                  Error);
  CHECK(pooled_sequence_resamples({std::vector<double>(200, 0.0), {}}, settings, 1).empty());
}
