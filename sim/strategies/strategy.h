// Strategy: builds a Plan (who gets which precision) from its parameters and the
// Recording. Strategies live in one table (strategy_types()) that configs, sweeps,
// the CLI and tests iterate over; adding one means adding one entry there.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sim/plan.h"
#include "sim/recording.h"

namespace kvb {

// A parameter value as written in a config (after sweep expansion).
using ParamValue = std::variant<bool, int64_t, double, std::string>;
enum class ParamType { Bool, Int, Real, String };

std::string param_to_string(const ParamValue& v);
const char* param_type_name(ParamType t);

struct ParamDef {
  std::string name;
  ParamType type = ParamType::String;
  std::string description;
  std::optional<ParamValue> default_value;  // nullopt: required unless noted in description
};

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
  const std::map<std::string, ParamValue>& values() const { return values_; }

 private:
  const ParamValue& get(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
};

// What a strategy may look at when it builds a plan.
struct StrategyInput {
  const Recording& rec;
  uint64_t seed = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Throws kvb::Error (e.g. an impossible budget) with a message naming the cause.
  virtual Plan build(const StrategyInput& in) const = 0;
};

struct StrategyType {
  std::string name;
  std::string description;
  std::vector<ParamDef> params;
  // Params are validated against `params` (types, unknown names) before make().
  // make() checks cross-parameter rules and throws kvb::ConfigError.
  std::unique_ptr<Strategy> (*make)(const Params& params);
};

const std::vector<StrategyType>& strategy_types();
// Throws kvb::ConfigError naming `where` and the closest known type.
const StrategyType& require_strategy_type(const std::string& name, const std::string& where);

}  // namespace kvb
