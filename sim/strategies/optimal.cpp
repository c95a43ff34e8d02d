#include "sim/strategies/optimal.h"

#include <omp.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/measurer.h"
#include "sim/reconstruction.h"

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
          {"candidate_sink_heads", ParamType::Bool,
           "a choice of every unit: kept whole at sink_head_format (a sink head chosen by its measured distortion "
           "and cost)",
           false, true},
          {"candidate_sink_tokens", ParamType::IntList,
           "choices of every unit: its first N tokens at sink_token_format, for each N given (0, none, is always a "
           "choice)",
           IntList{}, true},
          {"candidate_windows", ParamType::IntList,
           "choices of every unit: a recency window of W tokens at window_format (window_mode, window_extra_copy), "
           "for each W given (0, none, is always a choice)",
           IntList{}, true},
          {"phase_split", ParamType::Bool,
           "choices of every unit: a width per phase (a pair of widths, measured together), the boundary from "
           "phase_marker, phase_index or phase_fraction",
           false},
          {"phase_marker", ParamType::Int, "with phase_split: token id starting the second phase; -1 = unused",
           int64_t{-1}},
          {"phase_index", ParamType::Int, "with phase_split: first token of the second phase; -1 = unused",
           int64_t{-1}},
          {"phase_fraction", ParamType::Real,
           "with phase_split: the boundary as a fraction of the tokens, when no marker or index is given", 0.75},
          {"calibration_data", ParamType::String,
           "measure the distortion tables on other data than the evaluated: a recording path ([data] source "
           "\"file\"), a text or token-file path (source \"model\"), or \"seed N\" (synthetic), loaded with "
           "[data]'s other settings",
           std::nullopt, false, true},
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

// The measurer of `rec` the distortion tables and the additivity check are measured
// with: the run's (StrategyInput::measurer_for, the planning backend's), else the CPU
// simulator. `cpu` holds the CPU one when there is no run's.
Measurer& table_measurer(const StrategyInput& in, const Recording& rec, std::optional<CpuMeasurer>& cpu) {
  if (in.measurer_for) return (*in.measurer_for)(rec);
  return cpu.emplace(rec);
}

// The objective over the rows of KV head (layer, kv_head) with `plan` (the units under
// measurement quantized, everything else exact), on the measurer's recording; +∞ when
// a format turns finite keys or values into Inf or NaN (never worth choosing).
double kv_head_distortion(Measurer& measurer, const Plan& plan, int64_t layer, int64_t kv_head,
                          const SimOptions& opt, const AdditiveError& objective) {
  try {
    return objective.sum(measurer.measure_kv_head(plan, layer, kv_head, opt).rows);
  } catch (const NonFiniteReconstruction&) {
    return std::numeric_limits<double>::infinity();
  }
}

// D_u(f): only unit u quantized (open cells at f, its protections kept), everything
// else exact; the objective over its query heads at the calibration positions.
double measure_unit(Measurer& measurer, const StrategyInput& in, const Plan& plan, const AllocUnit& u,
                    const FormatPtr& f, const AdditiveError& objective) {
  Plan m = exact_plan_like(plan);
  UnitPlan& target = m.unit(u.layer, u.kv_head, u.kind);
  target = plan.unit(u.layer, u.kv_head, u.kind);
  for (size_t s : u.segments) target.segments[s].format = f;
  SimOptions opt;
  opt.positions = in.stats->calibration();
  opt.seed = in.seed;
  return kv_head_distortion(measurer, m, u.layer, u.kv_head, opt, objective);
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

// One budget group's allocation over its units' efficient candidates (efficient_choices).
struct GroupOutcome {
  uint64_t spent = 0;  // bits of the chosen candidates
  // The smallest upgrade to a unit's next efficient candidate, in bits (none left: max).
  uint64_t step = std::numeric_limits<uint64_t>::max();
  // Bits are left that a dearer candidate would fit in, but no unit has an efficient
  // upgrade left: nothing dearer lowers the objective, so the budget stays unspent.
  bool unspent_without_gain = false;
};

// `efficient`: the group's problem over efficient candidates (efficient.cost[u] those of
// unit u, by cost), `c` the choice in it; all_cost[u]: unit u's bits at every
// candidate, pruned or not.
GroupOutcome group_outcome(const BudgetProblem& efficient, const std::vector<size_t>& c,
                           const std::vector<std::vector<uint64_t>>& all_cost) {
  GroupOutcome out;
  out.spent = efficient.total(c);
  for (size_t u = 0; u < c.size(); ++u)
    if (c[u] + 1 < efficient.cost[u].size())
      out.step = std::min(out.step, efficient.cost[u][c[u] + 1] - efficient.cost[u][c[u]]);
  if (out.step != std::numeric_limits<uint64_t>::max() || out.spent > efficient.budget) return out;
  const uint64_t slack = efficient.budget - out.spent;
  for (size_t u = 0; u < all_cost.size(); ++u) {
    const uint64_t chosen = efficient.cost[u][c[u]];
    for (uint64_t bits : all_cost[u])
      if (bits > chosen && bits - chosen <= slack) out.unspent_without_gain = true;
  }
  return out;
}

// What an objective measures that value widths do not change ("the attention
// weights"), or nullptr when it sees the values.
const char* value_blind(const std::string& objective) {
  if (objective == "attn_kl_mean") return "the attention weights";
  if (objective == "logit_rmse") return "the attention logits";
  return nullptr;
}

// The warning of a group whose budget stays unspent (GroupOutcome::unspent_without_gain):
// `budget_name` ("budget_bpe", "value_budget_bpe"), the budget, the bpe reached and why.
std::string unspent_budget_warning(const std::string& budget_name, double budget_bpe, double reached_bpe,
                                   const std::string& objective, bool values_in_group) {
  auto bpe = [](double x) { return format_double(std::round(x * 1e6) / 1e6); };
  std::string why = "every unit holds the dearest of its candidates that measure a lower " + objective +
                    " than every cheaper one";
  if (const char* seen = value_blind(objective); seen && values_in_group)
    why += "; value widths do not change " + std::string(seen) + ", so values keep their narrowest width";
  return budget_name + " " + bpe(budget_bpe) + " is not spent: the allocation reaches " + bpe(reached_bpe) +
         " bpe (" + bpe(budget_bpe - reached_bpe) + " bpe unspent), since no candidate that fits lowers " + objective +
         " further (" + why + "); the point stands at the bpe it reached, not at its budget";
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

std::vector<size_t> efficient_choices(const std::vector<uint64_t>& cost, const std::vector<double>& D) {
  std::vector<size_t> order(cost.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (cost[a] != cost[b]) return cost[a] < cost[b];
    return D[a] < D[b];
  });
  std::vector<size_t> kept;
  for (size_t i : order)
    if (kept.empty() || D[i] < D[kept.back()]) kept.push_back(i);
  return kept;
}

OptimalStrategy::OptimalStrategy(const Params& p) : ProtectedStrategy(p) {
  objective_ = &require_additive_error(p.str("objective"), "objective");
  std::optional<BudgetSetup> b = read_budget_setup(p, "optimal");
  if (!b) throw ConfigError("optimal needs budget_bpe and a family with {b} (e.g. family = \"int{b}-asym-g32\")");
  budget_ = std::move(*b);
  for (Kind kind : {Kind::Key, Kind::Value}) {
    KindCandidates& c = candidates_[static_cast<int>(kind)];
    c.sink_head = p.boolean("candidate_sink_heads", kind);
    for (const auto& [name, list, fixed] :
         {std::tuple{"candidate_sink_tokens", &c.sink_tokens, "sink_tokens"},
          std::tuple{"candidate_windows", &c.windows, "window"}}) {
      const std::string key = p.kind_name(name, kind);
      std::set<int64_t> seen;
      for (int64_t n : p.int_list(key)) {
        if (n <= 0) throw ConfigError(key + ": every entry must be > 0 tokens (none is always a choice), got " +
                                      std::to_string(n));
        if (!seen.insert(n).second) throw ConfigError(key + ": " + std::to_string(n) + " is given twice");
        list->push_back(n);
      }
      if (!list->empty() && p.integer(fixed, kind) > 0)
        throw ConfigError(key + " with " + p.kind_name(fixed, kind) + " = " + std::to_string(p.integer(fixed, kind)) +
                          ": give the " + fixed + " as a fixed protection or as candidates, not both");
    }
    if (!c.sink_tokens.empty() && p.str("sink_token_select") != "first")
      throw ConfigError(p.kind_name("candidate_sink_tokens", kind) +
                        ": candidate sink tokens are the first N tokens; sink_token_select = \"" +
                        p.str("sink_token_select") + "\" selects fixed sink tokens only");
    if (!budget_.of(kind) && (c.sink_head || !c.sink_tokens.empty() || !c.windows.empty()))
      throw ConfigError("optimal: candidate protections of " + std::string(kind == Kind::Key ? "keys" : "values") +
                        ", whose format is fixed (no budget of their own): only a budgeted kind has choices");
  }
  phase_split_ = p.boolean("phase_split");
  boundary_.marker = p.integer("phase_marker");
  boundary_.index = p.integer("phase_index");
  boundary_.fraction = p.real("phase_fraction");
  if (!(boundary_.fraction > 0 && boundary_.fraction < 1))
    throw ConfigError("phase_fraction: must be in (0, 1), got " + format_double(boundary_.fraction));
  if (!phase_split_ && (boundary_.marker != -1 || boundary_.index != -1 || boundary_.fraction != 0.75))
    throw ConfigError("optimal: phase_marker, phase_index and phase_fraction are not used without phase_split = true");
  if (p.has("calibration_data")) {
    calibration_data_ = p.str("calibration_data");
    // Fixed protections chosen by statistics would be chosen on the evaluated data.
    for (Kind kind : {Kind::Key, Kind::Value})
      for (const char* name : {"sink_heads", "sink_head_threshold"})
        if (p.has(name, kind) && (std::string(name) == "sink_head_threshold" || p.integer(name, kind) > 0))
          throw ConfigError("calibration_data with " + p.kind_name(name, kind) +
                            ": fixed sink heads are selected by entropy on the evaluated data; use "
                            "candidate_sink_heads = true, which chooses them on the calibration data");
    if (p.str("sink_token_select") != "first")
      throw ConfigError("calibration_data with sink_token_select = \"" + p.str("sink_token_select") +
                        "\": those sink tokens are selected on the evaluated data; use the first tokens or "
                        "candidate_sink_tokens");
  }
}

bool OptimalStrategy::extended() const {
  for (const KindCandidates& c : candidates_)
    if (c.sink_head || !c.sink_tokens.empty() || !c.windows.empty()) return true;
  return phase_split_ || calibration_data_.has_value();
}

void OptimalStrategy::allocate(const StrategyInput& in, Plan& plan) const {
  if (extended()) {
    allocate_choices(in, plan);
    return;
  }
  RecordingStats& stats = require_stats(in, "optimal");
  if (stats.calibration().empty()) {
    stats.require_calibration("optimal: distortion measurements");  // names a sliding window that leaves none
    throw Error("optimal: no calibration positions to measure distortion on");
  }
  budget_.fill_fixed(plan);
  BudgetedAllocation alloc(plan, make_alloc_units(plan, std::nullopt), budget_.of(Kind::Key), budget_.of(Kind::Value),
                           budget_.budget);
  const std::vector<AllocUnit>& units = alloc.units();
  const size_t n = units.size();

  // Distortion tables, shared by every point with the same unit layout. Threads
  // building plans at once start at different units, so they fill different entries.
  // Keyed by the backend too: a process may run the same data on both.
  std::vector<std::vector<double>> D(n);
  std::optional<CpuMeasurer> cpu;
  Measurer& measurer = table_measurer(in, in.rec, cpu);
  const size_t start = n ? (static_cast<size_t>(omp_get_thread_num()) * 7919u) % n : 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t u = (start + k) % n;
    const std::string sig = unit_signature(plan, units[u]);
    for (const FormatPtr& f : alloc.family(u).formats) {
      const std::string key = "distortion:" + std::string(measurer.name()) + ":" + objective_->metric->name + ":" +
                              std::to_string(in.seed) + ":" + sig + ":" + f->name();
      D[u].push_back(stats.memo<double>(key, [&] { return measure_unit(measurer, in, plan, units[u], f, *objective_); }));
    }
  }

  // Each unit's widths pruned to its efficient ones, as with the protections as choices:
  // a wider width that measures no lower distortion is never bought.
  std::vector<size_t> choice(n, 0);
  double lambda = 0;
  std::vector<GroupOutcome> outcomes;
  for (size_t g = 0; g < alloc.groups(); ++g) {
    const std::vector<size_t>& members = alloc.group_units(g);
    const BudgetProblem& every = alloc.problem(g);  // every width of each member
    BudgetProblem prob;
    prob.budget = every.budget;
    std::vector<std::vector<double>> Dg;
    std::vector<std::vector<size_t>> efficient;  // [member] -> widths kept
    for (size_t i = 0; i < members.size(); ++i) {
      efficient.push_back(efficient_choices(every.cost[i], D[members[i]]));
      std::vector<uint64_t> cost;
      std::vector<double> d;
      for (size_t w : efficient.back()) {
        cost.push_back(every.cost[i][w]);
        d.push_back(D[members[i]][w]);
      }
      prob.cost.push_back(std::move(cost));
      Dg.push_back(std::move(d));
    }
    const std::vector<size_t> c = solve_lagrangian(prob, Dg, &lambda);
    for (size_t i = 0; i < c.size(); ++i) choice[members[i]] = efficient[i][c[i]];
    outcomes.push_back(group_outcome(prob, c, every.cost));
  }
  alloc.apply(plan, choice);
  for (size_t g = 0; g < alloc.groups(); ++g) {
    const GroupOutcome& o = outcomes[g];
    // The smallest upgrade that would lower the objective (apply() counts every width).
    plan.annotate(alloc.column_prefix(g) + "budget_step_bpe",
                  o.step == std::numeric_limits<uint64_t>::max() ? std::nan("") : alloc.group_bpe(g, o.step));
    if (!o.unspent_without_gain) continue;
    const std::vector<size_t>& members = alloc.group_units(g);
    const bool values =
        std::any_of(members.begin(), members.end(), [&](size_t u) { return units[u].kind == Kind::Value; });
    if (in.warnings)
      in.warnings->push_back(unspent_budget_warning(alloc.column_prefix(g) + "budget_bpe", alloc.budget_bpe(g),
                                                    alloc.reached_bpe(g, o.spent), objective_->metric->name, values));
  }

  double predicted = 0;
  for (size_t u = 0; u < n; ++u) predicted += D[u][choice[u]];
  SimOptions opt;
  opt.positions = stats.calibration();
  opt.seed = in.seed;
  const double joint = objective_->sum(measurer.measure(plan, opt).rows);
  // Additivity compares like with like: units no allocation unit touches (fixed
  // formats, sink heads) are in `joint` but in no per-unit distortion, so they are
  // made exact for the check.
  const std::optional<Plan> part = allocated_part(plan, units);
  const double joint_allocated = part ? objective_->sum(measurer.measure(*part, opt).rows) : joint;
  plan.annotate("objective", objective_->metric->name);
  plan.annotate("objective_predicted", predicted);
  plan.annotate("objective_joint", joint);
  plan.annotate("additivity", predicted > 0 ? joint_allocated / predicted : std::nan(""));
  plan.annotate("lambda", lambda);
  plan.annotate("bits_mean", mean_width(alloc, choice, [](const AllocUnit&) { return true; }));
}

std::vector<UnitChoice> OptimalStrategy::unit_choices(Kind kind) const {
  const KindCandidates& c = candidates_[static_cast<int>(kind)];
  const size_t widths = budget_.of(kind)->formats.size();
  std::vector<UnitChoice> out;
  if (c.sink_head) out.push_back(UnitChoice{true});
  std::vector<int64_t> tokens = {0}, windows = {0};
  tokens.insert(tokens.end(), c.sink_tokens.begin(), c.sink_tokens.end());
  windows.insert(windows.end(), c.windows.begin(), c.windows.end());
  for (int64_t n : tokens)
    for (int64_t w : windows) {
      // One width everywhere (the width-only choice, unsplit), then, with a phase
      // split, every pair of different widths.
      for (size_t i = 0; i < widths; ++i) out.push_back(UnitChoice{false, n, w, {i, i}, false});
      if (phase_split_)
        for (size_t i = 0; i < widths; ++i)
          for (size_t j = 0; j < widths; ++j)
            if (i != j) out.push_back(UnitChoice{false, n, w, {i, j}, true});
    }
  return out;
}

UnitPlan OptimalStrategy::realize(const Plan& base, int64_t layer, int64_t kv_head, Kind kind, const UnitChoice& c,
                                  std::optional<int64_t> boundary) const {
  const KindProtections& k = protections().kind(kind);
  const WidthFamily& fam = *budget_.of(kind);
  const int64_t T = base.tokens();
  UnitPlan u;
  if (c.sink_head) {
    u.segments = {Segment{0, T, k.sink_head_format, SegmentRole::SinkHead}};
    return u;
  }
  if (c.sink_tokens >= T)
    throw Error(std::string(kind == Kind::Key ? "key" : "value") + " candidate sink tokens " +
                std::to_string(c.sink_tokens) + " are not fewer than the recording's " + std::to_string(T) + " tokens");
  const UnitPlan& b = base.unit(layer, kv_head, kind);
  u.window = b.window;
  const int64_t split_at = c.split && boundary ? *boundary : T;  // first token at width[1]
  for (const Segment& s : b.segments) {
    if (!is_open(s)) {
      u.segments.push_back(s);
      continue;
    }
    // The open cells [s.begin, s.end): sink tokens first, then each phase's width.
    const int64_t sink_end = std::clamp(c.sink_tokens, s.begin, s.end);
    if (sink_end > s.begin) u.segments.push_back(Segment{s.begin, sink_end, k.sink_token_format, SegmentRole::SinkToken});
    const int64_t cut = std::clamp(split_at, sink_end, s.end);
    if (cut > sink_end) u.segments.push_back(Segment{sink_end, cut, fam.formats[c.width[0]], s.role});
    if (s.end > cut) u.segments.push_back(Segment{cut, s.end, fam.formats[c.width[1]], s.role});
  }
  if (c.window > 0) u.window = k.window_of(c.window);
  return u;
}

namespace {

// Bits of one unit at `context`, as Plan::storage_bits_at counts them.
uint64_t unit_bits(const Plan& plan, const UnitPlan& u, int64_t context) {
  uint64_t bits = plan.window_bits(u, context);
  for (const Segment& s : u.segments) bits += plan.segment_bits(u, s.begin, s.end, *s.format, context);
  return bits;
}

// Identifies a realized unit (position, prefill, segments, window) for the distortion cache.
std::string unit_plan_signature(const Plan& plan, int64_t layer, int64_t kv_head, Kind kind, const UnitPlan& up) {
  std::ostringstream os;
  os << layer << "/" << kv_head << "/" << kind_name(kind) << "/p" << plan.prefill() << "/T" << plan.tokens();
  for (const Segment& s : up.segments)
    os << "|" << s.begin << "-" << s.end << ":" << s.format->name() << ":" << static_cast<int>(s.role);
  if (up.window.active())
    os << "|w" << up.window.size << ":" << up.window.format->name() << ":" << static_cast<int>(up.window.mode) << ":"
       << up.window.extra_copy;
  return os.str();
}

}  // namespace

void OptimalStrategy::allocate_choices(const StrategyInput& in, Plan& plan) const {
  // The data the distortion tables are measured on: the evaluated recording's
  // calibration positions, or other data's (calibration_data).
  const Recording* cal_rec = &in.rec;
  RecordingStats* cal_stats = &require_stats(in, "optimal");
  std::string cal_name;
  if (calibration_data_) {
    if (!in.calibration)
      throw ConfigError("calibration_data: needs an experiment config whose [data] says how to load \"" +
                        *calibration_data_ + "\" (kvbudget run)");
    const CalibrationData cd = (*in.calibration)(*calibration_data_);
    cal_rec = cd.rec;
    cal_stats = cd.stats;
    cal_name = cd.name;
  }
  if (cal_stats->calibration().empty() && !calibration_data_)
    cal_stats->require_calibration("optimal: distortion measurements");  // names a sliding window that leaves none
  if (cal_stats->calibration().empty())
    throw Error("optimal: no calibration positions to measure distortion on" +
                (calibration_data_ ? " in calibration_data " + cal_name : std::string()));
  budget_.fill_fixed(plan);
  Plan cal_base = plan;
  if (calibration_data_) {
    cal_base = protections().apply(StrategyInput{*cal_rec, in.seed, cal_stats, nullptr, in.measurer_for});
    budget_.fill_fixed(cal_base);
  }
  std::optional<int64_t> boundary, cal_boundary;
  if (phase_split_) {
    boundary = boundary_.resolve(in.rec);
    cal_boundary = calibration_data_ ? boundary_.resolve(*cal_rec) : boundary;
  }

  // Units: every (layer, KV head, kind) of a budgeted kind with open cells.
  struct Unit {
    int64_t layer, kv_head;
    Kind kind;
    std::vector<UnitChoice> choices;
    std::vector<double> D;         // on the calibration data
    std::vector<uint64_t> cost;    // bits on the evaluated plan at the budget's context
    std::vector<size_t> efficient; // efficient_choices(cost, D)
  };
  std::vector<Unit> units;
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        if (!budget_.of(kind)) continue;
        const auto open = [&](const Plan& p) {
          const std::vector<Segment>& segs = p.unit(l, g, kind).segments;
          return std::any_of(segs.begin(), segs.end(), [](const Segment& s) { return is_open(s); });
        };
        if (!open(plan)) continue;
        if (!open(cal_base)) throw Error("internal: optimal: the calibration plan has no open cells where the evaluated has");
        units.push_back(Unit{l, g, kind, unit_choices(kind), {}, {}, {}});
      }

  const int64_t context = budget_.budget.context > 0 ? budget_.budget.context : plan.tokens();
  if (context < plan.tokens())  // tokens past the context would be priced at nothing
    throw Error("budget_context: " + std::to_string(context) + " tokens is shorter than the recording's " +
                std::to_string(plan.tokens()) + " (the tokens past it would cost nothing); give at least " +
                std::to_string(plan.tokens()) + " or 0 for the recording's context");
  SimOptions cal_opt;
  cal_opt.positions = cal_stats->calibration();
  cal_opt.seed = in.seed;
  std::optional<CpuMeasurer> cpu;
  Measurer& measurer = table_measurer(in, *cal_rec, cpu);
  const std::string key_prefix = "choice-distortion:" + std::string(measurer.name()) + ":" +
                                 objective_->metric->name + ":" + std::to_string(in.seed) + ":";
  std::string first_error;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t ui = 0; ui < units.size(); ++ui) {
    Unit& u = units[ui];
    try {
      for (const UnitChoice& c : u.choices) {
        const UnitPlan on_eval = realize(plan, u.layer, u.kv_head, u.kind, c, boundary);
        u.cost.push_back(unit_bits(plan, on_eval, context));
        const UnitPlan on_cal = realize(cal_base, u.layer, u.kv_head, u.kind, c, cal_boundary);
        const std::string key = key_prefix + unit_plan_signature(cal_base, u.layer, u.kv_head, u.kind, on_cal);
        u.D.push_back(cal_stats->memo<double>(key, [&] {
          Plan m = exact_plan_like(cal_base);
          m.unit(u.layer, u.kv_head, u.kind) = on_cal;
          return kv_head_distortion(measurer, m, u.layer, u.kv_head, cal_opt, *objective_);
        }));
      }
      u.efficient = efficient_choices(u.cost, u.D);
    } catch (const std::exception& e) {
#pragma omp critical(optimal_choice_error)
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) throw Error(first_error);

  // Budget groups: one joint budget, or keys and values each their own.
  const bool separate = budget_.budget.separate;
  const std::vector<std::vector<Kind>> kinds =
      separate ? std::vector<std::vector<Kind>>{{Kind::Key}, {Kind::Value}}
               : std::vector<std::vector<Kind>>{{Kind::Key, Kind::Value}};
  const double per_kind_elements =
      static_cast<double>(plan.layers() * plan.kv_heads() * plan.head_dim()) * static_cast<double>(context);
  std::vector<size_t> choice(units.size(), 0);  // positions in each unit's `efficient`
  double lambda = 0;
  std::set<std::tuple<int64_t, int64_t, Kind>> allocated;
  for (const Unit& u : units) allocated.emplace(u.layer, u.kv_head, u.kind);
  struct GroupReport {
    std::string prefix;
    double budget_bpe = 0, elements = 0;
    uint64_t fixed_bits = 0, spent = 0, step = std::numeric_limits<uint64_t>::max();
  };
  std::vector<GroupReport> reports;
  for (size_t gi = 0; gi < kinds.size(); ++gi) {
    if (separate && !budget_.budget.budgeted[gi]) continue;
    const auto in_group = [&](Kind k) { return std::find(kinds[gi].begin(), kinds[gi].end(), k) != kinds[gi].end(); };
    GroupReport rep;
    rep.prefix = separate ? (gi == 0 ? "key_" : "value_") : "";
    rep.budget_bpe = budget_.budget.bpe[gi];
    rep.elements = per_kind_elements * static_cast<double>(kinds[gi].size());
    for (int64_t l = 0; l < plan.layers(); ++l)
      for (int64_t g = 0; g < plan.kv_heads(); ++g)
        for (Kind kind : kinds[gi])
          if (!allocated.count({l, g, kind})) rep.fixed_bits += unit_bits(plan, plan.unit(l, g, kind), context);
    BudgetProblem prob;
    std::vector<std::vector<double>> D;
    std::vector<size_t> members;
    uint64_t cheapest = rep.fixed_bits, dearest = rep.fixed_bits;
    for (size_t ui = 0; ui < units.size(); ++ui) {
      const Unit& u = units[ui];
      if (!in_group(u.kind)) continue;
      members.push_back(ui);
      std::vector<uint64_t> cost;
      std::vector<double> d;
      for (size_t i : u.efficient) {
        cost.push_back(u.cost[i]);
        d.push_back(u.D[i]);
      }
      cheapest += cost.front();
      dearest += *std::max_element(u.cost.begin(), u.cost.end());
      prob.cost.push_back(std::move(cost));
      D.push_back(std::move(d));
    }
    const std::string name = rep.prefix + "budget_bpe ";
    const double budget_bits_real = rep.budget_bpe * rep.elements;
    const uint64_t budget_bits = static_cast<uint64_t>(std::floor(budget_bits_real));
    auto bpe = [&](uint64_t bits) {
      return format_double(std::round(static_cast<double>(bits) / rep.elements * 1e6) / 1e6);
    };
    const std::string ctx = budget_.budget.context > 0 ? " at context " + std::to_string(context) : "";
    if (cheapest > budget_bits)
      throw Error(name + format_double(rep.budget_bpe) + " is below the cheapest allocation" + ctx + ", " +
                  bpe(cheapest) + " bpe (fixed protections and cells " + bpe(rep.fixed_bits) +
                  " bpe, then the cheapest choice everywhere else)");
    if (dearest < budget_bits)
      throw Error(name + format_double(rep.budget_bpe) + " exceeds the dearest allocation" + ctx + ", " +
                  bpe(dearest) + " bpe (the dearest choice everywhere): it cannot be spent; add wider widths or "
                  "lower the budget");
    prob.budget = budget_bits - rep.fixed_bits;
    const std::vector<size_t> c = solve_lagrangian(prob, D, &lambda);
    std::vector<std::vector<uint64_t>> every_cost;  // [member] -> bits of each of its candidates
    for (size_t i = 0; i < c.size(); ++i) {
      choice[members[i]] = c[i];
      every_cost.push_back(units[members[i]].cost);
    }
    const GroupOutcome outcome = group_outcome(prob, c, every_cost);
    rep.spent = outcome.spent;
    rep.step = outcome.step;
    if (rep.spent > prob.budget) throw Error("internal: allocation over budget");
    if (outcome.unspent_without_gain && in.warnings)
      in.warnings->push_back(unspent_budget_warning(
          rep.prefix + "budget_bpe", rep.budget_bpe, static_cast<double>(rep.fixed_bits + rep.spent) / rep.elements,
          objective_->metric->name,
          std::any_of(members.begin(), members.end(), [&](size_t ui) { return units[ui].kind == Kind::Value; })));
    reports.push_back(rep);
  }

  // The plan, on the evaluated data and on the calibration data.
  Plan cal_plan = cal_base;
  double predicted = 0, widths_sum = 0;
  size_t widths_count = 0;
  std::map<std::string, size_t> chosen;  // protection -> units that chose it
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const Unit& u = units[ui];
    const size_t i = u.efficient[choice[ui]];
    const UnitChoice& c = u.choices[i];
    plan.unit(u.layer, u.kv_head, u.kind) = realize(plan, u.layer, u.kv_head, u.kind, c, boundary);
    cal_plan.unit(u.layer, u.kv_head, u.kind) = realize(cal_base, u.layer, u.kv_head, u.kind, c, cal_boundary);
    predicted += u.D[i];
    const std::string kn = kind_name(u.kind);
    if (c.sink_head) {
      ++chosen[kn + ":sink_head"];
      continue;
    }
    const WidthFamily& fam = *budget_.of(u.kind);
    widths_sum += c.split ? 0.5 * static_cast<double>(fam.widths[c.width[0]] + fam.widths[c.width[1]])
                          : static_cast<double>(fam.widths[c.width[0]]);
    ++widths_count;
    if (c.sink_tokens > 0) ++chosen[kn + ":sink_tokens=" + std::to_string(c.sink_tokens)];
    if (c.window > 0) ++chosen[kn + ":window=" + std::to_string(c.window)];
    if (c.split) ++chosen[kn + ":phase_split"];
  }
  if (phase_split_) {
    plan.set_phase_boundary(*boundary);
    if (boundary_.marker >= 0) plan.set_phase_marker(boundary_.marker);
    cal_plan.set_phase_boundary(*cal_boundary);
  }
  const ErrorStats joint_stats = measurer.measure(cal_plan, cal_opt);
  const double joint = objective_->sum(joint_stats.rows);
  // Additivity compares like with like: cells outside every unit (fixed kinds, fixed
  // sink heads) made exact.
  const std::optional<Plan> part = allocated_part(cal_plan, [&] {
    std::vector<AllocUnit> covered;
    for (const Unit& u : units) covered.push_back(AllocUnit{u.layer, u.kv_head, u.kind, 0, {}});
    return covered;
  }());
  const double joint_allocated = part ? objective_->sum(measurer.measure(*part, cal_opt).rows) : joint;

  for (const GroupReport& rep : reports) {
    plan.annotate(rep.prefix + "budget_bpe", rep.budget_bpe);
    plan.annotate(rep.prefix + "budget_slack_bpe",
                  (rep.budget_bpe * rep.elements - static_cast<double>(rep.fixed_bits + rep.spent)) / rep.elements);
    plan.annotate(rep.prefix + "budget_step_bpe", rep.step == std::numeric_limits<uint64_t>::max()
                                                      ? std::nan("")
                                                      : static_cast<double>(rep.step) / rep.elements);
  }
  if (budget_.budget.context > 0) {
    plan.annotate("budget_context", static_cast<double>(budget_.budget.context));
    plan.set_sized_for_context(budget_.budget.context);
  }
  plan.annotate("objective", objective_->metric->name);
  plan.annotate("objective_predicted", predicted);
  plan.annotate("objective_joint", joint);
  plan.annotate("additivity", predicted > 0 ? joint_allocated / predicted : std::nan(""));
  plan.annotate("lambda", lambda);
  plan.annotate("bits_mean", widths_count ? widths_sum / static_cast<double>(widths_count) : std::nan(""));
  std::string summary;
  for (const auto& [what, count] : chosen)
    summary += (summary.empty() ? "" : " ") + what + "x" + std::to_string(count);
  plan.annotate("protections_chosen", summary.empty() ? std::string("none") : summary);
  if (calibration_data_) {
    plan.annotate("calibration_data", cal_name);
    plan.annotate("objective_calibration", objective_->metric->compute(joint_stats));
  }
}

std::unique_ptr<Strategy> make_optimal(const Params& p) { return std::make_unique<OptimalStrategy>(p); }

}  // namespace kvb
