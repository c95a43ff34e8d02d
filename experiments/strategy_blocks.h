// [[strategy]] blocks of an experiment config: a type or preset with parameters, any
// of which may be a sweep axis (an array or a numeric range string), and template
// variables ([strategy.vars]) used as {name} in string parameters.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "sim/strategies/strategy.h"

namespace kvb {

// One sweep axis or fixed value of a strategy block.
struct Axis {
  std::string name;                 // parameter or variable name
  std::vector<ParamValue> values;   // one value = fixed
  bool is_var = false;              // declared under [strategy.vars]
  bool from_preset = false;         // set by the block's preset, not the block itself
  std::string where;                // config location
};

struct StrategyBlock {
  size_t index = 0;
  std::string type;
  std::string label;      // `name` in the config, default the preset or the type
  bool named = false;     // `name` given: results label its points by it (SweepPoint::display_label)
  std::string preset;     // `preset` in the config, "" = none
  std::map<std::string, ParamValue> preset_values;  // what the preset sets
  std::vector<Axis> axes; // params and vars, sorted by name; the last varies fastest
  std::string where;
};

// Reads the `index`-th [[strategy]] block: checks the type or preset, every
// parameter's type, unknown keys and the {var} placeholders. Throws ConfigError with
// file:line locations.
StrategyBlock parse_strategy(const ConfigTable& t, size_t index);

}  // namespace kvb
