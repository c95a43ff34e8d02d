#include "sim/strategies/protected_strategy.h"

#include <cmath>

#include "sim/core/error.h"

namespace kvb {

std::vector<ParamDef> with_shared_params(std::vector<ParamDef> own, bool budgeted) {
  if (budgeted) own.insert(own.end(), budget_params().begin(), budget_params().end());
  own.insert(own.end(), protection_params().begin(), protection_params().end());
  return own;
}

std::optional<BudgetSetup> read_budget_setup(const Params& p, const std::string& type) {
  const std::optional<BudgetSpec> b = BudgetSpec::from_params(p);
  if (!b) return std::nullopt;
  BudgetSetup s;
  s.budget = *b;
  for (Kind kind : {Kind::Key, Kind::Value}) {
    if (!p.has("family", kind))
      throw ConfigError(type + ": budget_bpe needs a format family with {b} for the allocator's width: `" +
                        p.kind_name("family", kind) + " = \"int{b}-asym-g32\"` (or key_family / value_family)");
    s.family[static_cast<int>(kind)] = WidthFamily::from_params(p, kind);
  }
  return s;
}

std::vector<const WidthFamily*> unit_families(const BudgetedAllocation& alloc, const std::vector<size_t>& units) {
  std::vector<const WidthFamily*> out;
  for (size_t u : units) out.push_back(&alloc.family(u));
  return out;
}

std::vector<size_t> allocate_target_bits(const BudgetedAllocation& alloc, const std::vector<double>& offset, Plan& plan,
                                         double* mean) {
  std::vector<size_t> choice(alloc.units().size(), 0);
  for (size_t g = 0; g < alloc.groups(); ++g) {
    const std::vector<size_t>& units = alloc.group_units(g);
    std::vector<double> off;
    for (size_t u : units) off.push_back(offset[u]);
    const std::vector<size_t> c = solve_target_bits(alloc.problem(g), off, unit_families(alloc, units), mean);
    for (size_t i = 0; i < units.size(); ++i) choice[units[i]] = c[i];
  }
  alloc.apply(plan, choice);
  return choice;
}

double mean_width(const BudgetedAllocation& alloc, const std::vector<size_t>& choice,
                  const std::function<bool(const AllocUnit&)>& pick) {
  double sum = 0;
  int64_t n = 0;
  for (size_t u = 0; u < alloc.units().size(); ++u) {
    if (!pick(alloc.units()[u])) continue;
    sum += static_cast<double>(alloc.family(u).widths[choice[u]]);
    ++n;
  }
  return n ? sum / static_cast<double>(n) : std::nan("");
}

}  // namespace kvb
