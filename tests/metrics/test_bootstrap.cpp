// The bootstrap intervals of the attention metrics (sim/metrics/bootstrap.h): block
// layout, determinism, agreement of the row reductions with the metrics, and coverage
// on synthetic rows whose mean is known.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "sim/metrics/bootstrap.h"
#include "sim/metrics/metric_table.h"
#include "test_util.h"

using namespace kvb;

namespace {

// Rows of `layers` x `heads` x `positions` (positions 0, stride, 2·stride, ...), in
// (layer, head, position) order like the simulator's. KL = mean + 0.5·a_t + 0.3·e: a_t
// is a stationary AR(1) along positions (φ = 0.5, unit variance) shared by every layer
// and head of a position, e independent per row; E[KL] = mean exactly. The other
// fields are positive and vary by row.
std::vector<AttentionRow> synthetic_rows(uint64_t seed, double mean, int layers, int heads, int positions,
                                         int stride = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> shared(static_cast<size_t>(positions));
  double a = normal(rng);
  for (double& s : shared) {
    s = a;
    a = 0.5 * a + std::sqrt(0.75) * normal(rng);
  }
  std::vector<AttentionRow> rows;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < positions; ++p) {
        AttentionRow r;
        r.layer = l;
        r.q_head = h;
        r.position = p * stride;
        r.kl = static_cast<float>(mean + 0.5 * shared[static_cast<size_t>(p)] + 0.3 * normal(rng));
        r.topk_overlap = static_cast<float>(std::clamp(0.8 + 0.1 * normal(rng), 0.0, 1.0));
        r.out_norm2 = static_cast<float>(1.0 + std::fabs(normal(rng)));
        r.out_err2 = static_cast<float>(0.01 * r.out_norm2 * (1.0 + std::fabs(normal(rng))));
        r.logit_err2 = static_cast<float>((r.position + 1) * 0.02 * (1.0 + std::fabs(normal(rng))));
        r.logit_err_max = static_cast<float>(0.2 + std::fabs(normal(rng)));
        rows.push_back(r);
      }
  return rows;
}

std::vector<const MetricDef*> attention_metrics() {
  std::vector<const MetricDef*> out;
  for (const MetricDef& m : metric_table())
    if (m.level == MetricLevel::Attention) out.push_back(&m);
  return out;
}

ErrorStats stats_of(std::vector<AttentionRow> rows) {
  ErrorStats s;
  for (const AttentionRow& r : rows) s.logit_pairs += r.position + 1;
  s.rows = std::move(rows);
  return s;
}

}  // namespace

TEST_CASE("bootstrap: blocks of ceil(cbrt(positions)) consecutive positions") {
  CHECK(bootstrap_block_positions(1) == 1);
  CHECK(bootstrap_block_positions(8) == 2);
  CHECK(bootstrap_block_positions(9) == 3);
  CHECK(bootstrap_block_positions(512) == 8);
  CHECK(bootstrap_block_positions(513) == 9);
  CHECK(bootstrap_blocks(0) == 0);
  CHECK(bootstrap_blocks(1) == 1);
  CHECK(bootstrap_blocks(10) == 4);  // 3 + 3 + 3 + 1
  CHECK(bootstrap_blocks(512) == 64);
}

TEST_CASE("bootstrap: every attention metric has a row reduction that gives its value") {
  const ErrorStats s = stats_of(synthetic_rows(1, 0.2, 2, 3, 50, 3));
  for (const MetricDef* m : attention_metrics()) {
    INFO(m->name);
    REQUIRE(m->rows.kind != RowReduction::Kind::None);
    CHECK(reduce_rows(m->rows, s.rows) == doctest::Approx(m->compute(s)).epsilon(1e-12));
  }
  // Tensor and model metrics have none: their intervals are not over query positions.
  for (const MetricDef& m : metric_table())
    if (m.level != MetricLevel::Attention) CHECK(m.rows.kind == RowReduction::Kind::None);
}

TEST_CASE("bootstrap: deterministic for a seed, independent of row order, NaN where undefined") {
  const std::vector<const MetricDef*> metrics = attention_metrics();
  const ErrorStats s = stats_of(synthetic_rows(2, 0.2, 2, 2, 100));
  BootstrapSettings settings;
  settings.seed = 7;
  const std::vector<Interval> a = bootstrap_intervals(s, metrics, settings);
  const std::vector<Interval> b = bootstrap_intervals(s, metrics, settings);
  REQUIRE(a.size() == metrics.size());
  for (size_t m = 0; m < metrics.size(); ++m) {
    INFO(metrics[m]->name);
    CHECK(a[m].lo == b[m].lo);
    CHECK(a[m].hi == b[m].hi);
    CHECK(a[m].lo <= a[m].hi);
    CHECK(a[m].hi <= reduce_rows(metrics[m]->rows, s.rows) * 4 + 1);  // finite and of the metric's scale
  }
  // The max of resampled blocks never exceeds the max of all rows.
  const auto max_at = std::find_if(metrics.begin(), metrics.end(), [](auto* m) { return m->name == "attn_kl_max"; });
  CHECK(a[static_cast<size_t>(max_at - metrics.begin())].hi <= (*max_at)->compute(s));
  // Rows in another order (position-major): the same blocks, so the same intervals up
  // to summation order.
  ErrorStats shuffled = s;
  std::stable_sort(shuffled.rows.begin(), shuffled.rows.end(),
                   [](const AttentionRow& x, const AttentionRow& y) { return x.position < y.position; });
  const std::vector<Interval> c = bootstrap_intervals(shuffled, metrics, settings);
  for (size_t m = 0; m < metrics.size(); ++m) {
    CHECK(c[m].lo == doctest::Approx(a[m].lo).epsilon(1e-12));
    CHECK(c[m].hi == doctest::Approx(a[m].hi).epsilon(1e-12));
  }
  // Another seed draws other blocks.
  settings.seed = 8;
  const std::vector<Interval> d = bootstrap_intervals(s, metrics, settings);
  CHECK((d[2].lo != a[2].lo || d[2].hi != a[2].hi));
  // One position is one block: every resample would be the sample itself, so no interval
  // (the fewer-than-kMinIntervalUnits rule, tested below).
  const ErrorStats single = stats_of(synthetic_rows(3, 0.2, 2, 2, 1));
  for (const Interval& i : bootstrap_intervals(single, metrics, settings)) CHECK(std::isnan(i.lo));
  // No rows, or a metric without a row reduction: NaN.
  const std::vector<Interval> none = bootstrap_intervals(ErrorStats{}, metrics, settings);
  CHECK(std::isnan(none[0].lo));
  const std::vector<Interval> tensor = bootstrap_intervals(s, {find_metric("k_rel_mse")}, settings);
  CHECK(std::isnan(tensor[0].lo));
  CHECK(std::isnan(tensor[0].hi));
  settings.resamples = 0;
  CHECK_THROWS(bootstrap_intervals(s, metrics, settings));
}

TEST_CASE("bootstrap: the same resamples on any thread count, inside a parallel loop or not") {
  // The resamples run as OpenMP tasks: in a region of their own, or, inside a parallel
  // loop (a sweep finalizing a point), on the threads that wait at its end.
  const std::vector<const MetricDef*> metrics = attention_metrics();
  const ErrorStats s = stats_of(synthetic_rows(4, 0.2, 2, 3, 150));
  BootstrapSettings settings;
  settings.seed = 11;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<std::vector<double>> one_thread;
  const std::vector<Interval> a = bootstrap_intervals(s, metrics, settings, &one_thread);
  omp_set_num_threads(3);
  std::vector<std::vector<double>> three_threads;
  const std::vector<Interval> b = bootstrap_intervals(s, metrics, settings, &three_threads);
  std::vector<std::vector<std::vector<double>>> in_loop(4);
#pragma omp parallel for schedule(dynamic, 1)
  for (int i = 0; i < 4; ++i) (void)bootstrap_intervals(s, metrics, settings, &in_loop[static_cast<size_t>(i)]);
  omp_set_num_threads(saved);
  auto same_bits = [](const std::vector<double>& x, const std::vector<double>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
  };
  const auto p99 = std::find_if(metrics.begin(), metrics.end(), [](auto* m) { return m->name == "attn_kl_p99"; });
  REQUIRE(p99 != metrics.end());
  CHECK(one_thread[static_cast<size_t>(p99 - metrics.begin())].size() == static_cast<size_t>(settings.resamples));
  for (size_t m = 0; m < metrics.size(); ++m) {
    INFO(metrics[m]->name);
    CHECK(std::memcmp(&a[m].lo, &b[m].lo, sizeof(double)) == 0);
    CHECK(std::memcmp(&a[m].hi, &b[m].hi, sizeof(double)) == 0);
    CHECK(same_bits(one_thread[m], three_threads[m]));
    for (const auto& loop : in_loop) CHECK(same_bits(one_thread[m], loop[m]));
  }
}

TEST_CASE("bootstrap: a scratch reused from call to call, across sizes, changes no bit") {
  // What a sweep does from point to point (BootstrapScratch from a pool): the intervals
  // and resamples with the scratch equal those without, whatever it held before.
  const std::vector<const MetricDef*> metrics = attention_metrics();
  const ErrorStats big = stats_of(synthetic_rows(5, 0.3, 3, 4, 400)), small = stats_of(synthetic_rows(6, 0.1, 1, 2, 37));
  BootstrapSettings settings;
  settings.seed = 3;
  BootstrapScratch scratch;
  for (const ErrorStats* s : {&big, &small, &big}) {
    std::vector<std::vector<double>> plain, reused;
    const std::vector<Interval> a = bootstrap_intervals(*s, metrics, settings, &plain);
    const std::vector<Interval> b = bootstrap_intervals(*s, metrics, settings, &reused, &scratch);
    REQUIRE(a.size() == b.size());
    for (size_t m = 0; m < a.size(); ++m) {
      CHECK(std::memcmp(&a[m], &b[m], sizeof(Interval)) == 0);
      CHECK(plain[m] == reused[m]);  // NaN-free here (the NaN case: the test above)
    }
  }
}

TEST_CASE("bootstrap: position_blocks puts each row in the block group_rows_into_blocks lists it in") {
  std::vector<AttentionRow> rows = synthetic_rows(8, 0.2, 2, 3, 90, 3);  // positions 0, 3, ..., 267
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(2));
  const PositionBlocks block_of = position_blocks(rows);
  const RowBlocks grouped = group_rows_into_blocks(rows);
  REQUIRE(block_of.blocks == grouped.blocks());
  CHECK(block_of.blocks == static_cast<size_t>(bootstrap_blocks(90)));
  for (size_t b = 0; b < grouped.blocks(); ++b)
    for (size_t j = grouped.start[b]; j < grouped.start[b + 1]; ++j) {
      CHECK(block_of(rows[grouped.order[j]]) == b);
      if (j > grouped.start[b]) CHECK(grouped.order[j] > grouped.order[j - 1]);  // row order within a block
    }
  CHECK(position_blocks({}).blocks == 0);
}

TEST_CASE("bootstrap: the 95 % interval of attn_kl_mean covers the known mean about 95 % of the time") {
  const std::vector<const MetricDef*> metric = {find_metric("attn_kl_mean")};
  constexpr double kMean = 0.25;
  constexpr int kTrials = 200;
  int covered = 0;
  double width = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const ErrorStats s = stats_of(synthetic_rows(100 + static_cast<uint64_t>(trial), kMean, 2, 2, 512));
    BootstrapSettings settings;
    settings.seed = static_cast<uint64_t>(trial);
    const Interval i = bootstrap_intervals(s, metric, settings)[0];
    covered += i.lo <= kMean && kMean <= i.hi;
    width += (i.hi - i.lo) / kTrials;
  }
  // 200 trials: a binomial SE of 1.5 points around 95 %.
  CHECK(covered >= static_cast<int>(0.88 * kTrials));
  CHECK(covered <= static_cast<int>(0.99 * kTrials));
  // The interval is about ±1.96 SE of the mean wide. With a_t shared by the 4 rows of a
  // position and AR(1) along positions, Var(mean) ≈ 0.25·(1 + φ)/(1 − φ)/512 +
  // 0.09/2048: SE ≈ 0.038, so a width of about 0.15 (blocks of 8 positions catch most
  // of the autocorrelation: a bit less).
  CHECK(width > 0.10);
  CHECK(width < 0.18);
}

namespace {

// Rows' values in `blocks` blocks of uneven sizes (1 to 2·mean_size), rounded to
// `levels` distinct values when levels > 0 (ties), and their block starts.
struct BlockedValues {
  std::vector<double> values;
  std::vector<size_t> start{0};
};
BlockedValues blocked_values(uint64_t seed, size_t blocks, size_t mean_size, int levels) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> e(1.0);
  BlockedValues out;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t n = 1 + rng() % (2 * mean_size);
    for (size_t i = 0; i < n; ++i) {
      double v = e(rng);
      if (levels > 0) v = std::round(v * levels) / levels;
      out.values.push_back(v);
    }
    out.start.push_back(out.values.size());
  }
  return out;
}

// Both paths on every resample, compared bit for bit (NaN with NaN).
void check_same_resamples(const BlockedValues& d, double q, uint64_t seed) {
  BootstrapSettings s;
  s.seed = seed;
  const size_t blocks = d.start.size() - 1;
  const std::vector<uint32_t> draws = bootstrap_draws(s, blocks, 7);
  std::vector<double> fast(static_cast<size_t>(s.resamples)), plain(fast.size());
  detail::resample_quantiles(d.values, d.start, q, draws, fast);
  detail::resample_quantiles_gathered(d.values, d.start, q, draws, 0, plain.size(), plain);
  size_t differing = 0;
  for (size_t r = 0; r < fast.size(); ++r) {
    const bool same = (std::isnan(fast[r]) && std::isnan(plain[r])) || fast[r] == plain[r];
    if (!same && differing++ < 3) {
      CAPTURE(r);
      CHECK(fast[r] == plain[r]);
    }
  }
  CHECK(differing == 0);
}

}  // namespace

TEST_CASE("bootstrap: the quantiles of resamples, walked from the sorted tail, equal the gathered rows'") {
  for (double q : {0.99, 0.999, 0.9, 0.5, 0.1, 0.01}) {
    CAPTURE(q);
    check_same_resamples(blocked_values(1, 40, 300, 0), q, 1);    // distinct values
    check_same_resamples(blocked_values(2, 13, 900, 4), q, 2);    // many ties
    check_same_resamples(blocked_values(3, 3, 2, 0), q, 3);       // a handful of rows
  }
  SUBCASE("a block holding a NaN makes every resample that draws it NaN") {
    BlockedValues d = blocked_values(4, 30, 200, 0);
    d.values[d.start[5] + 1] = std::nan("");
    check_same_resamples(d, 0.99, 4);
  }
  SUBCASE("resamples that miss the tail's blocks are gathered") {
    // 20 blocks of 600 rows, the 1200 largest values in blocks 0 and 1: the kept tail
    // is max(1024, 4 x 1 % of the rows) = 1024 values, all theirs, so each resample that
    // draws neither (about one in eight) must look past it.
    BlockedValues d;
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (size_t b = 0; b < 20; ++b) {
      for (int i = 0; i < 600; ++i) d.values.push_back(u(rng) + (b < 2 ? 100.0 : 0.0));
      d.start.push_back(d.values.size());
    }
    check_same_resamples(d, 0.99, 5);
    check_same_resamples(d, 0.01, 5);
  }
  SUBCASE("infinities") {
    BlockedValues d = blocked_values(6, 25, 100, 0);
    d.values[d.start[3]] = INFINITY;
    d.values[d.start[7] + 2] = -INFINITY;
    check_same_resamples(d, 0.99, 6);
    check_same_resamples(d, 0.01, 6);
  }
}

TEST_CASE("bootstrap: fewer than kMinIntervalUnits blocks of positions give no interval and no resamples") {
  const std::vector<const MetricDef*> metrics = attention_metrics();
  BootstrapSettings settings;
  settings.seed = 5;
  // 12 positions: blocks of 3, 4 blocks (one short of the rule); 13 positions: 5 blocks.
  REQUIRE(kMinIntervalUnits == 5);
  REQUIRE(bootstrap_blocks(12) == 4);
  REQUIRE(bootstrap_blocks(13) == 5);
  for (int positions : {1, 2, 8, 12}) {
    INFO(positions, " positions");
    const ErrorStats few = stats_of(synthetic_rows(4, 0.2, 2, 2, positions));
    std::vector<std::vector<double>> resamples;
    const std::vector<Interval> none = bootstrap_intervals(few, metrics, settings, &resamples);
    for (size_t m = 0; m < metrics.size(); ++m) {
      INFO(metrics[m]->name);
      CHECK(std::isnan(none[m].lo));
      CHECK(std::isnan(none[m].hi));
      CHECK(resamples[m].empty());  // nothing for a bootstrap over sequences to pool
    }
  }
  const ErrorStats enough = stats_of(synthetic_rows(4, 0.2, 2, 2, 13));
  std::vector<std::vector<double>> resamples;
  const std::vector<Interval> some = bootstrap_intervals(enough, metrics, settings, &resamples);
  for (size_t m = 0; m < metrics.size(); ++m) {
    INFO(metrics[m]->name);
    CHECK(std::isfinite(some[m].lo));
    CHECK(std::isfinite(some[m].hi));
    CHECK(resamples[m].size() == static_cast<size_t>(settings.resamples));
  }
}
