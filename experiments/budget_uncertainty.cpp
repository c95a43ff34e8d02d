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

bool overlap(const Interval& a, const Interval& b) { return a.lo <= b.hi && b.lo <= a.hi; }

// Whether the run can tell `rival` from `point` in metric k (a_interval, b_interval:
// their metric_interval). Measured on the same positions, by the paired bootstrap
// interval of the difference (rival − point: `difference`, `paired` set); else by
// whether their intervals are disjoint. Intervals that are already disjoint need no
// resampling: the paired interval is at most as wide as the two intervals together
// whenever the points' errors do not vary against each other over the positions, as
// two quantizations of the same cache's positions do.
struct Told {
  bool distinguishable = true;
  bool paired = false;
  PairedDifference difference;
};
Told tell_apart(const MetricDef& metric, size_t k, const PointResult& point, const Interval& point_interval,
                const PointResult& rival, const Interval& rival_interval, const BootstrapSettings& settings,
                bool always_pair) {
  Told t;
  if (!always_pair && finite(point_interval) && finite(rival_interval) && !overlap(point_interval, rival_interval))
    return t;
  const bool pairable = k < point.block_sums.size() && k < rival.block_sums.size() && !point.block_sums[k].empty() &&
                        !rival.block_sums[k].empty();
  if (pairable) t.difference = paired_difference(metric, point.block_sums[k], rival.block_sums[k], settings);
  if (t.difference.comparable) {
    t.paired = true;
    t.distinguishable = !(t.difference.interval.lo <= 0 && 0 <= t.difference.interval.hi);
  } else {
    t.distinguishable = !(finite(point_interval) && finite(rival_interval) && overlap(point_interval, rival_interval));
  }
  return t;
}

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
  u.known = finite(u.interval);
  if (!u.known) return u;
  const std::vector<double>& memory = frontier_column(in, in.memory);
  if (!q.memory) {
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
    // Every rival is paired, so budgets.json gives each its difference and interval.
    const Told t = tell_apart(metric, k, picked, u.interval, *rows[i], intervals[i], settings, /*always_pair=*/true);
    if (!t.distinguishable) u.indistinguishable.push_back({i, t.difference, t.paired});
  }
  const bool lower_better = metric.better == Better::Lower;
  std::stable_sort(u.indistinguishable.begin(), u.indistinguishable.end(),
                   [&](const PickUncertainty::Rival& a, const PickUncertainty::Rival& b) {
                     return lower_better ? value[a.index] < value[b.index] : value[a.index] > value[b.index];
                   });
  return u;
}

std::vector<FrontPointUncertainty> front_uncertainty(const std::vector<size_t>& front, size_t k,
                                                     const std::vector<double>& cost, const FrontierInput& in,
                                                     const std::vector<const PointResult*>& rows,
                                                     const BootstrapSettings& settings) {
  const MetricDef& metric = *find_metric(in.metric_names[k]);
  const std::vector<double>& value = in.metric_values[k];
  std::vector<Interval> intervals(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) intervals[i] = metric_interval(*rows[i], k, settings.level);
  // Rows with a memory and a value, least memory first (ties: by index).
  std::vector<size_t> by_cost;
  for (size_t i = 0; i < rows.size(); ++i)
    if (!std::isnan(cost[i]) && !std::isnan(value[i])) by_cost.push_back(i);
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](size_t a, size_t b) { return cost[a] < cost[b]; });
  std::vector<FrontPointUncertainty> out(front.size());
  for (size_t f = 0; f < front.size(); ++f) {
    const size_t i = front[f];
    FrontPointUncertainty& u = out[f];
    u.interval = intervals[i];
    u.known = finite(u.interval);
    if (!u.known) continue;
    for (size_t j : by_cost) {
      if (cost[j] > cost[i]) break;
      if (j == i) continue;
      const Told t = tell_apart(metric, k, *rows[i], u.interval, *rows[j], intervals[j], settings, /*always_pair=*/false);
      if (!t.distinguishable) u.may_be_dominated_by.push_back(j);
    }
  }
  return out;
}

}  // namespace kvb
