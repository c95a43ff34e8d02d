// Paired comparisons (sim/metrics/paired.h): block sums reproduce the metrics, a point
// against itself shows no difference, a consistent shift hidden by overlapping
// separate intervals is found by the paired interval, and points on different
// positions are not compared.
#include <cmath>
#include <random>

#include "sim/metrics/bootstrap.h"
#include "sim/metrics/metric_table.h"
#include "sim/metrics/paired.h"
#include "test_util.h"

using namespace kvb;

namespace {

// 2 layers × 3 heads × `positions` rows whose KL varies a lot from position to
// position (a hard position is hard for every point) plus a little per-row noise;
// `shift` is added to every row's KL.
ErrorStats rows_with_shared_difficulty(int positions, double shift, uint64_t noise_seed) {
  std::mt19937_64 shared_rng(7);  // the same difficulty for every point
  std::mt19937_64 rng(noise_seed);
  std::exponential_distribution<double> difficulty(10.0);
  std::normal_distribution<double> noise(0.0, 0.0005);
  std::vector<double> hard(static_cast<size_t>(positions));
  for (double& h : hard) h = difficulty(shared_rng);
  ErrorStats s;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 3; ++h)
      for (int p = 0; p < positions; ++p) {
        AttentionRow r;
        r.layer = l;
        r.q_head = h;
        r.position = p;
        r.kl = static_cast<float>(hard[static_cast<size_t>(p)] + shift + noise(rng));
        r.out_err2 = static_cast<float>(0.1 + hard[static_cast<size_t>(p)]);
        r.out_norm2 = 1.0f;
        r.topk_overlap = 0.9f;
        s.rows.push_back(r);
      }
  return s;
}

ModelStats model_stats(int positions, double excess, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  ModelStats m;
  for (int t = 0; t < positions; ++t) {
    const double base = 2.0 * u(rng);
    m.nll_base.push_back(base);
    m.nll.push_back(base + excess * u(rng));
    m.kl.push_back(excess * u(rng));
    m.same_top.push_back(u(rng) < 0.9 ? 1 : 0);
  }
  return m;
}

}  // namespace

TEST_CASE("block sums reproduce every pairable metric") {
  ErrorStats s = rows_with_shared_difficulty(100, 0.01, 1);
  s.model = model_stats(300, 0.2, 2);
  s.model.answers_correct = {1, 0, 1, 1};
  s.model.answers_correct_base = {1, 1, 1, 1};
  int pairable = 0;
  for (const MetricDef& m : metric_table()) {
    const BlockSums b = metric_block_sums(m, s);
    if (b.empty()) continue;
    ++pairable;
    CHECK_MESSAGE(metric_from_block_sums(m, b) == doctest::Approx(m.compute(s)).epsilon(1e-9), m.name);
  }
  // attn_kl_mean, topk_overlap, attn_out_rel_err, attn_out_rel_fro, logit_rmse, ppl,
  // ppl_ratio, next_token_kl_mean, same_top_rate, answer_accuracy
  CHECK(pairable >= 10);
  CHECK(metric_block_sums(require_metric("attn_kl_p99", "test"), s).empty());  // quantiles: not pairable
  CHECK(metric_block_sums(require_metric("answer_accuracy", "test"), s).num.size() == 4);  // one block per problem
  // Positions: ⌈300^(1/3)⌉ = 7 per block.
  CHECK(metric_block_sums(require_metric("ppl_ratio", "test"), s).num.size() == 43);
  // Every metric at once (the rows grouped once): the same sums, metric by metric.
  std::vector<const MetricDef*> all;
  for (const MetricDef& m : metric_table()) all.push_back(&m);
  const std::vector<BlockSums> at_once = metric_block_sums(all, s);
  REQUIRE(at_once.size() == all.size());
  for (size_t k = 0; k < all.size(); ++k) {
    const BlockSums one = metric_block_sums(*all[k], s);
    CHECK_MESSAGE((at_once[k].num == one.num && at_once[k].den == one.den), all[k]->name);
  }
  CHECK(metric_block_sums(all, ErrorStats{}).size() == all.size());  // no rows: every metric's sums empty
  for (const BlockSums& b : metric_block_sums(all, ErrorStats{})) CHECK(b.empty());
}

TEST_CASE("a point against itself: zero difference, no measurable difference") {
  const ErrorStats s = rows_with_shared_difficulty(64, 0.0, 3);
  const MetricDef& kl = require_metric("attn_kl_mean", "test");
  const BlockSums b = metric_block_sums(kl, s);
  const PairedDifference d = paired_difference(kl, b, b, BootstrapSettings{});
  CHECK(d.comparable);
  CHECK(d.value == 0.0);
  CHECK(d.interval.lo == 0.0);
  CHECK(d.interval.hi == 0.0);
  CHECK(paired_verdict(kl, d) == "no measurable difference");
}

TEST_CASE("a consistent shift is found although the separate intervals overlap") {
  const MetricDef& kl = require_metric("attn_kl_mean", "test");
  const ErrorStats a = rows_with_shared_difficulty(256, 0.0, 4);
  const ErrorStats b = rows_with_shared_difficulty(256, 0.002, 5);  // 2 % of the mean KL (0.1)
  const BootstrapSettings settings;
  const Interval ia = bootstrap_intervals(a, {&kl}, settings)[0];
  const Interval ib = bootstrap_intervals(b, {&kl}, settings)[0];
  CHECK(ia.hi > ib.lo);  // the separate intervals overlap: "no measurable difference" by overlap
  const PairedDifference d = paired_difference(kl, metric_block_sums(kl, a), metric_block_sums(kl, b), settings);
  CHECK(d.value == doctest::Approx(0.002).epsilon(0.05));
  CHECK(d.interval.lo > 0);
  CHECK(d.interval.lo <= d.value);
  CHECK(d.interval.hi >= d.value);
  CHECK(paired_verdict(kl, d) == "worse");  // lower is better for KL
  const PairedDifference reverse =
      paired_difference(kl, metric_block_sums(kl, b), metric_block_sums(kl, a), settings);
  CHECK(paired_verdict(kl, reverse) == "better");
  // Deterministic for a seed.
  const PairedDifference again = paired_difference(kl, metric_block_sums(kl, a), metric_block_sums(kl, b), settings);
  CHECK(again.interval.lo == d.interval.lo);
  CHECK(again.interval.hi == d.interval.hi);
}

TEST_CASE("higher-is-better metrics and model metrics") {
  ErrorStats a, b;
  a.model = model_stats(400, 0.05, 6);
  b.model = a.model;
  for (double& v : b.model.kl) v *= 3;  // the same positions, three times the KL
  for (uint8_t& v : b.model.same_top) v = 0;
  const MetricDef& kl = require_metric("next_token_kl_mean", "test");
  const MetricDef& top = require_metric("same_top_rate", "test");
  CHECK(paired_verdict(kl, paired_difference(kl, metric_block_sums(kl, a), metric_block_sums(kl, b), {})) ==
        "worse");
  CHECK(paired_verdict(top, paired_difference(top, metric_block_sums(top, a), metric_block_sums(top, b), {})) ==
        "worse");
  CHECK(paired_verdict(top, paired_difference(top, metric_block_sums(top, b), metric_block_sums(top, a), {})) ==
        "better");
}

TEST_CASE("points measured on different positions are not compared") {
  const MetricDef& kl = require_metric("attn_kl_mean", "test");
  const BlockSums a = metric_block_sums(kl, rows_with_shared_difficulty(64, 0.0, 8));
  const BlockSums b = metric_block_sums(kl, rows_with_shared_difficulty(125, 0.0, 9));
  const PairedDifference d = paired_difference(kl, a, b, {});
  CHECK_FALSE(d.comparable);
  CHECK(std::isnan(d.interval.lo));
  CHECK(paired_verdict(kl, d) == "not comparable");
  CHECK(paired_verdict(kl, paired_difference(kl, a, BlockSums{}, {})) == "not comparable");
}

TEST_CASE("fewer than kMinIntervalUnits blocks or problems: not comparable, however large the difference") {
  const BootstrapSettings settings;
  // Attention: 12 positions make 4 blocks, 13 make 5; b is twice as bad as a everywhere.
  const MetricDef& kl = require_metric("attn_kl_mean", "test");
  auto kl_blocks = [&](int positions, double shift, uint64_t seed) {
    return metric_block_sums(kl, rows_with_shared_difficulty(positions, shift, seed));
  };
  for (int positions : {1, 12}) {
    INFO(positions, " positions");
    const PairedDifference d = paired_difference(kl, kl_blocks(positions, 0.0, 10), kl_blocks(positions, 0.1, 11), settings);
    CHECK(d.value > 0.05);  // the measured difference stays
    CHECK_FALSE(d.comparable);
    CHECK(std::isnan(d.interval.lo));
    CHECK(std::isnan(d.interval.hi));
    CHECK(paired_verdict(kl, d) == "not comparable");
  }
  CHECK(paired_verdict(kl, paired_difference(kl, kl_blocks(13, 0.0, 10), kl_blocks(13, 0.1, 11), settings)) == "worse");

  // Model metrics: 64 next-token positions are 16 blocks of 4; 8 are 4 blocks of 2.
  const MetricDef& token_kl = require_metric("next_token_kl_mean", "test");
  ErrorStats a, b;
  a.model = model_stats(8, 0.05, 12);
  b.model = a.model;
  for (double& v : b.model.kl) v *= 3;
  CHECK(paired_verdict(token_kl, paired_difference(token_kl, metric_block_sums(token_kl, a),
                                                   metric_block_sums(token_kl, b), settings)) == "not comparable");
  a.model = model_stats(64, 0.05, 12);
  b.model = a.model;
  for (double& v : b.model.kl) v *= 3;
  CHECK(paired_verdict(token_kl, paired_difference(token_kl, metric_block_sums(token_kl, a),
                                                   metric_block_sums(token_kl, b), settings)) == "worse");

  // An answer task: each problem is a unit. 4 problems all flipped wrong: not comparable;
  // 5: the paired bootstrap resamples them.
  const MetricDef& accuracy = require_metric("answer_accuracy", "test");
  ErrorStats right, wrong;
  right.model.answers_correct = {1, 1, 1, 1};
  wrong.model.answers_correct = {0, 0, 0, 0};
  CHECK(paired_verdict(accuracy, paired_difference(accuracy, metric_block_sums(accuracy, right),
                                                   metric_block_sums(accuracy, wrong), settings)) == "not comparable");
  right.model.answers_correct.push_back(1);
  wrong.model.answers_correct.push_back(0);
  CHECK(paired_verdict(accuracy, paired_difference(accuracy, metric_block_sums(accuracy, right),
                                                   metric_block_sums(accuracy, wrong), settings)) == "worse");
}

TEST_CASE("two-level resamples over sequences need kMinIntervalUnits blocks on each sequence") {
  const MetricDef& kl = require_metric("attn_kl_mean", "test");
  const BlockSums many = metric_block_sums(kl, rows_with_shared_difficulty(64, 0.0, 13));  // 16 blocks
  const BlockSums few = metric_block_sums(kl, rows_with_shared_difficulty(12, 0.0, 14));   // 4 blocks
  REQUIRE(many.num.size() == 16);
  REQUIRE(few.num.size() == 4);
  BootstrapSettings settings;
  CHECK(two_level_resamples(kl, nullptr, join_sequences({many, many}), settings, 1).size() == 200);
  // Enough blocks in all (20) but 4 on one sequence: nothing to resample, not comparable.
  const BlockSums mixed = join_sequences({many, few});
  CHECK(two_level_resamples(kl, nullptr, mixed, settings, 1).empty());
  CHECK_FALSE(paired_difference(kl, mixed, mixed, settings).comparable);
  CHECK(two_level_resamples(kl, nullptr, few, settings, 1).empty());
}
