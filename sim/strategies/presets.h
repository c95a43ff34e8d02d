// The preset table: named strategy settings that reproduce known caches, each a type
// and parameter values that a config's own parameters override:
//   [[strategy]]
//   preset = "kivi-2"
//   window = 64          # overrides the preset's residual length
// Every preset is counted honestly: its windows, sinks and metadata are in its bpe
// (methods.md §1). `kvbudget strategies` lists them.
#pragma once
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
// Throws kvb::ConfigError naming `where` and the closest known preset.
const StrategyPreset& require_strategy_preset(const std::string& name, const std::string& where);

}  // namespace kvb
