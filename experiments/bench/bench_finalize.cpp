// bench_finalize: a sweep point's host share, what the sweep does once a point's layer
// tasks are done (SweepRun::merge_point, experiments/sweep.cpp), on the rows of one
// point of a given shape. With the CUDA backend it runs on a host thread beside the
// device, and it bounds a GPU sweep's wall time per point whenever it takes longer than
// the device's part (RESULTS.md, "Device session of 2026-11-27 22:39").
//
//   build/bench/bench_finalize [--layers 32] [--q-heads 32] [--positions 2048]
//                              [--repeats 3] [--threads N] [--metrics a,b,...]
//
// Defaults: the Llama-3-8B shape at 2048 positions (2.1 million rows) and
// bench_gpu_peer.sh's six metrics. The rows are synthetic (seeded; log-normal errors):
// the work does not depend on their values beyond the p99 tails' sizes. Prints each
// part's best-of-N wall time (merging the layers' rows, the metrics, the bootstrap
// intervals, the paired comparisons' block sums, the attribution's per-layer and
// per-head shares) one after another, then all of them as the sweep runs them
// (point_metrics, one metric per thread, the attribution beside) on 1 thread and on the
// OpenMP threads given (default: all), and checks that both give the parts' numbers.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "experiments/attribution.h"
#include "sim/core/strings.h"
#include "sim/metrics/bootstrap.h"
#include "sim/metrics/error_stats.h"
#include "sim/metrics/metric_table.h"
#include "sim/metrics/paired.h"
#include "sim/metrics/point_metrics.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t layers = 32, q_heads = 32, positions = 2048;
  int repeats = 3, threads = 0;
  std::string metrics = "attn_kl_mean,attn_out_rel_err,attn_kl_p99,attn_out_rel_err_p99,topk_overlap,logit_rmse";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_finalize: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--layers") o.layers = std::stoll(next());
    else if (a == "--q-heads") o.q_heads = std::stoll(next());
    else if (a == "--positions") o.positions = std::stoll(next());
    else if (a == "--repeats") o.repeats = std::stoi(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else if (a == "--metrics") o.metrics = next();
    else {
      std::fprintf(stderr, "bench_finalize: unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

// One layer's task result: q_heads x positions rows in (q_head, position) order.
kvb::ErrorStats layer_rows(const Options& o, int64_t layer) {
  std::mt19937_64 rng(static_cast<uint64_t>(layer) * 7919 + 1);
  std::normal_distribution<float> z(0.0f, 1.0f);
  kvb::ErrorStats s;
  s.rows.resize(static_cast<size_t>(o.q_heads * o.positions));
  size_t k = 0;
  for (int64_t h = 0; h < o.q_heads; ++h)
    for (int64_t p = 0; p < o.positions; ++p) {
      kvb::AttentionRow& r = s.rows[k++];
      r.layer = static_cast<int32_t>(layer);
      r.q_head = static_cast<int32_t>(h);
      r.position = static_cast<int32_t>(p);
      r.kl = 1e-3f * std::exp(1.5f * z(rng));
      r.topk_overlap = std::min(1.0f, 0.9f + 0.05f * std::abs(z(rng)));
      r.out_norm2 = 1.0f + 0.1f * std::abs(z(rng));
      r.out_err2 = 1e-2f * r.out_norm2 * std::exp(z(rng));
      r.logit_err2 = 1e-2f * static_cast<float>(p + 1) * std::exp(0.5f * z(rng));
      r.logit_err_max = 0.3f * std::exp(0.5f * z(rng));
    }
  s.logit_pairs = o.q_heads * o.positions * (o.positions + 1) / 2;
  s.k_err2 = s.v_err2 = 1.0;
  s.k_norm2 = s.v_norm2 = 100.0;
  return s;
}

template <class F>
double best_seconds(int repeats, F&& f) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  std::vector<const kvb::MetricDef*> metrics;
  for (const std::string& name : kvb::split(o.metrics, ',')) {
    const kvb::MetricDef* m = kvb::find_metric(name);
    if (!m) {
      std::fprintf(stderr, "bench_finalize: unknown metric %s\n", name.c_str());
      return 2;
    }
    metrics.push_back(m);
  }
  std::vector<kvb::ErrorStats> parts;
  for (int64_t l = 0; l < o.layers; ++l) parts.push_back(layer_rows(o, l));
  const size_t rows = static_cast<size_t>(o.layers * o.q_heads * o.positions);
  std::printf("bench_finalize: %lld layers x %lld q heads x %lld positions = %zu rows, %zu metrics, %d threads, "
              "best of %d\n",
              static_cast<long long>(o.layers), static_cast<long long>(o.q_heads), static_cast<long long>(o.positions),
              rows, metrics.size(), omp_get_max_threads(), o.repeats);

  // As the sweep does: the merged rows in the memory of the point before (its pool).
  kvb::ErrorStats merged;
  const double t_merge = best_seconds(o.repeats, [&] {
    merged = kvb::ErrorStats::merged(parts.data(), parts.size(), std::move(merged.rows));
  });
  std::vector<double> values;
  const double t_metrics = best_seconds(o.repeats, [&] {
    values.clear();
    for (const kvb::MetricDef* m : metrics) values.push_back(m->compute(merged));
  });
  std::vector<kvb::Interval> intervals;
  kvb::BootstrapScratch scratch;  // as the sweep does: reused from point to point
  const double t_bootstrap = best_seconds(o.repeats, [&] {
    intervals = kvb::bootstrap_intervals(merged, metrics, kvb::BootstrapSettings{}, nullptr, &scratch);
  });
  std::vector<kvb::BlockSums> sums;
  const double t_blocks = best_seconds(o.repeats, [&] { sums = kvb::metric_block_sums(metrics, merged); });
  kvb::Attribution attribution;
  const double t_attribution =
      best_seconds(o.repeats, [&] { attribution = kvb::attribute(merged, {}, {}, o.layers, o.q_heads); });

  // Each metric's interval alone (what a split over metrics would balance).
  std::vector<double> t_each;
  for (const kvb::MetricDef* m : metrics)
    t_each.push_back(best_seconds(
        o.repeats, [&] { (void)kvb::bootstrap_intervals(merged, {m}, kvb::BootstrapSettings{}, nullptr, &scratch); }));
  const double total = t_merge + t_metrics + t_bootstrap + t_blocks + t_attribution;
  std::printf("| part | ms | share |\n|---|---:|---:|\n");
  auto row = [&](const char* what, double s) { std::printf("| %s | %.1f | %.0f %% |\n", what, 1e3 * s, 100 * s / total); };
  row("merge the layers' rows", t_merge);
  row("metrics", t_metrics);
  row("bootstrap intervals", t_bootstrap);
  row("block sums (paired comparisons)", t_blocks);
  row("attribution shares", t_attribution);
  row("total", total);
  for (size_t k = 0; k < metrics.size(); ++k)
    std::printf("bootstrap interval of %s alone: %.1f ms\n", metrics[k]->name.c_str(), 1e3 * t_each[k]);

  // As the sweep's finalize runs them: point_metrics with the attribution beside, on 1
  // thread and on the threads given; the same bits as the parts above, or exit 1.
  const int threads = omp_get_max_threads();
  auto finalize_on = [&](int n, kvb::PointMetrics& out) {
    std::vector<kvb::BootstrapScratch> buffers;  // reused from point to point
    kvb::PointMetricsOptions options;
    options.threads = n;
    options.beside = [&] { attribution = kvb::attribute(merged, {}, {}, o.layers, o.q_heads); };
    return best_seconds(o.repeats, [&] { out = kvb::point_metrics(merged, metrics, options, &buffers); });
  };
  kvb::PointMetrics on_one, on_all;
  const double t_one = finalize_on(1, on_one);
  const double t_all = finalize_on(threads, on_all);
  std::printf("\n| point_metrics + attribution | ms |\n|---|---:|\n| 1 thread | %.1f |\n| %d threads | %.1f |\n"
              "speed-up %.2fx; the sum of the parts above minus the merge: %.1f ms\n",
              1e3 * t_one, threads, 1e3 * t_all, t_one / t_all, 1e3 * (total - t_merge));
  auto same_bits = [](double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  for (size_t k = 0; k < metrics.size(); ++k)
    for (const kvb::PointMetrics* p : {&on_one, &on_all})
      if (!same_bits(p->values[k], values[k]) || !same_bits(p->intervals[k].lo, intervals[k].lo) ||
          !same_bits(p->intervals[k].hi, intervals[k].hi) || p->block_sums[k].num != sums[k].num ||
          p->block_sums[k].den != sums[k].den) {
        std::fprintf(stderr, "bench_finalize: point_metrics on %d threads differs from the parts in %s\n",
                     p == &on_one ? 1 : threads, metrics[k]->name.c_str());
        return 1;
      }
  std::printf("point_metrics on 1 and %d threads: the parts' numbers, bit for bit\n", threads);
  // The numbers, so that a faster version can be checked against this one's output.
  for (size_t k = 0; k < metrics.size(); ++k)
    std::printf("%s = %.17g [%.17g, %.17g]\n", metrics[k]->name.c_str(), values[k], intervals[k].lo, intervals[k].hi);
  return 0;
}
