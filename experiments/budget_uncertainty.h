// How sure a budget answer is. answer_budget (frontier.h) picks by the points' measured
// values; the run's uncertainty (bootstrap intervals, standard errors, paired bootstrap
// over the same positions) says what that pick leaves open, for budgets.json and the
// console (docs/methods.md §4, "Uncertainty").
#pragma once
#include <cstddef>
#include <optional>
#include <vector>

#include "experiments/budget_queries.h"
#include "experiments/frontier.h"
#include "experiments/sweep.h"
#include "sim/metrics/paired.h"

namespace kvb {

// The `level` interval of a point's metric k (aligned with its metrics): its bootstrap or
// closed-form interval, else value ± z·SE for a metric with a standard error, else
// {NaN, NaN}.
Interval metric_interval(const PointResult& r, size_t k, double level);

struct PickUncertainty {
  Interval interval;  // the pick's, of the metric picked on (metric_interval)
  // Whether the pick has an interval: without one (a tensor-level metric; too few blocks
  // or problems, kMinIntervalUnits) nothing below is said, and budgets.json writes its
  // fields as null rather than as a certain pick with no rivals.
  bool known = false;
  // Error budget: whether the pick's interval lies wholly within the bound (nullopt: it
  // has no interval), and if not, the point with the least memory whose interval does.
  std::optional<bool> meets_for_certain;
  std::optional<size_t> least_memory_for_certain;
  // Error budget: points with less memory than the pick whose measured value misses the
  // bound but whose interval reaches it (they may meet it too), least memory first.
  std::vector<size_t> cheaper_within_uncertainty;
  // Memory budget: the other points within it that cannot be told from the pick in its
  // metric: the paired bootstrap interval of the difference holds 0 (paired), or, for
  // points not measured on the same positions, their intervals overlap. Best first.
  struct Rival {
    size_t index = 0;
    PairedDifference difference;  // rival − pick; not comparable when !paired
    bool paired = false;
  };
  std::vector<Rival> indistinguishable;
};

// Of answer_budget's `pick` for `q` over `rows` (aligned with `in`'s rows; metric k of a
// row is in.metric_names[k]).
PickUncertainty pick_uncertainty(const BudgetQuery& q, const BudgetAnswer::Pick& pick, const FrontierInput& in,
                                 const std::vector<const PointResult*>& rows, const BootstrapSettings& settings);

// How sure a Pareto frontier's point is of its place. The front (pareto_front) is drawn
// from measured values: each point on it is better than every point with less memory.
// `may_be_dominated_by` lists the points with at most its memory (itself aside) that the
// run cannot tell from it in the metric (the same test as a memory budget's
// `indistinguishable`), least memory first: non-empty, the point may be no better than
// a cheaper one, and its place on the front is within uncertainty. `known` is false when
// the point has no interval in the metric (a tensor-level metric, one position): then
// nothing is said.
struct FrontPointUncertainty {
  Interval interval;  // the point's, in the metric (metric_interval)
  bool known = false;
  std::vector<size_t> may_be_dominated_by;  // row indices into `rows`
};

// For each of `front`'s rows (indices into `rows`, as pareto_front returns them) in
// metric in.metric_names[k] against the memory column `cost`.
std::vector<FrontPointUncertainty> front_uncertainty(const std::vector<size_t>& front, size_t k,
                                                     const std::vector<double>& cost, const FrontierInput& in,
                                                     const std::vector<const PointResult*>& rows,
                                                     const BootstrapSettings& settings);

}  // namespace kvb
