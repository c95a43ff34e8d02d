// The bounds report (experiments/bounds.*): its rows exist, the Gaussian and
// first-order rows hold, and every row is a finite prediction against a finite
// measurement with a criterion.
#include <cmath>
#include <set>

#include <algorithm>
#include <limits>

#include "experiments/bounds.h"
#include "sim/core/error.h"
#include "sim/core/parallel.h"
#include "test_util.h"

using namespace kvb;

TEST_CASE("the bounds report has every row of methods.md §5, and the Gaussian rows hold") {
  BoundsOptions opt;
  opt.quick = true;
  opt.samples = 1 << 15;
  const std::vector<BoundRow> rows = bounds_report(opt);
  std::set<std::string> sections, names;
  for (const BoundRow& r : rows) {
    INFO(r.section << " / " << r.name);
    sections.insert(r.section);
    CHECK(names.insert(r.name).second);
    CHECK(std::isfinite(r.predicted));
    CHECK(std::isfinite(r.measured));
    CHECK(!r.claim.empty());
    CHECK(!r.criterion.empty());
    if (r.section == "gaussian" || r.section == "first-order" || r.section == "turboquant" ||
        r.section == "water-filling")
      CHECK(r.holds);
  }
  CHECK(sections ==
        std::set<std::string>{"gaussian", "first-order", "entropy-rule", "taqg", "turboquant", "water-filling"});
  for (const char* n : {"high-rate gap entropy-coded uniform", "high-rate allocation spread", "mse upper b=2",
                        "mse lower b=3", "inner-product variance b=3"})
    CHECK(names.count(n) == 1);
  for (const char* n :
       {"lloyd-max b=2", "shannon b=3 lloyd-max", "uniform-step b=4", "shannon b=2 int2-asym-g32",
        "high-rate gap lloyd-max", "value error int4-asym-g32", "key error int2-asym-g32",
        "alpha 0.5 (values only, mean H2)", "alpha 0.25 (keys and values, mean H2)", "bound as written (research rho)",
        "reverse water-filling (control: equal rho)", "4/3 vs 3/3 (unequal budgets)"})
    CHECK(names.count(n) == 1);
  for (const BoundRow& r : rows) {
    if (r.name == "bound as written (research rho)") CHECK(r.predicted == 1.0);  // floor(log2(2.178)) = 1
    if (r.name == "bound as written (control: equal rho)") CHECK(r.predicted == 1.0);
    if (r.name == "bound as written (control: swapped rho)") CHECK(r.predicted == -1.0);
  }
  // Every row has a verdict; sampled rows an interval of what their criterion tests,
  // exact ones none; a verdict never contradicts the measured value's own criterion.
  for (const BoundRow& r : rows) {
    INFO(r.name << ": " << r.verdict << " [" << r.interval.lo << ", " << r.interval.hi << "]");
    CHECK((r.verdict == "holds" || r.verdict == "violated" || r.verdict == "within uncertainty"));
    // A firm verdict on a sampled row only with an interval of what its criterion tests.
    if (r.interval_of != "exact" && r.verdict != "within uncertainty") CHECK(std::isfinite(r.interval.lo));
    if (r.verdict == "holds") CHECK(r.holds);
    if (r.verdict == "violated") CHECK_FALSE(r.holds);
    const bool exact = r.name.rfind("lloyd-max b=", 0) == 0 || r.name.rfind("uniform-step", 0) == 0 ||
                       r.name.rfind("high-rate", 0) == 0;
    CHECK(exact == (r.interval_of == "exact"));
    if (exact) CHECK(std::isnan(r.interval.lo));
    const bool sampled = r.name.rfind("shannon", 0) == 0 || r.name.rfind("mse ", 0) == 0 ||
                         r.name.rfind("inner-product", 0) == 0 || r.section == "first-order" ||
                         r.name == "4/3 vs 3/3 (unequal budgets)";
    if (sampled) {
      CHECK(r.interval.lo <= r.interval.hi);
      CHECK(std::isfinite(r.interval.lo));
    }
    // Shannon's bound is far below every quantizer's MSE: the samples cannot blur it.
    if (r.name.rfind("shannon", 0) == 0) CHECK(r.verdict == "holds");
    if (r.section == "entropy-rule" || (r.section == "taqg" && r.name != "4/3 vs 3/3 (unequal budgets)"))
      CHECK(r.interval_of != "exact");
  }
  const std::string csv = bounds_csv(rows), md = bounds_markdown(rows);
  CHECK(csv.rfind("section,name,claim,predicted,measured,holds,verdict,interval_lo,interval_hi,interval_of,criterion,"
                  "note\n", 0) == 0);
  CHECK(md.find("| verdict | 95 % interval |") != std::string::npos);
  CHECK(md.find("\"within uncertainty\"") != std::string::npos);
  CHECK(md.find("| gaussian | lloyd-max b=1 |") != std::string::npos);
  CHECK(md.find("\\|\\|do\\|\\|") != std::string::npos);  // pipes in cells are escaped
  CHECK(md.find("Notes (what is not a row, and why)") != std::string::npos);
}

TEST_CASE("bounds verdicts: holds or violated only when the interval clears the criterion's boundary") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // measured >= 0.5
  CHECK(bound_verdict(true, {1.0, 2.0}, 0.5, inf) == "holds");
  CHECK(bound_verdict(true, {0.4, 2.0}, 0.5, inf) == "within uncertainty");  // the value holds, its interval straddles
  CHECK(bound_verdict(false, {0.1, 0.4}, 0.5, inf) == "violated");
  CHECK(bound_verdict(false, {0.1, 0.6}, 0.5, inf) == "within uncertainty");
  // measured/predicted in [0.8, 1.25]
  CHECK(bound_verdict(true, {0.9, 1.1}, 0.8, 1.25) == "holds");
  CHECK(bound_verdict(true, {0.75, 1.1}, 0.8, 1.25) == "within uncertainty");
  CHECK(bound_verdict(false, {1.3, 1.5}, 0.8, 1.25) == "violated");
  CHECK(bound_verdict(false, {1.2, 1.5}, 0.8, 1.25) == "within uncertainty");
  // A sampled row without an interval (too few samples or blocks) cannot be decided.
  CHECK(bound_verdict(true, {nan, nan}, 0.5, inf) == "within uncertainty");
  CHECK(bound_verdict(false, {nan, nan}, 0.5, inf) == "within uncertainty");
  // The interval and the criterion on the measured value disagree (a percentile
  // interval need not hold its point estimate): no firm verdict.
  CHECK(bound_verdict(false, {1.0, 2.0}, 0.5, inf) == "within uncertainty");
  CHECK(bound_verdict(true, {0.1, 0.4}, 0.5, inf) == "within uncertainty");
  // An exact computation: the criterion decides.
  CHECK(exact_verdict(true) == "holds");
  CHECK(exact_verdict(false) == "violated");
}

TEST_CASE("bounds: a sampled row with too few samples for an interval is within uncertainty, exact rows stay firm") {
  BoundsOptions opt;
  opt.quick = true;
  opt.samples = 1;  // one Gaussian sample: no standard error, one row of 32 for the int formats
  const std::vector<BoundRow> rows = bounds_report(opt);
  int undecided = 0;
  for (const BoundRow& r : rows) {
    INFO(r.name << ": " << r.verdict << " (" << r.interval_of << ")");
    if (r.name.rfind("shannon", 0) == 0) {  // sampled from opt.samples
      CHECK(std::isnan(r.interval.lo));
      CHECK(r.interval_of.rfind("none: fewer than 5 ", 0) == 0);
      CHECK(r.verdict == "within uncertainty");
      ++undecided;
    }
    if (r.interval_of == "exact") CHECK((r.verdict == "holds" || r.verdict == "violated"));
    if (r.name.rfind("lloyd-max b=", 0) == 0 || r.name.rfind("uniform-step", 0) == 0) CHECK(r.verdict == "holds");
    // At least 5 blocks of 64 vectors whatever --samples is: these keep their intervals.
    if (r.section == "turboquant") CHECK(std::isfinite(r.interval.lo));
  }
  CHECK(undecided == 12);  // b = 1..4: Lloyd-Max, int<b>-asym-g32, int<b>-sym-g32
}

// Block sums of a per-row error over `blocks` blocks of 10 rows: block k's mean error is
// mean + spread·(k mod 3 − 1), the same pattern for every allocation (paired).
static BlockSums error_blocks(double mean, double spread = 0.1, size_t blocks = 20) {
  BlockSums b;
  for (size_t k = 0; k < blocks; ++k) {
    b.num.push_back(10 * (mean + spread * (static_cast<double>(k % 3) - 1)));
    b.den.push_back(10);
  }
  return b;
}

TEST_CASE("best allocation verdict: holds only when every allocation outside the accepted set is measurably worse") {
  const BlockSums best = error_blocks(1.0), near = error_blocks(1.05), worse = error_blocks(2.0),
                  better = error_blocks(0.5);
  // Every allocation outside clearly worse: holds, with the closest competitor's interval.
  BestAllocationVerdict v = best_allocation_verdict({{&best, true}, {&near, true}, {&worse, false}}, 0);
  CHECK(v.verdict == "holds");
  CHECK(v.interval.lo > 0);
  CHECK(v.interval.lo == doctest::Approx(1.0));
  // One outside tied with the best accepted (its paired interval holds 0): within
  // uncertainty, although the best point estimate is accepted.
  BlockSums tied = error_blocks(1.0);
  for (size_t k = 0; k < tied.num.size(); ++k) tied.num[k] += (k % 2 ? 0.2 : -0.2);  // noise around the same mean
  v = best_allocation_verdict({{&best, true}, {&tied, false}, {&worse, false}}, 0);
  CHECK(v.verdict == "within uncertainty");
  CHECK(v.interval.lo < 0);
  CHECK(v.interval.hi > 0);
  // One outside measurably better than every accepted one: violated, with its interval.
  v = best_allocation_verdict({{&best, true}, {&near, true}, {&better, false}, {&worse, false}}, 0);
  CHECK(v.verdict == "violated");
  CHECK(v.interval.hi < 0);
  // The same plan reached from outside (identical block sums) is no competitor.
  const BlockSums same = best;
  CHECK(best_allocation_verdict({{&best, true}, {&same, false}, {&worse, false}}, 0).verdict == "holds");
  // Nothing accepted measured, nothing outside, too few blocks: never a firm verdict.
  v = best_allocation_verdict({{&worse, false}, {&better, false}}, 0);
  CHECK(v.verdict == "within uncertainty");
  CHECK(std::isnan(v.interval.lo));
  CHECK(v.why_none == "no allocation the criterion accepts was measured");
  v = best_allocation_verdict({{&best, true}, {&near, true}}, 0);
  CHECK(v.verdict == "within uncertainty");
  CHECK(std::isnan(v.interval.lo));
  const BlockSums few_best = error_blocks(1.0, 0.1, 4), few_worse = error_blocks(2.0, 0.1, 4);
  v = best_allocation_verdict({{&few_best, true}, {&few_worse, false}}, 0);
  CHECK(v.verdict == "within uncertainty");
  CHECK(v.why_none.find("fewer than 5 blocks") != std::string::npos);
}

TEST_CASE("water-filling: the row's tolerance accepts 1/2 log2 and refuses a wrong constant") {
  const WaterFillingCheck right = water_filling_check(0.5);
  CHECK(right.optimal == std::vector<int>{2, 3, 3, 4, 4, 5, 5, 6});
  CHECK(right.largest_gap == doctest::Approx(0.25));
  CHECK(right.largest_gap <= kWaterFillingTolerance);
  // 1/2 ln (slope 1/2 ln 2 per log2 unit) and 1/2 log2 e: off by about 0.79 and 0.80 bit.
  CHECK(water_filling_check(0.5 * std::log(2.0)).largest_gap > kWaterFillingTolerance);
  CHECK(water_filling_check(0.5 / std::log(2.0)).largest_gap > kWaterFillingTolerance);
  // Half or twice the slope fails too.
  CHECK(water_filling_check(0.25).largest_gap > kWaterFillingTolerance);
  CHECK(water_filling_check(1.0).largest_gap > kWaterFillingTolerance);
}

TEST_CASE("entropy rule: every alpha reaching the minimal error is a best alpha (ties)") {
  const std::vector<double> alphas = {0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0};
  // Alphas 0 .. 0.5 round to the identical plan: the same error; larger alphas are worse.
  const std::vector<double> errors = {2.0, 2.0, 2.0, 2.0, 2.0 * (1 + 1e-12), 2.5, 3.0, 3.5, 4.0};
  const AlphaVerdict half = alpha_verdict(alphas, errors, 0.5, 0.125);
  CHECK(half.best == std::vector<double>{0, 0.125, 0.25, 0.375, 0.5});
  CHECK(half.nearest == 0.5);
  CHECK(half.holds);
  CHECK(alpha_verdict(alphas, errors, 0.25, 0.125).holds);
  // A claim whose error is above the minimum and more than a grid step from any best alpha fails.
  CHECK(!alpha_verdict(alphas, errors, 1.0, 0.125).holds);
  CHECK(alpha_verdict(alphas, errors, 1.0, 0.125).nearest == 0.5);
  // Within one grid step of a best alpha still holds (the grid's resolution).
  CHECK(alpha_verdict(alphas, errors, 0.625, 0.125).holds);
}

TEST_CASE("entropy rule: NaN errors are never a best alpha; all NaN means no verdict") {
  const std::vector<double> alphas = {0, 0.25, 0.5};
  const AlphaVerdict v = alpha_verdict(alphas, {std::nan(""), 3.0, 2.0}, 0.5, 0.25);
  CHECK(v.best == std::vector<double>{0.5});
  CHECK(v.holds);
  const AlphaVerdict none = alpha_verdict(alphas, {std::nan(""), std::nan(""), std::nan("")}, 0.5, 0.25);
  CHECK(none.best.empty());
  CHECK(std::isnan(none.nearest));
  CHECK(!none.holds);
}

TEST_CASE("parallel_for_rethrow: every index runs; the lowest failing index's error is rethrown") {
  std::vector<int> ran(64, 0);
  auto body = [&](int64_t i) {
    ran[static_cast<size_t>(i)] = 1;
    if (i == 17 || i == 40) throw Error("index " + std::to_string(i));
  };
  CHECK_THROWS_WITH_AS(parallel_for_rethrow(64, body), "index 17", Error);
  CHECK(std::count(ran.begin(), ran.end(), 1) == 64);
  CHECK_NOTHROW(parallel_for_rethrow(0, body));
}
