// The preset table: named strategy settings that reproduce known caches, each a type
// and parameter values that a config's own parameters override:
//   [[strategy]]
//   preset = "kivi-2"
//   window = 64          # overrides the preset's residual length
// Every preset is counted honestly: its windows, sinks and metadata are in its bpe
// (methods.md §1). `kvbudget strategies` lists them.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "sim/strategies/strategy.h"

namespace kvb {

struct StrategyPreset {
  std::string name;
  std::string type;  // an entry of strategy_types()
  std::string reproduces;
  std::vector<std::pair<std::string, ParamValue>> params;
};

const std::vector<StrategyPreset>& strategy_presets();
// The preset called `name`, or null.
const StrategyPreset* find_strategy_preset(const std::string& name);
// Throws kvb::ConfigError naming `where` and the closest known preset.
const StrategyPreset& require_strategy_preset(const std::string& name, const std::string& where);

// Whether a preset's value for parameter `name` gives way to an explicitly set one
// (`is_set(param)`): `name` itself, or, for key_X / value_X of a per-kind parameter X
// of `type`, the base X (a block's `format` overrides the preset's key_format too), or
// an alternative to it (a block's `prompt` overrides the preset's `prompt_fraction`,
// `budget_bpe` its `mean_bits` or `low_bits`, `sink_head_threshold` its `sink_heads`).
// A strategy named by a type (`kvbudget strategies`) or a preset, as eval's --strategy
// and the Python API take it: the type, and the preset (null for a type name).
struct NamedStrategy {
  const StrategyType* type = nullptr;
  const StrategyPreset* preset = nullptr;
};
// Throws kvb::ConfigError naming `where` for a name that is neither, with the closest
// type or preset ("did you mean 'kivi-2'?"), or, for a format's name, that it is a
// format (`format_option` says how to give one, e.g. "--format q4_0").
NamedStrategy resolve_strategy_name(const std::string& name, const std::string& where,
                                    const std::string& format_option);

// For a name given where a format belongs that is a strategy preset's name rather than
// a format: "; 'kivi-2' is a strategy preset, not a format: give <use_instead> kivi-2";
// else "". (`eval --format kivi-2` should point to `--strategy kivi-2`.)
std::string preset_not_format_hint(const std::string& name, const std::string& use_instead);

bool preset_value_overridden(const StrategyType& type, const std::string& name,
                             const std::function<bool(const std::string&)>& is_set);

// One parameter a caller assigns (eval's --param, a Python params dict entry).
struct ParamAssignment {
  std::string name;
  std::string where;  // prefix of the unknown-parameter error, e.g. "--param 'bits=4': "; may be ""
  // The value as def's type; throws kvb::ConfigError naming the assignment when it
  // cannot be read as one.
  std::function<ParamValue(const ParamDef& def)> value;
};
// A strategy's parameters as eval's --param and the Python API set them: the type's
// defaults (per-kind variants included), then the preset's values (`preset` may be
// null), each giving way to an assigned parameter as preset_value_overridden() says,
// then the assignments. Throws kvb::ConfigError for an assignment that names no
// parameter of the type ("<where>strategy 'T' has no parameter 'x' (did you mean
// ...?); parameters: ...") and for a required parameter left unset ("strategy 'T'
// needs " + how_to_set(name)).
Params resolve_strategy_params(const StrategyType& type, const StrategyPreset* preset,
                               const std::vector<ParamAssignment>& assignments,
                               const std::function<std::string(const std::string& name)>& how_to_set);

}  // namespace kvb
