// uniform: one format for every key and one for every value (methods.md §3).
#pragma once
#include "sim/strategies/strategy.h"

namespace kvb {

class UniformStrategy final : public Strategy {
 public:
  UniformStrategy(FormatPtr key, FormatPtr value) : key_(std::move(key)), value_(std::move(value)) {}
  Plan build(const StrategyInput& in) const override;

 private:
  FormatPtr key_, value_;
};

std::unique_ptr<Strategy> make_uniform(const Params& p);
extern const std::vector<ParamDef> kUniformParams;

}  // namespace kvb
