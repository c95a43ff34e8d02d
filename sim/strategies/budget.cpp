#include "sim/strategies/budget.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/strategies/protections.h"

namespace kvb {

const std::vector<ParamDef>& budget_params() {
  static const std::vector<ParamDef> params = {
      {"budget_bpe", ParamType::Real,
       "bits per element of the whole cache to meet exactly (everything counted: protections, windows, metadata); "
       "key_/value_budget_bpe give keys and values separate budgets",
       std::nullopt, true, true},
      {"family", ParamType::String, "format family with {b} for the allocator's width, e.g. \"int{b}-asym-g32\"",
       std::nullopt, true, true},
      {"widths", ParamType::IntList, "widths {b} the allocator may use", IntList{2, 3, 4, 5, 6, 8}, true},
      {"min_bits", ParamType::Real, "clamp: no width below this", std::nullopt, true, true},
      {"max_bits", ParamType::Real, "clamp: no width above this", std::nullopt, true, true},
      {"format", ParamType::String,
       "a fixed format instead of a budget (e.g. int4-asym-g32); with key_budget_bpe alone, value_format fixes the "
       "values (and vice versa)",
       std::nullopt, true, true},
      {"budget_context", ParamType::Int,
       "context (tokens) at which the budget is met (windows and sinks weigh less at longer contexts); 0 = the "
       "recording's",
       int64_t{0}},
  };
  return params;
}

const std::vector<std::string>& budget_columns() {
  static const std::vector<std::string> columns = [] {
    std::vector<std::string> c;
    for (const char* prefix : {"", "key_", "value_"})
      for (const char* name : {"budget_bpe", "budget_slack_bpe", "budget_step_bpe"}) c.push_back(prefix + std::string(name));
    c.push_back("budget_context");
    return c;
  }();
  return columns;
}

std::string family_format_name(const std::string& pattern, int64_t width) {
  return replace_all(pattern, "b", std::to_string(width));
}

WidthFamily WidthFamily::from_params(const Params& p, Kind kind) {
  WidthFamily f;
  const std::string key = p.kind_name("family", kind);
  f.pattern = p.str(key);
  if (f.pattern.find(kWidthPlaceholder) == std::string::npos)
    throw ConfigError(key + ": family '" + f.pattern +
                      "' has no {b} placeholder for the allocator's width (e.g. "
                      "\"int{b}-asym-g32\")");
  const std::string wkey = p.kind_name("widths", kind);
  std::vector<int64_t> widths = p.int_list(wkey);
  std::sort(widths.begin(), widths.end());
  widths.erase(std::unique(widths.begin(), widths.end()), widths.end());
  if (widths.empty()) throw ConfigError(wkey + ": no width given");
  const std::string lo_key = p.kind_name("min_bits", kind), hi_key = p.kind_name("max_bits", kind);
  const double lo = p.has(lo_key) ? p.real(lo_key) : -1e300, hi = p.has(hi_key) ? p.real(hi_key) : 1e300;
  for (int64_t w : widths)
    if (static_cast<double>(w) >= lo && static_cast<double>(w) <= hi) f.widths.push_back(w);
  if (f.widths.empty())
    throw ConfigError(wkey + ": no width of " + param_to_string(widths) + " lies within [" + lo_key + ", " + hi_key +
                      "]");
  for (int64_t w : f.widths) f.formats.push_back(f.at(w));
  return f;
}

FormatPtr WidthFamily::at(int64_t width) const {
  const std::string name = family_format_name(pattern, width);
  try {
    return make_format(name);
  } catch (ConfigError& e) {
    e.add_context("family '" + pattern + "' at width " + std::to_string(width));
    throw;
  }
}

size_t WidthFamily::nearest(double bits) const {
  size_t best = 0;
  for (size_t i = 1; i < widths.size(); ++i)
    if (std::fabs(static_cast<double>(widths[i]) - bits) < std::fabs(static_cast<double>(widths[best]) - bits))
      best = i;
  return best;
}

std::optional<BudgetSpec> BudgetSpec::from_params(const Params& p) {
  const bool k = p.has("key_budget_bpe"), v = p.has("value_budget_bpe"), joint = p.has("budget_bpe");
  if (!k && !v && !joint) return std::nullopt;
  BudgetSpec b;
  b.context = p.integer("budget_context");
  if (b.context < 0 || b.context > (int64_t{1} << 40))
    throw ConfigError("budget_context: must be between 0 (the recording's context) and 2^40 tokens");
  if (k || v) {
    b.separate = true;
    for (Kind kind : {Kind::Key, Kind::Value}) {
      const std::string name = p.kind_name("budget_bpe", kind);
      b.budgeted[static_cast<int>(kind)] = p.has(name);
      if (p.has(name)) b.bpe[static_cast<int>(kind)] = p.real(name);
    }
  } else {
    b.bpe[0] = p.real("budget_bpe");
  }
  for (int k = 0; k < (b.separate ? 2 : 1); ++k)
    if (b.budgeted[k] && !(b.bpe[k] > 0)) throw ConfigError("budget_bpe: must be > 0, got " + format_double(b.bpe[k]));
  return b;
}

std::vector<AllocUnit> make_alloc_units(const Plan& plan, std::optional<int64_t> boundary) {
  std::vector<AllocUnit> out;
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const std::vector<Segment>& segs = plan.unit(l, g, kind).segments;
        for (int phase = 0; phase < (boundary ? 2 : 1); ++phase) {
          AllocUnit u{l, g, kind, phase, {}};
          for (size_t i = 0; i < segs.size(); ++i) {
            if (!is_open(segs[i])) continue;
            const bool second = boundary && segs[i].begin >= *boundary;
            if (second == (phase == 1)) u.segments.push_back(i);
          }
          if (!u.segments.empty()) out.push_back(std::move(u));
        }
      }
  return out;
}

uint64_t BudgetProblem::total(const std::vector<size_t>& choice) const {
  uint64_t t = 0;
  for (size_t u = 0; u < cost.size(); ++u) t += cost[u][choice[u]];
  return t;
}

std::vector<size_t> spread_ranks(size_t n) {
  // Kronecker sequence frac(i·φ⁻¹): every stride of units (a phase, a kind, a layer)
  // is interleaved evenly with the others, unlike a bit-reversal order, which would
  // put all even units (e.g. every first phase) before all odd ones.
  const double inv_phi = (std::sqrt(5.0) - 1) / 2;
  std::vector<double> key(n);
  for (size_t i = 0; i < n; ++i) key[i] = std::fmod(static_cast<double>(i) * inv_phi, 1.0);
  std::vector<size_t> order(n), rank(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  for (size_t r = 0; r < n; ++r) rank[order[r]] = r;
  return rank;
}

void repair_budget(const BudgetProblem& prob, std::vector<size_t>& choice, const UpgradePriority& priority,
                   const std::vector<size_t>& tie_rank) {
  const size_t n = prob.cost.size();
  uint64_t total = prob.total(choice);
  auto better = [&](double p, size_t u, double bp, size_t bu) {  // upgrade u before bu?
    if (p != bp) return p > bp;
    if (tie_rank[u] != tie_rank[bu]) return tie_rank[u] < tie_rank[bu];
    return u < bu;
  };
  while (total > prob.budget) {
    size_t best = n;
    double best_p = 0;
    for (size_t u = 0; u < n; ++u) {
      if (choice[u] == 0) continue;
      const double p = priority(u, choice[u] - 1);
      if (best == n || better(best_p, best, p, u)) {
        best = u;
        best_p = p;
      }
    }
    if (best == n) throw Error("internal: budget repair cannot go below the cheapest allocation");
    total -= prob.cost[best][choice[best]] - prob.cost[best][choice[best] - 1];
    --choice[best];
  }
  for (;;) {
    size_t best = n;
    double best_p = 0;
    for (size_t u = 0; u < n; ++u) {
      const size_t c = choice[u];
      if (c + 1 >= prob.cost[u].size()) continue;
      if (total + (prob.cost[u][c + 1] - prob.cost[u][c]) > prob.budget) continue;
      const double p = priority(u, c);
      if (best == n || better(p, u, best_p, best)) {
        best = u;
        best_p = p;
      }
    }
    if (best == n) break;
    total += prob.cost[best][choice[best] + 1] - prob.cost[best][choice[best]];
    ++choice[best];
  }
}

std::vector<size_t> solve_target_bits(const BudgetProblem& prob, const std::vector<double>& offset,
                                      const std::vector<const WidthFamily*>& family, double* mean) {
  const size_t n = prob.cost.size();
  double wmin = 1e300, wmax = -1e300, omax = 0;
  for (size_t u = 0; u < n; ++u) {
    wmin = std::min(wmin, static_cast<double>(family[u]->widths.front()));
    wmax = std::max(wmax, static_cast<double>(family[u]->widths.back()));
    omax = std::max(omax, std::fabs(offset[u]));
  }
  auto round_at = [&](double bbar) {
    std::vector<size_t> c(n);
    for (size_t u = 0; u < n; ++u) c[u] = family[u]->nearest(bbar + offset[u]);
    return c;
  };
  double lo = wmin - omax - 1, hi = wmax + omax + 1;
  if (n == 0) lo = hi = 0;
  if (prob.total(round_at(hi)) <= prob.budget) {
    lo = hi;
  } else {
    for (int it = 0; it < 200 && hi - lo > 1e-12; ++it) {
      const double mid = 0.5 * (lo + hi);
      if (prob.total(round_at(mid)) <= prob.budget)
        lo = mid;
      else
        hi = mid;
    }
  }
  std::vector<size_t> choice = round_at(lo);
  const double bbar = lo;
  repair_budget(
      prob, choice,
      [&](size_t u, size_t from) { return bbar + offset[u] - static_cast<double>(family[u]->widths[from]); },
      spread_ranks(n));
  if (mean) *mean = bbar;
  return choice;
}

uint64_t alloc_unit_bits(const Plan& plan, const AllocUnit& u, const Format& f, int64_t context) {
  const UnitPlan& up = plan.unit(u.layer, u.kv_head, u.kind);
  uint64_t bits = 0;
  for (size_t s : u.segments) bits += plan.segment_bits(up, up.segments[s].begin, up.segments[s].end, f, context);
  return bits;
}

BudgetedAllocation::BudgetedAllocation(const Plan& plan, std::vector<AllocUnit> units, const WidthFamily* key_family,
                                       const WidthFamily* value_family, const BudgetSpec& budget)
    : units_(std::move(units)), families_{key_family, value_family}, budget_(budget) {
  context_ = budget.context > 0 ? budget.context : plan.tokens();
  if (context_ < plan.tokens())  // tokens past the context would be priced at nothing
    throw Error("budget_context: " + std::to_string(context_) + " tokens is shorter than the recording's " +
                std::to_string(plan.tokens()) + " (the tokens past it would cost nothing); give at least " +
                std::to_string(plan.tokens()) + " or 0 for the recording's context");
  const double per_kind_elements =
      static_cast<double>(plan.layers() * plan.kv_heads() * plan.head_dim()) * static_cast<double>(context_);
  const std::vector<std::vector<Kind>> kinds = budget.separate
                                                   ? std::vector<std::vector<Kind>>{{Kind::Key}, {Kind::Value}}
                                                   : std::vector<std::vector<Kind>>{{Kind::Key, Kind::Value}};
  for (size_t gi = 0; gi < kinds.size(); ++gi) {
    if (budget.separate && !budget.budgeted[gi]) continue;  // a fixed kind
    Group g;
    g.elements = per_kind_elements * static_cast<double>(kinds[gi].size());
    g.budget_bpe = budget.bpe[gi];
    for (Kind kind : kinds[gi])
      for (int64_t l = 0; l < plan.layers(); ++l)
        for (int64_t h = 0; h < plan.kv_heads(); ++h) {
          const UnitPlan& up = plan.unit(l, h, kind);
          for (const Segment& s : up.segments)
            if (!is_open(s)) g.fixed_bits += plan.segment_bits(up, s.begin, s.end, *s.format, context_);
          g.fixed_bits += plan.window_bits(up, context_);
        }
    uint64_t cheapest = g.fixed_bits, dearest = g.fixed_bits;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (std::find(kinds[gi].begin(), kinds[gi].end(), units_[u].kind) == kinds[gi].end()) continue;
      if (!families_[static_cast<int>(units_[u].kind)])
        throw Error("internal: open cells of a kind without a budget (fill its fixed format first)");
      const WidthFamily& fam = *families_[static_cast<int>(units_[u].kind)];
      std::vector<uint64_t> cost;
      for (const FormatPtr& f : fam.formats) cost.push_back(alloc_unit_bits(plan, units_[u], *f, context_));
      for (size_t i = 1; i < cost.size(); ++i)
        if (cost[i] < cost[i - 1])
          throw Error("family '" + fam.pattern + "' costs less at width " + std::to_string(fam.widths[i]) +
                      " than at " + std::to_string(fam.widths[i - 1]) + "; widths must not get cheaper");
      cheapest += cost.front();
      dearest += cost.back();
      g.units.push_back(u);
      g.problem.cost.push_back(std::move(cost));
    }
    g.kind_name = budget.separate ? (gi == 0 ? "key" : "value") : "";
    const std::string name = budget.separate ? g.kind_name + "_budget_bpe " : "budget_bpe ";
    const double budget_bits_real = g.budget_bpe * g.elements;
    const uint64_t budget_bits = static_cast<uint64_t>(std::floor(budget_bits_real));
    auto bpe = [&](uint64_t bits) {
      return format_double(std::round(static_cast<double>(bits) / g.elements * 1e6) / 1e6);
    };
    const std::string ctx = budget.context > 0 ? " at context " + std::to_string(context_) : "";
    if (cheapest > budget_bits)
      throw Error(name + format_double(g.budget_bpe) + " is below the cheapest allocation" + ctx + ", " +
                  bpe(cheapest) + " bpe (protections and fixed cells " + bpe(g.fixed_bits) +
                  " bpe, then the smallest width everywhere else)");
    if (dearest < budget_bits)
      throw Error(name + format_double(g.budget_bpe) + " exceeds the dearest allocation" + ctx + ", " + bpe(dearest) +
                  " bpe (the largest width everywhere): it cannot be spent; add wider widths or lower the budget");
    g.problem.budget = budget_bits - g.fixed_bits;
    groups_.push_back(std::move(g));
  }
}

void BudgetedAllocation::apply(Plan& plan, const std::vector<size_t>& choice) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    const AllocUnit& au = units_[u];
    UnitPlan& up = plan.unit(au.layer, au.kv_head, au.kind);
    const FormatPtr& f = families_[static_cast<int>(au.kind)]->formats[choice[u]];
    for (size_t s : au.segments) up.segments[s].format = f;
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    std::vector<size_t> c;
    for (size_t u : g.units) c.push_back(choice[u]);
    const uint64_t spent = g.problem.total(c);
    if (spent > g.problem.budget) throw Error("internal: allocation over budget");
    uint64_t step = std::numeric_limits<uint64_t>::max();
    for (size_t i = 0; i < c.size(); ++i)
      if (c[i] + 1 < g.problem.cost[i].size())
        step = std::min(step, g.problem.cost[i][c[i] + 1] - g.problem.cost[i][c[i]]);
    const std::string prefix = column_prefix(gi);
    plan.annotate(prefix + "budget_bpe", g.budget_bpe);
    plan.annotate(prefix + "budget_slack_bpe",
                  (g.budget_bpe * g.elements - static_cast<double>(g.fixed_bits + spent)) / g.elements);
    plan.annotate(prefix + "budget_step_bpe",
                  step == std::numeric_limits<uint64_t>::max() ? std::nan("") : static_cast<double>(step) / g.elements);
  }
  if (budget_.context > 0) {
    plan.annotate("budget_context", static_cast<double>(budget_.context));
    plan.set_sized_for_context(budget_.context);
  }
}

}  // namespace kvb
