#include "sim/strategies/entropy.h"

#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

const std::vector<ParamDef>& entropy_params() {
  static const std::vector<ParamDef> params = with_shared_params(
      {
          {"alpha", ParamType::Real,
           "bits per bit of entropy: b_h = b̄ + alpha·(H̄ − H_h) (0.5 is the Lagrange "
           "optimum under the research's error model; the research claimed 0.25)",
           0.5, true},
          {"mean_bits", ParamType::Real, "instead of budget_bpe: b̄ itself, widths rounded without a budget repair",
           std::nullopt, true, true},
      },
      true);
  return params;
}

EntropyStrategy::EntropyStrategy(const Params& p) : ProtectedStrategy(p), budget_(read_budget_setup(p, "entropy")) {
  for (Kind kind : {Kind::Key, Kind::Value}) {
    const int k = static_cast<int>(kind);
    alpha_[k] = p.real("alpha", kind);
    if (p.has("mean_bits", kind)) mean_bits_[k] = p.real("mean_bits", kind);
    if (budget_ && mean_bits_[k])
      throw ConfigError("entropy: give budget_bpe or " + p.kind_name("mean_bits", kind) + ", not both");
    if (!budget_) {
      if (!mean_bits_[k]) throw ConfigError("entropy needs budget_bpe (with a family), or mean_bits");
      refuse_unused_params(p, "entropy", {"format"},
                           "with mean_bits (the widths come from `family`; a fixed format goes with a budget)");
      if (!p.has("family", kind))
        throw ConfigError("entropy: " + p.kind_name("mean_bits", kind) + " needs a family with {b}, e.g. " +
                          "`family = \"int{b}-asym-g32\"`");
      family_[k] = WidthFamily::from_params(p, kind);
    }
  }
}

void EntropyStrategy::allocate(const StrategyInput& in, Plan& plan) const {
  RecordingStats& stats = require_stats(in, "entropy");
  if (budget_) budget_->fill_fixed(plan);
  const std::vector<AllocUnit> units = make_alloc_units(plan, std::nullopt);
  // H per unit and H̄ per kind over the heads being allocated.
  std::vector<double> h(units.size());
  double hsum[2] = {0, 0};
  int64_t hn[2] = {0, 0};
  for (size_t u = 0; u < units.size(); ++u) {
    h[u] = stats.kv_head_entropy(units[u].layer, units[u].kv_head, protections().entropy(), protections().gqa(),
                                 protections().entropy_average());
    hsum[static_cast<int>(units[u].kind)] += h[u];
    ++hn[static_cast<int>(units[u].kind)];
  }
  std::vector<double> offset(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    const int k = static_cast<int>(units[u].kind);
    offset[u] = alpha_[k] * (hsum[k] / static_cast<double>(hn[k]) - h[u]);
  }
  for (int k = 0; k < 2; ++k)
    if (hn[k])
      plan.annotate(std::string(k == 0 ? "key" : "value") + "_entropy_mean", hsum[k] / static_cast<double>(hn[k]));

  if (budget_) {
    BudgetedAllocation alloc(plan, units, budget_->of(Kind::Key), budget_->of(Kind::Value), budget_->budget);
    double bbar = 0;
    const std::vector<size_t> choice = allocate_target_bits(alloc, offset, plan, &bbar);
    plan.annotate("bits_mean", mean_width(alloc, choice, [](const AllocUnit&) { return true; }));
    return;
  }
  double wsum = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int k = static_cast<int>(units[u].kind);
    const size_t c = family_[k].nearest(*mean_bits_[k] + offset[u]);
    wsum += static_cast<double>(family_[k].widths[c]);
    UnitPlan& up = plan.unit(units[u].layer, units[u].kv_head, units[u].kind);
    for (size_t s : units[u].segments) up.segments[s].format = family_[k].formats[c];
  }
  if (!units.empty()) plan.annotate("bits_mean", wsum / static_cast<double>(units.size()));
}

std::unique_ptr<Strategy> make_entropy(const Params& p) { return std::make_unique<EntropyStrategy>(p); }

}  // namespace kvb
