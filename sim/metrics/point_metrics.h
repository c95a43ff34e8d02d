// A sweep point's reported figures from its merged stats (what a sweep's finalize
// computes once a point's layers are measured): per metric its value, standard error,
// interval (the block bootstrap's, or the metric's closed form) and block sums.
//
// The metrics are independent of one another (the bootstrap's draws depend only on the
// settings and the blocks), so they run one metric per thread at a time on up to
// `threads` threads, each with its own buffers: the same bits for any thread count, as
// the metrics computed one after another (tested in tests/metrics/test_point_metrics).
// On the Llama-3-8B shape at 2048 positions (2.1 million rows) the p99 metrics take the
// longest: a finalize on several threads is about as long as one of them
// (experiments/bench/bench_finalize).
#pragma once
#include <functional>
#include <vector>

#include "sim/metrics/bootstrap.h"
#include "sim/metrics/metric_table.h"
#include "sim/metrics/paired.h"

namespace kvb {

struct PointMetrics {
  std::vector<double> values;           // aligned with the metrics
  std::vector<double> standard_errors;  // NaN for a metric without one
  std::vector<Interval> intervals;      // {NaN, NaN} for a metric without one
  std::vector<BlockSums> block_sums;    // empty for a metric that is not pairable
  // With keep_resamples: each metric's bootstrap resamples (bootstrap_intervals'
  // `resamples`), else empty.
  std::vector<std::vector<double>> resamples;
};

struct PointMetricsOptions {
  BootstrapSettings bootstrap;
  bool keep_resamples = false;
  // Threads at most; inside an active OpenMP parallel region (a CPU sweep's task
  // loop) the metrics run on the calling thread alone.
  int threads = 1;
  // Other work of the point that runs beside the metrics, as one more job after them
  // (the sweep's attribution shares). Empty: none.
  std::function<void()> beside;
};

// The figures of `metrics` on `stats`. `scratch` (optional): buffers reused from one
// call to the next, one per metric (resized here); nothing in them changes a result.
// Once every job has run, throws the first exception in job order (the metrics in their
// order, then `beside`).
PointMetrics point_metrics(const ErrorStats& stats, const std::vector<const MetricDef*>& metrics,
                           const PointMetricsOptions& options, std::vector<BootstrapScratch>* scratch = nullptr);

}  // namespace kvb
