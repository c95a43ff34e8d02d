// point_metrics (sim/metrics/point_metrics.h): a sweep point's figures, one metric per
// thread, are those of the metric functions called one after another, bit for bit, on
// any number of threads; the job beside them runs once, and a failure is rethrown.
#include <omp.h>

#include <cstring>
#include <random>
#include <stdexcept>

#include "sim/core/error.h"
#include "sim/metrics/point_metrics.h"
#include "test_util.h"

using namespace kvb;

namespace {

// layers x heads x positions rows with varied, seeded values (a few NaN-free tails).
ErrorStats rows_of(int layers, int heads, int positions) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> z(0.0f, 1.0f);
  ErrorStats s;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h)
      for (int p = 0; p < positions; ++p) {
        AttentionRow r;
        r.layer = l;
        r.q_head = h;
        r.position = 3 * p;
        r.kl = 1e-3f * std::exp(1.5f * z(rng));
        r.topk_overlap = std::min(1.0f, 0.9f + 0.05f * std::abs(z(rng)));
        r.out_norm2 = 1.0f + 0.1f * std::abs(z(rng));
        r.out_err2 = 1e-2f * r.out_norm2 * std::exp(z(rng));
        r.logit_err2 = 1e-2f * static_cast<float>(r.position + 1) * std::exp(0.5f * z(rng));
        r.logit_err_max = 0.3f * std::exp(0.5f * z(rng));
        s.logit_pairs += r.position + 1;
        s.rows.push_back(r);
      }
  s.k_err2 = s.v_err2 = 1.0;
  s.k_norm2 = s.v_norm2 = 100.0;
  return s;
}

std::vector<const MetricDef*> attention_metrics() {
  std::vector<const MetricDef*> out;
  for (const MetricDef& m : metric_table())
    if (m.level == MetricLevel::Attention) out.push_back(&m);
  return out;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("point_metrics: the metric functions' numbers, bit for bit, on any number of threads") {
  const ErrorStats stats = rows_of(3, 4, 200);
  const std::vector<const MetricDef*> metrics = attention_metrics();
  REQUIRE(metrics.size() >= 6);
  BootstrapSettings settings;
  settings.resamples = 50;
  settings.seed = 7;
  // The reference: each function once over all metrics, one after another.
  std::vector<std::vector<double>> resamples;
  const std::vector<Interval> intervals = bootstrap_intervals(stats, metrics, settings, &resamples);
  const std::vector<BlockSums> sums = metric_block_sums(metrics, stats);
  for (int threads : {1, 2, 5, 64}) {
    CAPTURE(threads);
    PointMetricsOptions options;
    options.bootstrap = settings;
    options.keep_resamples = true;
    options.threads = threads;
    int beside_runs = 0;
    options.beside = [&] { ++beside_runs; };
    std::vector<BootstrapScratch> scratch;
    for (int call = 0; call < 2; ++call) {  // the second call reuses the buffers
      const PointMetrics got = point_metrics(stats, metrics, options, &scratch);
      REQUIRE(got.values.size() == metrics.size());
      for (size_t k = 0; k < metrics.size(); ++k) {
        CAPTURE(metrics[k]->name);
        CHECK(same_bits(got.values[k], metrics[k]->compute(stats)));
        const double se = metrics[k]->standard_error ? metrics[k]->standard_error(stats) : std::nan("");
        CHECK(same_bits(got.standard_errors[k], se));
        CHECK(same_bits(got.intervals[k].lo, intervals[k].lo));
        CHECK(same_bits(got.intervals[k].hi, intervals[k].hi));
        CHECK(got.resamples[k] == resamples[k]);
        CHECK(got.block_sums[k].num == sums[k].num);
        CHECK(got.block_sums[k].den == sums[k].den);
      }
    }
    CHECK(beside_runs == 2);
    CHECK(scratch.size() == metrics.size());
  }
}

TEST_CASE("point_metrics: inside a parallel region it runs on the calling thread, with the same numbers") {
  const ErrorStats stats = rows_of(2, 2, 64);
  const std::vector<const MetricDef*> metrics = attention_metrics();
  PointMetricsOptions options;
  options.threads = 4;
  const PointMetrics outside = point_metrics(stats, metrics, options);
  std::vector<PointMetrics> inside(2);
  std::vector<int> team(2, 0);
#pragma omp parallel for num_threads(2)
  for (int t = 0; t < 2; ++t) {
    PointMetricsOptions mine = options;
    mine.beside = [&team, t] { team[static_cast<size_t>(t)] = omp_get_num_threads(); };
    inside[static_cast<size_t>(t)] = point_metrics(stats, metrics, mine);
  }
  for (size_t t = 0; t < 2; ++t) {
    CHECK(team[t] == 1);  // the jobs ran in a team of one: the caller's thread
    for (size_t k = 0; k < metrics.size(); ++k) {
      CHECK(same_bits(inside[t].values[k], outside.values[k]));
      CHECK(same_bits(inside[t].intervals[k].lo, outside.intervals[k].lo));
    }
  }
}

TEST_CASE("point_metrics: a failing job is rethrown once every job has run") {
  const ErrorStats stats = rows_of(1, 2, 32);
  const std::vector<const MetricDef*> metrics = attention_metrics();
  PointMetricsOptions options;
  options.threads = 3;
  options.beside = [] { throw std::runtime_error("attribution failed"); };
  CHECK_THROWS_WITH_AS(point_metrics(stats, metrics, options), "attribution failed", std::runtime_error);
  options.bootstrap.resamples = 0;  // every metric with an interval fails before `beside`'s error
  int beside_runs = 0;
  options.beside = [&] { ++beside_runs; };  // runs though the metrics before it failed
  CHECK_THROWS_WITH_AS(point_metrics(stats, metrics, options), "bootstrap: resamples must be >= 1", Error);
  CHECK(beside_runs == 1);
}
