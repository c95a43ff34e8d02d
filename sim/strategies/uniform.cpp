#include "sim/strategies/uniform.h"

#include "sim/core/error.h"
#include "sim/formats/registry.h"

namespace kvb {

const std::vector<ParamDef> kUniformParams = {
    {"format", ParamType::String, "format of keys and values (e.g. int4-asym-g32)", std::string()},
    {"key_format", ParamType::String, "format of keys; overrides `format`", std::string()},
    {"value_format", ParamType::String, "format of values; overrides `format`", std::string()},
};

Plan UniformStrategy::build(const StrategyInput& in) const {
  const Recording& r = in.rec;
  Plan plan(r.num_layers(), r.kv_heads, r.tokens, r.head_dim);
  plan.assign_all(Kind::Key, key_);
  plan.assign_all(Kind::Value, value_);
  return plan;
}

std::unique_ptr<Strategy> make_uniform(const Params& p) {
  const std::string& both = p.str("format");
  std::string k = p.str("key_format"), v = p.str("value_format");
  if (k.empty()) k = both;
  if (v.empty()) v = both;
  if (k.empty() || v.empty())
    throw ConfigError("uniform needs `format`, or both `key_format` and `value_format`");
  return std::make_unique<UniformStrategy>(make_format(k), make_format(v));
}

}  // namespace kvb
