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
#pragma once
#include "sim/metrics/metric_table.h"
#include "sim/strategies/protected_strategy.h"

namespace kvb {


// min Σ D subject to Σ cost <= budget over one candidate per unit (D[u][i] aligned
// with prob.cost[u][i]): Lagrangian bisection, greedy repair, pairwise exchanges.
// *lambda receives the multiplier of the Lagrangian solution.
std::vector<size_t> solve_lagrangian(const BudgetProblem& prob, const std::vector<std::vector<double>>& D,
                                     double* lambda);

class OptimalStrategy final : public ProtectedStrategy {
 public:
  explicit OptimalStrategy(const Params& p);

 protected:
  void allocate(const StrategyInput& in, Plan& plan) const override;
  bool allocator_needs_statistics() const override { return true; }

 private:
  const AdditiveError* objective_ = nullptr;  // the metric minimized, by its row error
  BudgetSetup budget_;
};

std::unique_ptr<Strategy> make_optimal(const Params& p);
const std::vector<ParamDef>& optimal_params();

}  // namespace kvb
