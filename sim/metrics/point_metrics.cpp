#include "sim/metrics/point_metrics.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>

namespace kvb {

namespace {

// Metric k's figures into `out` (sized for every metric), with its own buffers.
void one_metric(const ErrorStats& stats, const MetricDef& metric, size_t k, const PointMetricsOptions& options,
                const PositionBlocks& blocks, BootstrapScratch& scratch, PointMetrics& out) {
  out.values[k] = metric.compute(stats);
  out.standard_errors[k] = metric.standard_error ? metric.standard_error(stats) : std::nan("");
  std::vector<std::vector<double>> resamples;
  out.intervals[k] = bootstrap_intervals(stats, {&metric}, options.bootstrap,
                                         options.keep_resamples ? &resamples : nullptr, &scratch, &blocks)
                         .front();
  if (options.keep_resamples) out.resamples[k] = std::move(resamples.front());
  if (metric.interval) out.intervals[k] = metric.interval(stats);  // closed form (answer_accuracy)
  out.block_sums[k] = metric_block_sums({&metric}, stats, &blocks).front();
}

}  // namespace

PointMetrics point_metrics(const ErrorStats& stats, const std::vector<const MetricDef*>& metrics,
                           const PointMetricsOptions& options, std::vector<BootstrapScratch>* scratch) {
  const size_t n = metrics.size();
  PointMetrics out;
  out.values.assign(n, std::nan(""));
  out.standard_errors.assign(n, std::nan(""));
  out.intervals.assign(n, Interval{std::nan(""), std::nan("")});
  out.block_sums.assign(n, BlockSums{});
  if (options.keep_resamples) out.resamples.assign(n, {});
  std::vector<BootstrapScratch> local;
  std::vector<BootstrapScratch>& buffers = scratch ? *scratch : local;
  if (buffers.size() < n) buffers.resize(n);
  // The rows' blocks, one table for every metric's interval and block sums.
  const PositionBlocks blocks = position_blocks(stats.rows);

  const long jobs = static_cast<long>(n) + (options.beside ? 1 : 0);
  std::vector<std::exception_ptr> failed(static_cast<size_t>(jobs));
  const int threads = static_cast<int>(std::min<long>(std::max(options.threads, 1), jobs));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && !omp_in_parallel())
  for (long j = 0; j < jobs; ++j) {
    const size_t k = static_cast<size_t>(j);
    try {
      if (k < n) one_metric(stats, *metrics[k], k, options, blocks, buffers[k], out);
      else options.beside();
    } catch (...) {
      failed[k] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace kvb
