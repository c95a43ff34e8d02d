// entropy: entropy-adaptive bits per KV head (methods.md §3).
//   b_h = b̄ + α·(H̄ − H_h)
// H_h: the head's attention entropy (Shannon or Rényi-2, `entropy`) averaged over the
// calibration queries (causal prefix only), GQA-aggregated over its query heads
// (`gqa`); H̄: the mean over the heads being allocated (sink heads excluded). Low
// entropy (focused) heads get more bits. With budget_bpe, b̄ is the largest value
// whose rounding to the supported widths (clamped to [min_bits, max_bits]) fits, and
// a repair by deficit (b_h − width) meets the budget exactly. With mean_bits instead,
// b̄ is given and the rounded widths are used as they are (the research's setup: its
// memory is whatever that costs).
#pragma once
#include <optional>

#include "sim/strategies/protected_strategy.h"

namespace kvb {

class EntropyStrategy final : public ProtectedStrategy {
 public:
  explicit EntropyStrategy(const Params& p);

 protected:
  void allocate(const StrategyInput& in, Plan& plan) const override;
  bool allocator_needs_statistics() const override { return true; }

 private:
  double alpha_[2] = {0.5, 0.5};
  std::optional<BudgetSetup> budget_;
  std::optional<double> mean_bits_[2];  // without a budget
  WidthFamily family_[2];               // without a budget
};

std::unique_ptr<Strategy> make_entropy(const Params& p);
const std::vector<ParamDef>& entropy_params();

}  // namespace kvb
