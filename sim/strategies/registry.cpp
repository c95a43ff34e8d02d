// The strategy table. One entry per strategy type; order is the order users see.
#include "sim/strategies/strategy.h"
#include "sim/strategies/uniform.h"

namespace kvb {

const std::vector<StrategyType>& strategy_types() {
  static const std::vector<StrategyType> types = {
      {"uniform", "one format for every key and one for every value", kUniformParams, &make_uniform},
  };
  return types;
}

}  // namespace kvb
