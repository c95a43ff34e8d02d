#include "sim/strategies/uniform.h"

#include "sim/core/error.h"
#include "sim/formats/registry.h"

namespace kvb {

const std::vector<ParamDef>& uniform_params() {
  // `format` (fixed) and the budget parameters are the shared budget parameters.
  static const std::vector<ParamDef> params = with_shared_params({}, true);
  return params;
}

UniformStrategy::UniformStrategy(const Params& p) : ProtectedStrategy(p), budget_(read_budget_setup(p, "uniform")) {
  if (budget_) return;
  refuse_unused_params(p, "uniform", {"min_bits", "max_bits"}, "without budget_bpe (they clamp a family's widths)");
  for (Kind kind : {Kind::Key, Kind::Value}) {
    const std::string key = p.kind_name("format", kind);
    if (!p.has(key)) {
      if (p.has("family", kind))
        throw ConfigError("uniform: `" + p.kind_name("family", kind) + "` needs budget_bpe (or use `format`)");
      throw ConfigError("uniform needs `format` (or key_format and value_format), or budget_bpe with a family");
    }
    if (p.str(key).find(kWidthPlaceholder) != std::string::npos)
      throw ConfigError(key + ": '" + p.str(key) + "' contains {b}, which only a family (with budget_bpe) may use");
    format_[static_cast<int>(kind)] = make_format(p.str(key));
  }
}

void UniformStrategy::allocate(const StrategyInput&, Plan& plan) const {
  if (!budget_) {
    for (Kind kind : {Kind::Key, Kind::Value}) fill_open_segments(plan, kind, format_[static_cast<int>(kind)]);
    return;
  }
  budget_->fill_fixed(plan);
  BudgetedAllocation alloc(plan, make_alloc_units(plan, std::nullopt), budget_->of(Kind::Key), budget_->of(Kind::Value),
                           budget_->budget);
  double bbar = 0;
  const std::vector<size_t> choice =
      allocate_target_bits(alloc, std::vector<double>(alloc.units().size(), 0.0), plan, &bbar);
  plan.annotate("bits_mean", mean_width(alloc, choice, [](const AllocUnit&) { return true; }));
}

std::unique_ptr<Strategy> make_uniform(const Params& p) { return std::make_unique<UniformStrategy>(p); }

}  // namespace kvb
