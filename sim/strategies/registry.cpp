// The strategy table. One entry per strategy type; order is the order users see.
// Every type takes the protections (sim/strategies/protections.h) and, except where
// noted, a budget (sim/strategies/budget.h).
#include "sim/strategies/entropy.h"
#include "sim/strategies/optimal.h"
#include "sim/strategies/phase.h"
#include "sim/strategies/strategy.h"
#include "sim/strategies/uniform.h"

namespace kvb {

const std::vector<StrategyType>& strategy_types() {
  static const std::vector<StrategyType> types = {
      {"uniform", "one format everywhere, or the widths of a family that meet budget_bpe exactly", uniform_params(),
       &make_uniform},
      {"entropy", "entropy-adaptive bits per KV head: b_h = b̄ + alpha·(H̄ − H_h), rounded, budget repaired",
       entropy_params(), &make_entropy},
      {"phase", "separate settings before and after a phase boundary (think / answer), with per-phase rho",
       phase_params(), &make_phase},
      {"taqg", "phase bits from the TAQG bound on per-phase key redundancy rho", taqg_params(), &make_taqg},
      {"optimal", "Lagrangian allocation over measured per-unit distortion, with an additivity check", optimal_params(),
       &make_optimal},
  };
  return types;
}

}  // namespace kvb
