// How sure a budget answer is (experiments/budget_uncertainty.*), on constructed points.
#include <cmath>

#include "experiments/budget_uncertainty.h"
#include "sim/metrics/model_metrics.h"
#include "test_util.h"

using namespace kvb;

namespace {

// A point of bpe `bpe` whose one metric has `value` and interval [lo, hi].
PointResult point(size_t id, double bpe, double value, double lo, double hi) {
  PointResult r;
  r.id = id;
  r.ok = true;
  r.bpe = r.bpe_target = bpe;
  r.metrics = {value};
  r.standard_errors = {NAN};
  r.intervals = {Interval{lo, hi}};
  return r;
}

FrontierInput input_of(const std::vector<const PointResult*>& rows, const std::string& metric) {
  FrontierInput in;
  in.metric_names = {metric};
  in.metric_values.resize(1);
  in.pareto_metrics = {metric};
  for (const PointResult* r : rows) {
    in.bpe.push_back(r->bpe);
    in.bytes.push_back(r->bpe * 100);
    in.bpe_target.push_back(r->bpe_target);
    in.bytes_target.push_back(r->bpe_target * 100);
    in.metric_values[0].push_back(r->metrics[0]);
  }
  return in;
}

}  // namespace

TEST_CASE("metric_interval: the point's interval, else value ± z·SE, else none") {
  PointResult r = point(0, 4, 2.0, 1.5, 2.5);
  CHECK(metric_interval(r, 0, 0.95).lo == 1.5);
  r.intervals = {Interval{NAN, NAN}};
  r.standard_errors = {0.1};
  const Interval i = metric_interval(r, 0, 0.95);
  CHECK(i.lo == doctest::Approx(2.0 - 0.1959964).epsilon(1e-6));
  CHECK(i.hi == doctest::Approx(2.0 + 0.1959964).epsilon(1e-6));
  CHECK(two_sided_normal_z(0.95) == doctest::Approx(1.959964).epsilon(1e-6));
  r.standard_errors = {NAN};
  CHECK(std::isnan(metric_interval(r, 0, 0.95).lo));
}

TEST_CASE("pick_uncertainty: an error budget met by the point estimate only, and a cheaper point that may meet it") {
  // 0: misses 0.05 but its interval reaches it; 1: the pick, its interval past 0.05;
  // 2: wholly within; 3: wholly within but dearer.
  const PointResult a = point(0, 4, 0.06, 0.045, 0.07), b = point(1, 5, 0.049, 0.047, 0.052),
                    c = point(2, 6, 0.03, 0.02, 0.04), d = point(3, 7, 0.01, 0.005, 0.015);
  const std::vector<const PointResult*> rows = {&a, &b, &c, &d};
  const FrontierInput in = input_of(rows, "attn_out_rel_err");
  const BudgetQuery q = parse_budget_query("attn_out_rel_err <= 0.05", "test");
  const BudgetAnswer ans = answer_budget(q, in);
  REQUIRE(ans.picks.size() == 1);
  REQUIRE(ans.picks[0].index == size_t{1});
  const PickUncertainty u = pick_uncertainty(q, ans.picks[0], in, rows, BootstrapSettings{});
  CHECK(u.interval.lo == 0.047);
  REQUIRE(u.meets_for_certain.has_value());
  CHECK_FALSE(*u.meets_for_certain);
  CHECK(u.least_memory_for_certain == size_t{2});
  CHECK(u.cheaper_within_uncertainty == std::vector<size_t>{0});
  // A pick wholly within the bound: nothing more to say but the cheaper candidate.
  const BudgetQuery loose = parse_budget_query("attn_out_rel_err <= 0.055", "test");
  const PickUncertainty v = pick_uncertainty(loose, answer_budget(loose, in).picks[0], in, rows, BootstrapSettings{});
  CHECK(*v.meets_for_certain);
  CHECK_FALSE(v.least_memory_for_certain.has_value());
  CHECK(v.cheaper_within_uncertainty == std::vector<size_t>{0});
}

TEST_CASE("pick_uncertainty: a memory budget's best point and those it cannot be told from") {
  // Within bpe <= 5: 1 is best; 0's interval overlaps 1's, 2's does not (no block sums:
  // not pairable, so the intervals decide); 3 is beyond the budget.
  const PointResult a = point(0, 4, 0.06, 0.045, 0.07), b = point(1, 5, 0.05, 0.047, 0.053),
                    c = point(2, 4.5, 0.09, 0.08, 0.1), d = point(3, 6, 0.048, 0.047, 0.049);
  const std::vector<const PointResult*> rows = {&a, &b, &c, &d};
  const FrontierInput in = input_of(rows, "attn_out_rel_err");
  const BudgetQuery q = parse_budget_query("bpe <= 5", "test");
  const BudgetAnswer ans = answer_budget(q, in);
  REQUIRE(ans.picks[0].index == size_t{1});
  const PickUncertainty u = pick_uncertainty(q, ans.picks[0], in, rows, BootstrapSettings{});
  REQUIRE(u.indistinguishable.size() == 1);
  CHECK(u.indistinguishable[0].index == 0);
  CHECK_FALSE(u.indistinguishable[0].paired);
  CHECK_FALSE(u.meets_for_certain.has_value());
}

TEST_CASE("pick_uncertainty: a pick without an interval (too few blocks) says nothing, not 'certain'") {
  // The values would pick 1 in both budgets; no point has an interval (one block of
  // positions: bootstrap_intervals gives none), and their one block each is too few to pair.
  PointResult a = point(0, 4, 0.06, NAN, NAN), b = point(1, 5, 0.049, NAN, NAN), c = point(2, 6, 0.03, NAN, NAN);
  for (PointResult* r : {&a, &b, &c}) r->block_sums = {BlockSums{{r->metrics[0]}, {1}, {}}};
  const std::vector<const PointResult*> rows = {&a, &b, &c};
  const FrontierInput in = input_of(rows, "attn_out_rel_err");
  const BudgetQuery error_budget = parse_budget_query("attn_out_rel_err <= 0.05", "test");
  const PickUncertainty e = pick_uncertainty(error_budget, answer_budget(error_budget, in).picks[0], in, rows, {});
  CHECK_FALSE(e.known);
  CHECK_FALSE(e.meets_for_certain.has_value());
  CHECK(e.cheaper_within_uncertainty.empty());
  const BudgetQuery memory_budget = parse_budget_query("bpe <= 5", "test");
  const PickUncertainty m = pick_uncertainty(memory_budget, answer_budget(memory_budget, in).picks[0], in, rows, {});
  CHECK_FALSE(m.known);
  CHECK(m.indistinguishable.empty());
  // With an interval the same pick is known.
  b.intervals = {Interval{0.047, 0.051}};
  CHECK(pick_uncertainty(error_budget, answer_budget(error_budget, in).picks[0], in, rows, {}).known);
}

TEST_CASE("front_uncertainty: a front point not told from a cheaper one, by intervals or paired blocks") {
  // All four on the front by their values. 1's interval overlaps 0's (no block sums:
  // the intervals decide); 2's is disjoint from every cheaper one's; 3 has none.
  PointResult a = point(0, 4, 0.06, 0.05, 0.07), b = point(1, 5, 0.055, 0.045, 0.058),
              c = point(2, 6, 0.02, 0.015, 0.025), d = point(3, 7, 0.01, NAN, NAN);
  std::vector<const PointResult*> rows = {&a, &b, &c, &d};
  FrontierInput in = input_of(rows, "attn_out_rel_err");
  const std::vector<size_t> front = pareto_front(in.bpe, in.metric_values[0], Better::Lower);
  REQUIRE(front == std::vector<size_t>{0, 1, 2, 3});
  std::vector<FrontPointUncertainty> u = front_uncertainty(front, 0, in.bpe, in, rows, BootstrapSettings{});
  REQUIRE(u.size() == 4);
  CHECK(u[0].known);
  CHECK(u[0].may_be_dominated_by.empty());
  CHECK(u[1].may_be_dominated_by == std::vector<size_t>{0});
  CHECK(u[1].interval.lo == 0.045);
  CHECK(u[2].known);
  CHECK(u[2].may_be_dominated_by.empty());
  CHECK_FALSE(u[3].known);
  CHECK(u[3].may_be_dominated_by.empty());

  // Measured on the same blocks, 1 is better than 0 in every block by the same margin:
  // the paired interval of the difference excludes 0 although their intervals overlap.
  a.block_sums = {BlockSums{{0.05, 0.07, 0.06, 0.065, 0.055}, {1, 1, 1, 1, 1}, {}}};
  b.block_sums = {BlockSums{{0.045, 0.065, 0.055, 0.06, 0.05}, {1, 1, 1, 1, 1}, {}}};
  u = front_uncertainty(front, 0, in.bpe, in, rows, BootstrapSettings{});
  CHECK(u[1].may_be_dominated_by.empty());
  // A point at equal memory and a value it cannot be told from is listed too.
  PointResult e = point(4, 5, 0.0565, 0.046, 0.059);
  rows.push_back(&e);
  in = input_of(rows, "attn_out_rel_err");
  u = front_uncertainty(front, 0, in.bpe, in, rows, BootstrapSettings{});
  CHECK(u[1].may_be_dominated_by == std::vector<size_t>{4});
}
