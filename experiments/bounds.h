// The bounds report (methods.md §5): every bound or prediction the research and the
// theory make, next to a measurement, and whether it holds. Rows:
//   gaussian      Shannon's 4^(−b) against the Lloyd-Max and best-uniform MSE (exact
//                 and on samples) and against the int formats on Gaussian data; the
//                 Lloyd-Max and uniform-step tables; the high-rate gaps √3π/2
//                 (fixed-rate Lloyd-Max) and πe/6 (entropy-coded uniform);
//   water-filling the optimal integer allocation over Gaussian units of different
//                 variances against b_i = b̄ + ½·log₂(σ_i²/geomean σ²);
//   turboquant    the rotation formats' MSE against (√3π/2)·4^(−b) and 4^(−(b+16/d)) on unit
//                 vectors, and TurboQuant-prod's inner-product error against
//                 (√3π²/d)·‖y‖²·4^(−b);
//   first-order   value error E‖Δo‖² = Σ p²‖e‖² (and 2^(−H₂)·σ_e²), key error
//                 KL ≈ ½·Var_p(Δs), on a GPT-2-like synthetic recording (or --data);
//   entropy-rule  the best α of b_h = b̄ + α(H̄ − H₂(h)) measured at equal bpe, against
//                 the Lagrange optimum 0.5 of the research's error model and the
//                 research's 0.25 (alpha_verdict: several α can give the identical
//                 plan, so every α within 1e-9 relative of the minimal error is a best α);
//   taqg          the best phase split measured at equal bpe on a synthetic reasoning
//                 trace (ρ 0.463 / 0.544), against the TAQG bound as written and
//                 reverse water-filling.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "sim/metrics/model_metrics.h"

namespace kvb {

struct BoundRow {
  std::string section;   // gaussian, first-order, entropy-rule, taqg
  std::string name;      // short identifier, e.g. "shannon b=2 lloyd-max"
  std::string claim;     // the bound or prediction as stated
  double predicted = 0;  // its value
  double measured = 0;
  bool holds = false;     // the criterion applied to the measured value itself
  std::string criterion;  // when it counts as holding
  std::string note;
  // The uncertainty behind the verdict (methods.md §5, "Verdicts"): a 95 % interval of
  // the quantity the criterion tests (interval_of: "measured", "measured/predicted",
  // "error at the prediction - minimum error", ...), from the samples the measurement
  // averages; {NaN, NaN} with interval_of "exact" when the row is computed exactly (no
  // sampling), and then the verdict is the criterion's.
  Interval interval{std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
  std::string interval_of = "exact";
  // "holds" or "violated" only when the interval lies wholly inside or outside what the
  // criterion accepts, else "within uncertainty" (bound_verdict).
  std::string verdict;
};

// The verdict of a criterion that accepts a quantity in [accept_lo, accept_hi] (either
// end infinite), given its interval: "holds" when the interval lies inside, "violated"
// when it lies wholly outside, else "within uncertainty"; without an interval (NaN, an
// exact computation) `holds` decides.
std::string bound_verdict(bool holds, const Interval& interval, double accept_lo, double accept_hi);

struct BoundsOptions {
  uint64_t seed = 0;
  int64_t samples = 1 << 20;        // Gaussian samples per sampled MSE
  std::optional<DataSpec> data;     // attention rows: this recording instead of the synthetic one
  double entropy_budget_bpe = 4.0;  // budget of the α sweep
  double taqg_budget_bpe = 4.0;     // budget of the split sweep (uniform int3 g32 costs 4.0)
  bool quick = false;               // smaller recordings and grids (tests)
};

// The entropy-rule verdict for a claimed α from errors measured on a grid of α: `best`
// lists every α whose error is within 1e-9 (relative) of the minimum (ties: several α
// round to the identical plan), `nearest` is the best α closest to the claim, and the
// claim holds when its own error reaches the minimum or `nearest` lies within one grid
// step of it.
struct AlphaVerdict {
  std::vector<double> best;
  double nearest = 0;
  bool holds = false;
};
AlphaVerdict alpha_verdict(const std::vector<double>& alphas, const std::vector<double>& errors, double claimed,
                           double step);

// Runs every measurement (parallel over sweep points) and returns the rows in order.
std::vector<BoundRow> bounds_report(const BoundsOptions& opt);

// What is not a row, and why (written under the markdown table).
const std::vector<std::string>& bounds_notes();

std::string bounds_csv(const std::vector<BoundRow>& rows);
std::string bounds_markdown(const std::vector<BoundRow>& rows);

}  // namespace kvb
