// uniform: one setting everywhere (methods.md §3). Either a fixed `format` (per kind:
// key_format / value_format), or a budget: the one width of the family that the
// budget affords everywhere, with the remainder spent one unit at a time (spread
// evenly over layers) so the budget is met exactly. Protections apply first.
#pragma once
#include <optional>

#include "sim/strategies/protected_strategy.h"

namespace kvb {

class UniformStrategy final : public ProtectedStrategy {
 public:
  explicit UniformStrategy(const Params& p);
  // Fixed formats, no protections.
  UniformStrategy(FormatPtr key, FormatPtr value) : format_{std::move(key), std::move(value)} {}

 protected:
  void allocate(const StrategyInput& in, Plan& plan) const override;

 private:
  FormatPtr format_[2];                // fixed mode
  std::optional<BudgetSetup> budget_;  // budget mode
};

std::unique_ptr<Strategy> make_uniform(const Params& p);
const std::vector<ParamDef>& uniform_params();

}  // namespace kvb
