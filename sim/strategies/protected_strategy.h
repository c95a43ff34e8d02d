// The shape every strategy type shares: the protections (sink heads, sink tokens,
// window, prompt), then the type's allocator on the cells they leave open.
#pragma once
#include <vector>

#include "sim/strategies/budget.h"
#include "sim/strategies/protections.h"
#include "sim/strategies/strategy.h"

namespace kvb {

class ProtectedStrategy : public Strategy {
 public:
  explicit ProtectedStrategy(const Params& p) : protections_(Protections::from_params(p)) {}
  ProtectedStrategy() = default;  // no protections

  Plan build(const StrategyInput& in) const final {
    Plan plan = protections_.apply(in);
    allocate(in, plan);
    return plan;
  }
  bool needs_statistics() const override { return protections_.needs_statistics() || allocator_needs_statistics(); }

 protected:
  // Gives every open segment of `plan` a format (and may annotate the plan).
  virtual void allocate(const StrategyInput& in, Plan& plan) const = 0;
  virtual bool allocator_needs_statistics() const { return false; }

  const Protections& protections() const { return protections_; }

 private:
  Protections protections_;
};

// Parameter list of a type: its own, then the budget parameters (when budgeted),
// then the protections.
std::vector<ParamDef> with_shared_params(std::vector<ParamDef> own, bool budgeted);
// Column list of a type (StrategyType::columns): its own, then the budget's (when
// budgeted) and the protections'.
std::vector<std::string> with_shared_columns(std::vector<std::string> own, bool budgeted);

// The budget of a budgeted type: per kind a family (budgeted) or a fixed format (a
// kind without a budget of its own), or nullopt without any budget. Throws
// kvb::ConfigError when a budgeted kind has no family, a fixed kind no format, or a
// budgeted kind a fixed format too.
struct BudgetSetup {
  BudgetSpec budget;
  WidthFamily family[2];  // [Key], [Value]: budgeted kinds
  FormatPtr fixed[2];     // [Key], [Value]: kinds without a budget, else nullptr
  const WidthFamily* of(Kind k) const { return fixed[static_cast<int>(k)] ? nullptr : &family[static_cast<int>(k)]; }
  // Gives the open cells of every fixed kind its format (call before make_alloc_units).
  void fill_fixed(Plan& plan) const;
};
std::optional<BudgetSetup> read_budget_setup(const Params& p, const std::string& type);

// Throws kvb::ConfigError "TYPE: `NAME` is not used WHY" for the first of `names`
// given (itself or its key_/value_ variant): parameters of another mode of the type,
// which would otherwise be ignored silently (e.g. first_bits next to budget_bpe).
void refuse_unused_params(const Params& p, const std::string& type, const std::vector<std::string>& names,
                          const std::string& why);

// The families of every unit (by kind), for solve_target_bits.
std::vector<const WidthFamily*> unit_families(const BudgetedAllocation& alloc, const std::vector<size_t>& units);

// Runs solve_target_bits on every budget group with per-unit offsets (indexed like
// alloc.units()) and writes the result into `plan`. Returns the choice over all units
// and, in *mean, b̄ of the last group.
std::vector<size_t> allocate_target_bits(const BudgetedAllocation& alloc, const std::vector<double>& offset, Plan& plan,
                                         double* mean);

// Mean allocated width over the units matching `pick` (NaN when none).
double mean_width(const BudgetedAllocation& alloc, const std::vector<size_t>& choice,
                  const std::function<bool(const AllocUnit&)>& pick);

}  // namespace kvb
