#include "sim/strategies/phase.h"

#include <algorithm>
#include <cmath>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/metrics/redundancy.h"

namespace kvb {

const std::vector<ParamDef>& phase_boundary_params() {
  static const std::vector<ParamDef> params = {
      {"phase_marker", ParamType::Int, "token id starting the second phase (e.g. </think>); -1 = unused", int64_t{-1}},
      {"phase_index", ParamType::Int, "first token of the second phase; -1 = unused", int64_t{-1}},
      {"phase_fraction", ParamType::Real, "boundary as a fraction of the tokens, when no marker or index is given",
       0.75},
      {"rho_layers", ParamType::IntList, "layers (indices into the recording) rho is averaged over; [] = all",
       IntList{}},
  };
  return params;
}

const std::vector<ParamDef>& phase_params() {
  static const std::vector<ParamDef> params = [] {
    std::vector<ParamDef> own = {
        {"first_format", ParamType::String, "format of the first phase (fixed)", std::nullopt, true, true},
        {"second_format", ParamType::String, "format of the second phase (fixed)", std::nullopt, true, true},
        {"first_bits", ParamType::Int, "width {b} of the family for the first phase (no budget)", std::nullopt, true,
         true},
        {"second_bits", ParamType::Int, "width {b} of the family for the second phase (no budget)", std::nullopt, true,
         true},
        {"split", ParamType::Real, "with budget_bpe: b_first − b_second in bits, at the same total", 0.0},
    };
    own.insert(own.end(), phase_boundary_params().begin(), phase_boundary_params().end());
    return with_shared_params(own, true);
  }();
  return params;
}

const std::vector<ParamDef>& taqg_params() {
  static const std::vector<ParamDef> params = [] {
    std::vector<ParamDef> own = {
        {"rule", ParamType::String,
         "\"as-written\" (floor(log2((1-rho_L)/(1-rho_H) + 1)) bits less for the redundant phase), \"water-filling\" "
         "(1/2 log2((1-rho_L)/(1-rho_H))) or \"reversed\" (the as-written amount given to the redundant phase)",
         std::string("as-written")},
        {"low_bits", ParamType::Int, "without a budget: b_L, the width of the less redundant phase", std::nullopt, true,
         true},
    };
    own.insert(own.end(), phase_boundary_params().begin(), phase_boundary_params().end());
    return with_shared_params(own, true);
  }();
  return params;
}

PhaseBoundary PhaseBoundary::from_params(const Params& p) {
  PhaseBoundary b;
  b.marker = p.integer("phase_marker");
  b.index = p.integer("phase_index");
  b.fraction = p.real("phase_fraction");
  if (!(b.fraction > 0 && b.fraction < 1))
    throw ConfigError("phase_fraction: must be in (0, 1), got " + format_double(b.fraction));
  for (int64_t l : p.int_list("rho_layers"))
    if (l < 0) throw ConfigError("rho_layers: layer indices must be >= 0");
  b.rho_layers = p.int_list("rho_layers");
  return b;
}

int64_t PhaseBoundary::resolve(const Recording& rec) const {
  const int64_t T = rec.tokens;
  int64_t b = 0;
  std::string how;
  if (marker >= 0) {
    if (rec.token_ids.empty())
      throw Error("phase_marker " + std::to_string(marker) + ": the recording has no token ids");
    const auto it = std::find(rec.token_ids.begin(), rec.token_ids.end(), marker);
    if (it == rec.token_ids.end())
      throw Error("phase_marker " + std::to_string(marker) + " does not occur in the recording's " + std::to_string(T) +
                  " token ids");
    b = it - rec.token_ids.begin();
    how = "phase_marker " + std::to_string(marker);
  } else if (index >= 0) {
    b = index;
    how = "phase_index " + std::to_string(index);
  } else {
    b = static_cast<int64_t>(std::llround(fraction * static_cast<double>(T)));
    how = "phase_fraction " + format_double(fraction);
  }
  if (b < 2 || b > T - 2)
    throw Error(how + " puts the phase boundary at token " + std::to_string(b) + " of " + std::to_string(T) +
                ": each phase needs at least two tokens");
  for (int64_t l : rho_layers)
    if (l >= rec.num_layers())
      throw Error("rho_layers: layer index " + std::to_string(l) + " outside the recording's " +
                  std::to_string(rec.num_layers()) + " layers");
  return b;
}

std::vector<KeyRhoRange> phase_rho_ranges(const Recording& rec, int64_t boundary, const std::vector<int64_t>& layers) {
  return {KeyRhoRange{0, boundary, layers}, KeyRhoRange{boundary, rec.tokens, layers}};
}

PhaseRho phase_rho(const StrategyInput& in, int64_t boundary, const std::vector<int64_t>& layers) {
  const std::vector<KeyRhoRange> ranges = phase_rho_ranges(in.rec, boundary, layers);
  auto rho = [&](const KeyRhoRange& r) {
    return in.stats ? in.stats->key_rho(r) : key_rho(in.rec, r.t0, r.t1, r.layers);
  };
  return PhaseRho{rho(ranges[0]), rho(ranges[1])};
}

TaqgRule parse_taqg_rule(const std::string& s) {
  if (s == "as-written") return TaqgRule::AsWritten;
  if (s == "water-filling") return TaqgRule::WaterFilling;
  if (s == "reversed") return TaqgRule::Reversed;
  throw ConfigError("rule: must be \"as-written\", \"water-filling\" or \"reversed\", got \"" + s + "\"");
}

TaqgPrediction taqg_predict(const PhaseRho& rho, TaqgRule rule) {
  TaqgPrediction p;
  p.redundant_phase = rho.second > rho.first ? 1 : 0;
  const double rho_h = std::max(rho.first, rho.second), rho_l = std::min(rho.first, rho.second);
  const double ratio = (1.0 - rho_l) / (1.0 - rho_h);
  switch (rule) {
    case TaqgRule::AsWritten: p.reduction = std::floor(std::log2(ratio + 1.0)); break;
    case TaqgRule::WaterFilling: p.reduction = 0.5 * std::log2(ratio); break;
    case TaqgRule::Reversed: p.reduction = -std::floor(std::log2(ratio + 1.0)); break;
  }
  return p;
}

PhaseStrategy::PhaseStrategy(const Params& p, bool taqg)
    : ProtectedStrategy(p),
      taqg_(taqg),
      boundary_(PhaseBoundary::from_params(p)),
      budget_(read_budget_setup(p, taqg ? "taqg" : "phase")) {
  const std::string type = taqg ? "taqg" : "phase";
  if (budget_) {
    mode_ = Mode::Budget;
  } else if (taqg) {
    mode_ = Mode::Widths;
  } else {
    const bool formats = p.has("first_format", Kind::Key) || p.has("second_format", Kind::Key) ||
                         p.has("first_format", Kind::Value) || p.has("second_format", Kind::Value);
    mode_ = formats ? Mode::Formats : Mode::Widths;
  }
  refuse_params_of_other_modes(p, type);
  if (taqg) {
    rule_ = parse_taqg_rule(p.str("rule"));
  } else {
    split_ = p.real("split");
    if (mode_ != Mode::Budget && split_ != 0) throw ConfigError("phase: `split` needs budget_bpe");
  }
  for (Kind kind : {Kind::Key, Kind::Value}) {
    const int k = static_cast<int>(kind);
    if (mode_ == Mode::Formats) {
      for (int ph = 0; ph < 2; ++ph) {
        const std::string name = ph == 0 ? "first_format" : "second_format";
        if (!p.has(name, kind))
          throw ConfigError("phase: `" + p.kind_name(name, kind) + "` is missing (give both phases' formats)");
        formats_[k][ph] = make_format(p.str(name, kind));
      }
    } else if (mode_ == Mode::Widths) {
      if (!p.has("family", kind))
        throw ConfigError(type + " needs budget_bpe with a family, " +
                          (taqg ? std::string("or low_bits with a family")
                                : "first_format/second_format, or "
                                  "first_bits/second_bits with a family"));
      family_[k] = WidthFamily::from_params(p, kind);
      if (taqg) {
        if (!p.has("low_bits", kind))
          throw ConfigError("taqg without a budget needs `" + p.kind_name("low_bits", kind) + "`");
        bits_[k][0] = static_cast<double>(p.integer("low_bits", kind));
      } else {
        for (int ph = 0; ph < 2; ++ph) {
          const std::string name = ph == 0 ? "first_bits" : "second_bits";
          if (!p.has(name, kind)) throw ConfigError("phase: `" + p.kind_name(name, kind) + "` is missing");
          bits_[k][ph] = static_cast<double>(p.integer(name, kind));
          formats_[k][ph] = family_[k].at(p.integer(name, kind));
        }
      }
    }
  }
}

void PhaseStrategy::refuse_params_of_other_modes(const Params& p, const std::string& type) const {
  switch (mode_) {
    case Mode::Budget:
      refuse_unused_params(p, type, {"first_format", "second_format", "first_bits", "second_bits", "low_bits"},
                           "with budget_bpe (the budget sets the widths)");
      break;
    case Mode::Formats:
      refuse_unused_params(p, type, {"first_bits", "second_bits", "family"},
                           "with first_format/second_format (fixed formats; widths of a family are the other way)");
      [[fallthrough]];
    case Mode::Widths:
      refuse_unused_params(p, type, {"format"}, "without budget_bpe (a fixed format goes with a budget)");
      break;
  }
}

std::vector<KeyRhoRange> PhaseStrategy::key_rho_ranges(const Recording& rec) const {
  int64_t b = 0;
  try {
    b = boundary_.resolve(rec);
  } catch (const Error&) {
    return {};  // build() throws the same
  }
  return phase_rho_ranges(rec, b, boundary_.rho_layers);
}

void PhaseStrategy::allocate(const StrategyInput& in, Plan& plan) const {
  const Recording& rec = in.rec;
  const int64_t b = boundary_.resolve(rec);
  split_open_segments(plan, b);
  plan.set_phase_boundary(b);
  if (boundary_.marker >= 0) plan.set_phase_marker(boundary_.marker);
  plan.annotate("phase_boundary", static_cast<double>(b));
  const PhaseRho rho = phase_rho(in, b, boundary_.rho_layers);
  plan.annotate("rho_first", rho.first);
  plan.annotate("rho_second", rho.second);

  double split = split_;
  FormatPtr formats[2][2] = {{formats_[0][0], formats_[0][1]}, {formats_[1][0], formats_[1][1]}};
  if (taqg_) {
    if (!std::isfinite(rho.first) || !std::isfinite(rho.second))
      throw Error("taqg: key redundancy rho of the " + std::string(std::isfinite(rho.first) ? "second" : "first") +
                  " phase is undefined (fewer than 2 nonzero keys before/after the boundary at token " +
                  std::to_string(b) + "); the TAQG bound needs both");
    const TaqgPrediction pred = taqg_predict(rho, rule_);
    split = pred.split();
    plan.annotate("taqg_redundant_phase", std::string(pred.redundant_phase == 0 ? "first" : "second"));
    plan.annotate("taqg_reduction_bits", pred.reduction);
    plan.annotate("taqg_split_bits", split);
    if (mode_ == Mode::Widths) {
      for (int k = 0; k < 2; ++k) {
        const double low = bits_[k][0];
        double high = low - pred.reduction;
        if (rule_ == TaqgRule::WaterFilling) high = std::round(high);
        high = std::max(1.0, high);
        const double first = pred.redundant_phase == 0 ? high : low, second = pred.redundant_phase == 0 ? low : high;
        formats[k][0] = family_[k].at(static_cast<int64_t>(first));
        formats[k][1] = family_[k].at(static_cast<int64_t>(second));
        if (k == 0) {
          plan.annotate("taqg_first_bits", first);
          plan.annotate("taqg_second_bits", second);
        }
      }
    }
  }

  if (budget_) budget_->fill_fixed(plan);
  const std::vector<AllocUnit> units = make_alloc_units(plan, b);
  if (mode_ != Mode::Budget) {
    for (const AllocUnit& u : units) {
      UnitPlan& up = plan.unit(u.layer, u.kv_head, u.kind);
      for (size_t s : u.segments) up.segments[s].format = formats[static_cast<int>(u.kind)][u.phase];
    }
    return;
  }
  const double f1 = static_cast<double>(b) / static_cast<double>(rec.tokens), f2 = 1.0 - f1;
  std::vector<double> offset;
  for (const AllocUnit& u : units) offset.push_back(u.phase == 0 ? split * f2 : -split * f1);
  BudgetedAllocation alloc(plan, units, budget_->of(Kind::Key), budget_->of(Kind::Value), budget_->budget);
  double bbar = 0;
  const std::vector<size_t> choice = allocate_target_bits(alloc, offset, plan, &bbar);
  plan.annotate("split_bits", split);
  plan.annotate("phase_first_bits", mean_width(alloc, choice, [](const AllocUnit& u) { return u.phase == 0; }));
  plan.annotate("phase_second_bits", mean_width(alloc, choice, [](const AllocUnit& u) { return u.phase == 1; }));
}

std::unique_ptr<Strategy> make_phase(const Params& p) { return std::make_unique<PhaseStrategy>(p, false); }
std::unique_ptr<Strategy> make_taqg(const Params& p) { return std::make_unique<PhaseStrategy>(p, true); }

}  // namespace kvb
