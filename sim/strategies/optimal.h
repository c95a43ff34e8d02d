// optimal: Lagrangian allocation over measured per-unit distortion (methods.md §3).
//
// For every allocation unit u (the open cells of one layer, KV head, K or V) and
// candidate width s, D_u(s) is measured: only u is quantized (its protections kept,
// everything else exact) and the objective's error is summed over the query heads
// that read u, on the calibration queries. C_u(s) is its exact cost in bits. The
// allocation minimises Σ D_u subject to Σ C_u <= budget: bisection on λ over
// min_s D_u(s) + λ·C_u(s), a greedy marginal repair (ΔD/ΔC) to meet the budget
// exactly, and pairwise exchanges while they lower Σ D_u. The objective is any
// attention metric with an additive per-row error (sim/metrics/metric_table.h,
// AdditiveError): attn_kl_mean (Σ KL), attn_out_rel_fro (Σ ‖Δo‖²), logit_rmse
// (Σ logit error²) or attn_out_rel_err (Σ ‖Δo‖ / ‖o‖); D_u is that sum.
//
// Additivity is checked and reported: objective_predicted = Σ_u D_u(s_u) against
// objective_joint, the same objective measured with every unit quantized at once, on
// the same calibration queries; additivity = joint / predicted.
//
// The protections as choices (methods.md §3, "The optimal allocator's search space"):
// with candidate_sink_heads, candidate_sink_tokens, candidate_windows or phase_split,
// a unit is every (layer, KV head, K or V) of a budgeted kind that the fixed
// protections leave open, and its candidates are UnitChoice's: kept whole at
// sink_head_format, or each combination of a sink-token count (its first N tokens at
// sink_token_format, 0 included), a window size (0 included) and a width (or, with a
// phase split, a width per phase). Each candidate is measured as a whole (D_u of the
// unit with its sink tokens, window and widths together), costs its exact bits by
// Plan::segment_bits/window_bits (methods.md §1), and the candidates a cheaper or
// equally cheap one beats are dropped before the knapsack.
//
// calibration_data: the distortion tables (and the additivity check) are measured on
// other data (StrategyInput::calibration), the plan's memory on the evaluated
// recording; objective_calibration reports the objective's metric on the calibration
// data, next to the evaluated metrics.
//
// The tables and the additivity check are measured by the Measurer of the run's
// planning backend (StrategyInput::measurer_for, sim/measurer.h): on the GPU for
// backend = "cuda", else, and without a run's, by the CPU simulator.
#pragma once
#include "sim/metrics/metric_table.h"
#include "sim/strategies/phase.h"
#include "sim/strategies/protected_strategy.h"

namespace kvb {


// min Σ D subject to Σ cost <= budget over one candidate per unit (D[u][i] aligned
// with prob.cost[u][i]): Lagrangian bisection, greedy repair, pairwise exchanges.
// *lambda receives the multiplier of the Lagrangian solution.
std::vector<size_t> solve_lagrangian(const BudgetProblem& prob, const std::vector<std::vector<double>>& D,
                                     double* lambda);

// One candidate of a unit in the extended search space.
struct UnitChoice {
  bool sink_head = false;    // the whole unit at sink_head_format (the fields below unused)
  int64_t sink_tokens = 0;   // its first N tokens at sink_token_format
  int64_t window = 0;        // a recency window of W tokens at window_format; 0 = none
  size_t width[2] = {0, 0};  // indices into the kind's family: [first phase], [second phase]
  bool split = false;        // width[1] from the phase boundary on (else width[0] everywhere)
};

// The efficient candidates of one unit (candidate i costs cost[i] bits and has
// distortion D[i]): sorted by cost, each strictly better (lower D) than every cheaper
// one; of equal costs the lower D, then the earlier candidate. The cheapest candidate
// is always kept. Returns indices into the inputs.
std::vector<size_t> efficient_choices(const std::vector<uint64_t>& cost, const std::vector<double>& D);

class OptimalStrategy final : public ProtectedStrategy {
 public:
  explicit OptimalStrategy(const Params& p);

 protected:
  void allocate(const StrategyInput& in, Plan& plan) const override;
  bool allocator_needs_statistics() const override { return true; }

 private:
  struct KindCandidates {
    bool sink_head = false;
    std::vector<int64_t> sink_tokens;  // counts > 0
    std::vector<int64_t> windows;      // sizes > 0
  };
  // Whether the search space goes beyond one width per unit, or the tables are
  // measured on other data: then allocate_choices() runs, else the width-only
  // allocation as it always was.
  bool extended() const;
  void allocate_choices(const StrategyInput& in, Plan& plan) const;
  std::vector<UnitChoice> unit_choices(Kind kind) const;
  // The unit (layer, KV head, kind) of `base` (a protected plan, fixed kinds filled)
  // with choice `c`; `boundary`: the first token of the second phase (phase_split).
  UnitPlan realize(const Plan& base, int64_t layer, int64_t kv_head, Kind kind, const UnitChoice& c,
                   std::optional<int64_t> boundary) const;

  const AdditiveError* objective_ = nullptr;  // the metric minimized, by its row error
  BudgetSetup budget_;
  KindCandidates candidates_[2];  // [Key], [Value]
  bool phase_split_ = false;
  PhaseBoundary boundary_;
  std::optional<std::string> calibration_data_;
};

std::unique_ptr<Strategy> make_optimal(const Params& p);
const std::vector<ParamDef>& optimal_params();

}  // namespace kvb
