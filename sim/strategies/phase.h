// phase and taqg: separate settings for a reasoning trace's two phases (methods.md §3).
//
// The boundary t* (first token of the second phase) is the first position holding
// `phase_marker` (a token id such as </think>), else `phase_index`, else
// round(phase_fraction · T) (default 0.75). Every phase strategy reports the
// research's key redundancy per phase (rho_first, rho_second: post-RoPE keys
// averaged over KV heads, mean pairwise cosine, averaged over layers;
// sim/metrics/redundancy.h) and splits token regions there for error attribution.
//
// phase, three ways to set each phase:
//   first_format / second_format          fixed formats (per kind);
//   family + first_bits / second_bits     fixed widths of a family;
//   budget_bpe + family + split           split = b_first − b_second bits at an
//                                         exactly met budget: targets
//                                         b̄ + split·f₂ and b̄ − split·f₁ (f: the
//                                         phases' token fractions), rounded and
//                                         repaired by deficit.
// taqg: the split from the TAQG bound. With ρ_H the higher (more redundant) phase's ρ
// and ρ_L the other's, the bound as written gives
//   b_H = max(1, b_L − ⌊log₂((1 − ρ_L)/(1 − ρ_H) + 1)⌋);
// rule "water-filling" uses the reduction ½·log₂((1 − ρ_L)/(1 − ρ_H)) (reverse
// water-filling for sources whose innovation variance is 1 − ρ), rule "reversed"
// gives the redundant phase the as-written reduction as extra bits instead (the
// suspected sign error). With low_bits (b_L) and no budget the predicted widths are
// used as they are, unequal budgets as in the research; with budget_bpe the
// predicted split is met at exactly the budget.
#pragma once
#include <optional>

#include "sim/strategies/protected_strategy.h"

namespace kvb {

// phase_marker, phase_index, phase_fraction, rho_layers.
const std::vector<ParamDef>& phase_boundary_params();

struct PhaseBoundary {
  int64_t marker = -1;  // token id; < 0 = unused
  int64_t index = -1;   // position; < 0 = unused
  double fraction = 0.75;
  std::vector<int64_t> rho_layers;  // indices into the recording's layers; empty = all

  static PhaseBoundary from_params(const Params& p);
  // First token of the second phase; throws kvb::Error when the marker is absent or
  // either phase would be empty.
  int64_t resolve(const Recording& rec) const;
};

struct PhaseRho {
  double first = 0, second = 0;
};
// The ranges of both phases' ρ: tokens [0, boundary) and [boundary, T) over `layers`.
std::vector<KeyRhoRange> phase_rho_ranges(const Recording& rec, int64_t boundary, const std::vector<int64_t>& layers);
// Research ρ of both phases (from in.stats, RecordingStats::key_rho, when present).
PhaseRho phase_rho(const StrategyInput& in, int64_t boundary, const std::vector<int64_t>& layers);

enum class TaqgRule { AsWritten, WaterFilling, Reversed };
struct TaqgPrediction {
  int redundant_phase = 0;  // 0 = first, 1 = second: the phase with the higher ρ (H)
  double reduction = 0;     // bits the bound takes from H (negative: gives to H)
  // b_first − b_second the bound asks for, given the other phase at b_L.
  double split() const { return redundant_phase == 1 ? reduction : -reduction; }
};
TaqgPrediction taqg_predict(const PhaseRho& rho, TaqgRule rule);
TaqgRule parse_taqg_rule(const std::string& s);

class PhaseStrategy final : public ProtectedStrategy {
 public:
  // taqg = true: the split comes from the TAQG bound (type "taqg").
  PhaseStrategy(const Params& p, bool taqg);
  // Both phases' ρ ranges at the boundary resolve() finds on `rec`.
  std::vector<KeyRhoRange> key_rho_ranges(const Recording& rec) const override;

 protected:
  void allocate(const StrategyInput& in, Plan& plan) const override;

 private:
  enum class Mode { Formats, Widths, Budget };
  // Throws kvb::ConfigError for parameters of a mode other than mode_ (they would be
  // ignored).
  void refuse_params_of_other_modes(const Params& p, const std::string& type) const;
  bool taqg_ = false;
  TaqgRule rule_ = TaqgRule::AsWritten;
  PhaseBoundary boundary_;
  Mode mode_ = Mode::Formats;
  FormatPtr formats_[2][2];  // [kind][phase], Mode::Formats
  double bits_[2][2] = {};   // [kind][phase], Mode::Widths (taqg: [kind][L phase] = low_bits)
  WidthFamily family_[2];    // Mode::Widths
  std::optional<BudgetSetup> budget_;
  double split_ = 0;
};

std::unique_ptr<Strategy> make_phase(const Params& p);
std::unique_ptr<Strategy> make_taqg(const Params& p);
const std::vector<ParamDef>& phase_params();
const std::vector<ParamDef>& taqg_params();

}  // namespace kvb
