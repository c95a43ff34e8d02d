#include "sim/strategies/optimal.h"

#include <omp.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/simulator.h"

namespace kvb {

const std::vector<ParamDef>& optimal_params() {
  static const std::vector<ParamDef> params = with_shared_params(
      {
          {"objective", ParamType::String,
           "error minimised, an attention metric with an additive per-row error: \"attn_kl_mean\" (sum of "
           "attention KL), \"attn_out_rel_fro\" (sum of squared attention-output error), \"logit_rmse\" (sum of "
           "squared logit error) or \"attn_out_rel_err\" (sum of relative output error), measured on the "
           "calibration queries",
           std::string("attn_kl_mean")},
      },
      true);
  return params;
}

namespace {

// Candidate choice of every unit at multiplier lambda (ties: the cheaper candidate).
std::vector<size_t> lagrangian_choice(const BudgetProblem& prob, const std::vector<std::vector<double>>& D,
                                      double lambda) {
  std::vector<size_t> c(prob.cost.size(), 0);
  for (size_t u = 0; u < c.size(); ++u) {
    double best = D[u][0] + lambda * static_cast<double>(prob.cost[u][0]);
    for (size_t i = 1; i < D[u].size(); ++i) {
      const double v = D[u][i] + lambda * static_cast<double>(prob.cost[u][i]);
      if (v < best) {
        best = v;
        c[u] = i;
      }
    }
  }
  return c;
}

// Identifies a unit's layout (segments, formats, roles, window) for the distortion cache.
std::string unit_signature(const Plan& plan, const AllocUnit& u) {
  const UnitPlan& up = plan.unit(u.layer, u.kv_head, u.kind);
  std::ostringstream os;
  os << u.layer << "/" << u.kv_head << "/" << kind_name(u.kind) << "/p" << plan.prefill();
  for (const Segment& s : up.segments)
    os << "|" << s.begin << "-" << s.end << ":" << (s.format ? s.format->name() : "open") << ":"
       << static_cast<int>(s.role);
  if (up.window.active())
    os << "|w" << up.window.size << ":" << up.window.format->name() << ":" << static_cast<int>(up.window.mode) << ":"
       << up.window.extra_copy;
  return os.str();
}

// A plan of `plan`'s shape and prefill with every unit exact (keep-fp32), to copy the
// units under measurement into.
Plan exact_plan_like(const Plan& plan) {
  Plan m(plan.layers(), plan.kv_heads(), plan.tokens(), plan.head_dim());
  m.set_prefill(plan.prefill());
  const FormatPtr exact = make_format("keep-fp32");
  m.assign_all(Kind::Key, exact);
  m.assign_all(Kind::Value, exact);
  return m;
}

// D_u(f): only unit u quantized (open cells at f, its protections kept), everything
// else exact; the objective over its query heads at the calibration positions.
double measure_unit(const StrategyInput& in, const Plan& plan, const AllocUnit& u, const FormatPtr& f,
                    const AdditiveError& objective) {
  const Recording& rec = in.rec;
  Plan m = exact_plan_like(plan);
  UnitPlan& target = m.unit(u.layer, u.kv_head, u.kind);
  target = plan.unit(u.layer, u.kv_head, u.kind);
  for (size_t s : u.segments) target.segments[s].format = f;
  SimOptions opt;
  opt.positions = in.stats->calibration();
  opt.seed = in.seed;
  try {
    return objective.sum(simulate_kv_head(rec, m, u.layer, u.kv_head, opt).rows);
  } catch (const NonFiniteReconstruction&) {
    return std::numeric_limits<double>::infinity();  // a width that overflows is never worth choosing
  }
}

// `plan` with every (layer, KV head, kind) that holds no allocation unit exact: the
// part of the plan the per-unit distortions describe, for the additivity check.
// nullopt when the allocation units cover every (layer, KV head, kind).
std::optional<Plan> allocated_part(const Plan& plan, const std::vector<AllocUnit>& units) {
  std::set<std::tuple<int64_t, int64_t, Kind>> covered;
  for (const AllocUnit& u : units) covered.emplace(u.layer, u.kv_head, u.kind);
  if (static_cast<int64_t>(covered.size()) == 2 * plan.layers() * plan.kv_heads()) return std::nullopt;
  Plan m = exact_plan_like(plan);
  for (const auto& [layer, kv_head, kind] : covered) m.unit(layer, kv_head, kind) = plan.unit(layer, kv_head, kind);
  return m;
}

}  // namespace

std::vector<size_t> solve_lagrangian(const BudgetProblem& prob, const std::vector<std::vector<double>>& D,
                                     double* lambda) {
  const size_t n = prob.cost.size();
  double lo = 0, hi = 1;
  std::vector<size_t> choice = lagrangian_choice(prob, D, 0);
  if (prob.total(choice) > prob.budget) {
    while (prob.total(lagrangian_choice(prob, D, hi)) > prob.budget && hi < 1e300) hi *= 4;
    for (int it = 0; it < 200; ++it) {
      const double mid = 0.5 * (lo + hi);
      if (mid <= lo || mid >= hi) break;
      if (prob.total(lagrangian_choice(prob, D, mid)) > prob.budget)
        lo = mid;
      else
        hi = mid;
    }
    choice = lagrangian_choice(prob, D, hi);
  } else {
    hi = 0;
  }
  if (lambda) *lambda = hi;
  // Marginal repair: the largest distortion drop per bit first.
  const UpgradePriority gain = [&](size_t u, size_t from) {
    const double dd = D[u][from] - D[u][from + 1];
    const double dc = static_cast<double>(prob.cost[u][from + 1] - prob.cost[u][from]);
    return dc > 0 ? dd / dc : (dd > 0 ? std::numeric_limits<double>::infinity() : dd);
  };
  const std::vector<size_t> ties = spread_ranks(n);
  repair_budget(prob, choice, gain, ties);
  // Pairwise exchanges: one unit one width up, another one down, while Σ D drops
  // and the budget still holds.
  uint64_t total = prob.total(choice);
  for (int pass = 0; pass < 50; ++pass) {
    bool improved = false;
    for (size_t a = 0; a < n; ++a) {
      if (choice[a] + 1 >= D[a].size()) continue;
      const double up_dd = D[a][choice[a] + 1] - D[a][choice[a]];
      const uint64_t up_dc = prob.cost[a][choice[a] + 1] - prob.cost[a][choice[a]];
      size_t best = n;
      double best_dd = 0;
      for (size_t b = 0; b < n; ++b) {
        if (b == a || choice[b] == 0) continue;
        const uint64_t down_dc = prob.cost[b][choice[b]] - prob.cost[b][choice[b] - 1];
        if (total + up_dc - down_dc > prob.budget) continue;
        const double dd = up_dd + D[b][choice[b] - 1] - D[b][choice[b]];
        if (dd < best_dd - 1e-15 * (std::fabs(D[a][choice[a]]) + std::fabs(D[b][choice[b]]))) {
          best_dd = dd;
          best = b;
        }
      }
      if (best == n) continue;
      total = total + up_dc - (prob.cost[best][choice[best]] - prob.cost[best][choice[best] - 1]);
      ++choice[a];
      --choice[best];
      improved = true;
    }
    if (!improved) break;
  }
  repair_budget(prob, choice, gain, ties);
  return choice;
}

OptimalStrategy::OptimalStrategy(const Params& p) : ProtectedStrategy(p) {
  objective_ = &require_additive_error(p.str("objective"), "objective");
  std::optional<BudgetSetup> b = read_budget_setup(p, "optimal");
  if (!b) throw ConfigError("optimal needs budget_bpe and a family with {b} (e.g. family = \"int{b}-asym-g32\")");
  budget_ = std::move(*b);
}

void OptimalStrategy::allocate(const StrategyInput& in, Plan& plan) const {
  RecordingStats& stats = require_stats(in, "optimal");
  if (stats.calibration().empty()) throw Error("optimal: no calibration positions to measure distortion on");
  budget_.fill_fixed(plan);
  BudgetedAllocation alloc(plan, make_alloc_units(plan, std::nullopt), budget_.of(Kind::Key), budget_.of(Kind::Value),
                           budget_.budget);
  const std::vector<AllocUnit>& units = alloc.units();
  const size_t n = units.size();

  // Distortion tables, shared by every point with the same unit layout. Threads
  // building plans at once start at different units, so they fill different entries.
  std::vector<std::vector<double>> D(n);
  const size_t start = n ? (static_cast<size_t>(omp_get_thread_num()) * 7919u) % n : 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t u = (start + k) % n;
    const std::string sig = unit_signature(plan, units[u]);
    for (const FormatPtr& f : alloc.family(u).formats) {
      const std::string key =
          "distortion:" + objective_->metric->name + ":" + std::to_string(in.seed) + ":" + sig + ":" + f->name();
      D[u].push_back(stats.memo<double>(key, [&] { return measure_unit(in, plan, units[u], f, *objective_); }));
    }
  }

  std::vector<size_t> choice(n, 0);
  double lambda = 0;
  for (size_t g = 0; g < alloc.groups(); ++g) {
    std::vector<std::vector<double>> Dg;
    for (size_t u : alloc.group_units(g)) Dg.push_back(D[u]);
    const std::vector<size_t> c = solve_lagrangian(alloc.problem(g), Dg, &lambda);
    for (size_t i = 0; i < c.size(); ++i) choice[alloc.group_units(g)[i]] = c[i];
  }
  alloc.apply(plan, choice);

  double predicted = 0;
  for (size_t u = 0; u < n; ++u) predicted += D[u][choice[u]];
  SimOptions opt;
  opt.positions = stats.calibration();
  opt.seed = in.seed;
  const double joint = objective_->sum(simulate(in.rec, plan, opt).rows);
  // Additivity compares like with like: units no allocation unit touches (fixed
  // formats, sink heads) are in `joint` but in no per-unit distortion, so they are
  // made exact for the check.
  const std::optional<Plan> part = allocated_part(plan, units);
  const double joint_allocated = part ? objective_->sum(simulate(in.rec, *part, opt).rows) : joint;
  plan.annotate("objective", objective_->metric->name);
  plan.annotate("objective_predicted", predicted);
  plan.annotate("objective_joint", joint);
  plan.annotate("additivity", predicted > 0 ? joint_allocated / predicted : std::nan(""));
  plan.annotate("lambda", lambda);
  plan.annotate("bits_mean", mean_width(alloc, choice, [](const AllocUnit&) { return true; }));
}

std::unique_ptr<Strategy> make_optimal(const Params& p) { return std::make_unique<OptimalStrategy>(p); }

}  // namespace kvb
