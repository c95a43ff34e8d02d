// Strategy: builds a Plan (who gets which precision) from its parameters and the
// Recording. Strategies live in one table (strategy_types()) that configs, sweeps,
// the CLI and tests iterate over; adding one means adding one entry there.
//
// Every type shares the protection parameters (sim/strategies/protections.h: sink
// heads, sink tokens, recency window, prompt) and, when it allocates under a budget,
// the budget parameters (sim/strategies/budget.h). A parameter marked per_kind also
// exists as key_<name> and value_<name>, which override it for keys or values, so K
// and V can be set separately everywhere.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sim/measurer.h"
#include "sim/metrics/redundancy.h"
#include "sim/plan.h"
#include "sim/recording.h"

namespace kvb {

class RecordingStats;

// A parameter value as written in a config (after sweep expansion). IntList is one
// value (widths = [2, 3, 4]); an axis of lists is an array of arrays.
using IntList = std::vector<int64_t>;
using ParamValue = std::variant<bool, int64_t, double, std::string, IntList>;
enum class ParamType { Bool, Int, Real, String, IntList };

std::string param_to_string(const ParamValue& v);
const char* param_type_name(ParamType t);

struct ParamDef {
  std::string name;
  ParamType type = ParamType::String;
  std::string description;
  std::optional<ParamValue> default_value;  // nullopt: required, unless `optional`
  bool per_kind = false;                    // key_<name> and value_<name> exist and override it
  bool optional = false;                    // may be absent; Params::has() tells

  bool operator==(const ParamDef&) const = default;
};

// The full parameter list of a definition list: each per_kind parameter followed by
// its key_/value_ variants (optional, no default).
std::vector<ParamDef> expand_per_kind(const std::vector<ParamDef>& defs);

// Parameters of one sweep point, defaults filled in, types checked.
class Params {
 public:
  Params() = default;
  explicit Params(std::map<std::string, ParamValue> values) : values_(std::move(values)) {}
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  const std::string& str(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;  // ints are accepted
  bool boolean(const std::string& name) const;
  const IntList& int_list(const std::string& name) const;
  const std::map<std::string, ParamValue>& values() const { return values_; }

  // Per-kind lookup: key_<name> (or value_<name>) when present, else <name>.
  std::string kind_name(const std::string& name, Kind kind) const;
  bool has(const std::string& name, Kind kind) const { return has(kind_name(name, kind)); }
  const std::string& str(const std::string& name, Kind kind) const { return str(kind_name(name, kind)); }
  int64_t integer(const std::string& name, Kind kind) const { return integer(kind_name(name, kind)); }
  double real(const std::string& name, Kind kind) const { return real(kind_name(name, kind)); }
  bool boolean(const std::string& name, Kind kind) const { return boolean(kind_name(name, kind)); }
  const IntList& int_list(const std::string& name, Kind kind) const { return int_list(kind_name(name, kind)); }

 private:
  const ParamValue& get(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
};

// Data a strategy calibrates on instead of the evaluated recording (the optimal
// allocator's `calibration_data`, methods.md §3): another recording of the same
// layers, heads and head_dim (its token count may differ), and its statistics on its
// own calibration positions.
struct CalibrationData {
  const Recording* rec = nullptr;
  RecordingStats* stats = nullptr;
  std::string name;  // how results name it: a path, or "synthetic seed N"
};
// Loads (once) the data a `calibration_data` value names and checks its shape against
// the evaluated recording; throws kvb::ConfigError (unknown value, missing file) or
// kvb::Error (a shape mismatch), naming the key.
using CalibrationResolver = std::function<CalibrationData(const std::string& value)>;

// What a strategy may look at when it builds a plan.
struct StrategyInput {
  const Recording& rec;
  uint64_t seed = 0;
  // Statistics shared by every point of a run (entropies, received attention,
  // distortion tables), computed once on the calibration positions. Strategies that
  // read statistics throw kvb::Error when it is missing.
  RecordingStats* stats = nullptr;
  // Resolves `calibration_data` values; nullptr where no experiment config names data
  // (a strategy given one then throws kvb::ConfigError).
  const CalibrationResolver* calibration = nullptr;
  // The measurer a strategy measures a recording with (the optimal allocator's
  // distortion tables, on the evaluated recording or its calibration data): the run's
  // planning backend (experiments/backend.h); nullptr = the CPU simulator.
  const MeasurerFor* measurer_for = nullptr;
  // Where build() says what a user must hear about the plan though it is valid (the
  // optimal allocator leaving budget unspent): one sentence each, without the point's
  // key (check_plans prefixes it and reports them); nullptr = nowhere.
  std::vector<std::string>* warnings = nullptr;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Throws kvb::Error (e.g. an impossible budget) with a message naming the cause.
  virtual Plan build(const StrategyInput& in) const = 0;
  // Whether build() reads per-head entropies or received attention, so a sweep can
  // compute them once, in parallel, before building plans.
  virtual bool needs_statistics() const { return false; }
  // The key redundancy ρ build() will ask in.stats for on `rec` (RecordingStats::key_rho),
  // found from what a streamed recording holds without its layers' tensors (shapes,
  // token ids): a streamed run computes them in its first pass, while each layer is held
  // (experiments/streaming.h). Empty for a type whose plans read no ρ (PlanReads), and
  // where build() would throw before reading ρ (it then throws the same error there).
  virtual std::vector<KeyRhoRange> key_rho_ranges(const Recording& rec) const {
    (void)rec;
    return {};
  }
};

// What a strategy type's plans read of the recording while they are built. A run
// streams its layers (one held at a time, experiments/streaming.h) only when no point
// reads PlanReads::Tensors: the others are computed in the streamed run's first pass.
enum class PlanReads {
  // Shapes, token ids and positions, and RecordingStats' attention statistics (per-head
  // entropies, received attention) at most.
  Statistics,
  // Those and key redundancy ρ of the ranges Strategy::key_rho_ranges names (phase,
  // taqg), through RecordingStats::key_rho.
  KeyRho,
  // The layers' tensors at will (optimal: distortion tables measured on them): every
  // layer held while plans are built.
  Tensors,
};

struct StrategyType {
  std::string name;
  std::string description;
  std::vector<ParamDef> params;  // base definitions; see expand_per_kind()
  // Params are validated against the expanded `params` (types, unknown names)
  // before make(). make() checks cross-parameter rules and throws kvb::ConfigError.
  std::unique_ptr<Strategy> (*make)(const Params& params);
  // Every points.csv column its plans may add (Plan::annotate names). The sweep
  // refuses a plan that reports another, and output.series / output.marker may name
  // these.
  std::vector<std::string> columns;
  // What its plans read of the recording while they are built (above).
  PlanReads plan_reads = PlanReads::Statistics;

  std::vector<ParamDef> all_params() const { return expand_per_kind(params); }
};

const std::vector<StrategyType>& strategy_types();
// Throws kvb::ConfigError naming `where` and the closest known type.
const StrategyType& require_strategy_type(const std::string& name, const std::string& where);

}  // namespace kvb
