#include "experiments/budget_uncertainty.h"

#include <algorithm>
#include <cmath>

#include "sim/metrics/model_metrics.h"

namespace kvb {

namespace {

bool finite(const Interval& i) { return std::isfinite(i.lo) && std::isfinite(i.hi); }

size_t metric_column(const FrontierInput& in, const std::string& name) {
  return static_cast<size_t>(std::find(in.metric_names.begin(), in.metric_names.end(), name) -
                             in.metric_names.begin());
}

// Whether all of `i` meets the bound of an error budget.
bool wholly_meets(const BudgetQuery& q, const Interval& i) { return q.upper ? i.hi <= q.bound : i.lo >= q.bound; }

}  // namespace

Interval metric_interval(const PointResult& r, size_t k, double level) {
  if (k < r.intervals.size() && finite(r.intervals[k])) return r.intervals[k];
  if (k < r.standard_errors.size() && std::isfinite(r.standard_errors[k]) && k < r.metrics.size()) {
    const double half = two_sided_normal_z(level) * r.standard_errors[k];
    return {r.metrics[k] - half, r.metrics[k] + half};
  }
  return {std::nan(""), std::nan("")};
}

PickUncertainty pick_uncertainty(const BudgetQuery& q, const BudgetAnswer::Pick& pick, const FrontierInput& in,
                                 const std::vector<const PointResult*>& rows, const BootstrapSettings& settings) {
  PickUncertainty u;
  if (!pick.index) return u;
  const size_t k = metric_column(in, pick.metric);
  const PointResult& picked = *rows[*pick.index];
  // Every row's interval of the metric, once (metric_interval finds z by bisection).
  std::vector<Interval> intervals(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) intervals[i] = metric_interval(*rows[i], k, settings.level);
  u.interval = intervals[*pick.index];
  const std::vector<double>& memory = frontier_column(in, in.memory);
  if (!q.memory) {
    if (!finite(u.interval)) return u;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Interval& other = intervals[i];
      const bool reaches = q.upper ? other.lo <= q.bound : other.hi >= q.bound;
      if (finite(other) && reaches && memory[i] < memory[*pick.index]) u.cheaper_within_uncertainty.push_back(i);
    }
    std::stable_sort(u.cheaper_within_uncertainty.begin(), u.cheaper_within_uncertainty.end(),
                     [&](size_t a, size_t b) { return memory[a] < memory[b]; });
    u.meets_for_certain = wholly_meets(q, u.interval);
    if (*u.meets_for_certain) return u;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Interval& other = intervals[i];
      if (!finite(other) || !wholly_meets(q, other) || std::isnan(memory[i])) continue;
      if (!u.least_memory_for_certain || memory[i] < memory[*u.least_memory_for_certain])
        u.least_memory_for_certain = i;
    }
    return u;
  }
  const MetricDef& metric = *find_metric(pick.metric);
  const std::vector<double>& budget = frontier_column(in, q.lhs);
  const std::vector<double>& value = in.metric_values[k];
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i == *pick.index || std::isnan(value[i]) || std::isnan(budget[i])) continue;
    if (q.upper ? !(budget[i] <= q.bound) : !(budget[i] >= q.bound)) continue;
    PickUncertainty::Rival rival{i, {}, false};
    const bool pairable = k < picked.block_sums.size() && k < rows[i]->block_sums.size() &&
                          !picked.block_sums[k].empty() && !rows[i]->block_sums[k].empty();
    if (pairable) rival.difference = paired_difference(metric, picked.block_sums[k], rows[i]->block_sums[k], settings);
    if (rival.difference.comparable) {
      rival.paired = true;
      if (rival.difference.interval.lo <= 0 && 0 <= rival.difference.interval.hi) u.indistinguishable.push_back(rival);
    } else {
      const Interval& other = intervals[i];
      if (finite(u.interval) && finite(other) && other.lo <= u.interval.hi && u.interval.lo <= other.hi)
        u.indistinguishable.push_back(rival);
    }
  }
  const bool lower_better = metric.better == Better::Lower;
  std::stable_sort(u.indistinguishable.begin(), u.indistinguishable.end(),
                   [&](const PickUncertainty::Rival& a, const PickUncertainty::Rival& b) {
                     return lower_better ? value[a.index] < value[b.index] : value[a.index] > value[b.index];
                   });
  return u;
}

}  // namespace kvb
