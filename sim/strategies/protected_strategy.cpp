#include "sim/strategies/protected_strategy.h"

#include <cmath>

#include "sim/core/error.h"
#include "sim/formats/registry.h"

namespace kvb {

std::vector<ParamDef> with_shared_params(std::vector<ParamDef> own, bool budgeted) {
  if (budgeted) own.insert(own.end(), budget_params().begin(), budget_params().end());
  own.insert(own.end(), protection_params().begin(), protection_params().end());
  return own;
}

std::vector<std::string> with_shared_columns(std::vector<std::string> own, bool budgeted) {
  if (budgeted) own.insert(own.end(), budget_columns().begin(), budget_columns().end());
  own.insert(own.end(), protection_columns().begin(), protection_columns().end());
  return own;
}

std::optional<BudgetSetup> read_budget_setup(const Params& p, const std::string& type) {
  const std::optional<BudgetSpec> b = BudgetSpec::from_params(p);
  if (!b) {
    if (p.has("budget_context") && p.integer("budget_context") != 0)
      throw ConfigError(type + ": `budget_context` is not used without budget_bpe (it is the context a budget is met at)");
    return std::nullopt;
  }
  BudgetSetup s;
  s.budget = *b;
  for (Kind kind : {Kind::Key, Kind::Value}) {
    const int k = static_cast<int>(kind);
    const bool budgeted = !b->separate || b->budgeted[k];
    const std::string format_key = p.kind_name("format", kind);
    if (!budgeted) {
      if (!p.has(format_key))
        throw ConfigError(type + ": " + std::string(kind == Kind::Key ? "value" : "key") +
                          "_budget_bpe alone budgets only " + (kind == Kind::Key ? "values" : "keys") + ": give " +
                          p.kind_name("budget_bpe", kind) + " (or " + (kind == Kind::Key ? "key" : "value") +
                          "_budget_bpe), or a fixed " + (kind == Kind::Key ? "key_format" : "value_format"));
      s.fixed[k] = make_format(p.str(format_key));
      continue;
    }
    if (p.has(format_key))
      throw ConfigError(type + ": give `" + format_key + "` or a budget (budget_bpe + family), not both");
    if (!p.has("family", kind))
      throw ConfigError(type + ": budget_bpe needs a format family with {b} for the allocator's width: `" +
                        p.kind_name("family", kind) + " = \"int{b}-asym-g32\"` (or key_family / value_family)");
    s.family[k] = WidthFamily::from_params(p, kind);
  }
  return s;
}

void refuse_unused_params(const Params& p, const std::string& type, const std::vector<std::string>& names,
                          const std::string& why) {
  for (const std::string& name : names)
    for (Kind kind : {Kind::Key, Kind::Value})
      if (p.has(name, kind)) throw ConfigError(type + ": `" + p.kind_name(name, kind) + "` is not used " + why);
}

void BudgetSetup::fill_fixed(Plan& plan) const {
  for (Kind kind : {Kind::Key, Kind::Value})
    if (fixed[static_cast<int>(kind)]) fill_open_segments(plan, kind, fixed[static_cast<int>(kind)]);
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
