// The strategy table. One entry per strategy type; order is the order users see.
// Every type takes the protections (sim/strategies/protections.h) and, except where
// noted, a budget (sim/strategies/budget.h).
#include "sim/strategies/entropy.h"
#include "sim/strategies/optimal.h"
#include "sim/strategies/phase.h"
#include "sim/strategies/protected_strategy.h"
#include "sim/strategies/strategy.h"
#include "sim/strategies/uniform.h"

namespace kvb {

const std::vector<StrategyType>& strategy_types() {
  // columns: what each type's allocate() annotates (the budget's and the
  // protections' are added by with_shared_columns).
  static const std::vector<StrategyType> types = {
      {"uniform", "one format everywhere, or the widths of a family that meet budget_bpe exactly", uniform_params(),
       &make_uniform, with_shared_columns({"bits_mean"}, true)},
      {"entropy", "entropy-adaptive bits per KV head: b_h = b̄ + alpha·(H̄ − H_h), rounded, budget repaired",
       entropy_params(), &make_entropy,
       with_shared_columns({"key_entropy_mean", "value_entropy_mean", "bits_mean"}, true)},
      {"phase", "separate settings before and after a phase boundary (think / answer), with per-phase rho",
       phase_params(), &make_phase,
       with_shared_columns(
           {"phase_boundary", "rho_first", "rho_second", "split_bits", "phase_first_bits", "phase_second_bits"}, true),
       PlanReads::KeyRho},
      {"taqg", "phase bits from the TAQG bound on per-phase key redundancy rho", taqg_params(), &make_taqg,
       with_shared_columns({"phase_boundary", "rho_first", "rho_second", "taqg_redundant_phase", "taqg_reduction_bits",
                            "taqg_split_bits", "taqg_first_bits", "taqg_second_bits", "split_bits", "phase_first_bits",
                            "phase_second_bits"},
                           true),
       PlanReads::KeyRho},
      {"optimal", "Lagrangian allocation over measured per-unit distortion, with an additivity check", optimal_params(),
       &make_optimal,
       with_shared_columns({"objective", "objective_predicted", "objective_joint", "additivity", "lambda", "bits_mean",
                            "protections_chosen", "calibration_data", "objective_calibration"},
                           true),
       PlanReads::Tensors},
  };
  return types;
}

}  // namespace kvb
