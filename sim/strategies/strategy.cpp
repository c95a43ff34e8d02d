#include "sim/strategies/strategy.h"

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/strategies/presets.h"

namespace kvb {

std::string param_to_string(const ParamValue& v) {
  if (const bool* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const int64_t* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const double* d = std::get_if<double>(&v)) return format_double(*d);
  if (const IntList* l = std::get_if<IntList>(&v)) {
    std::vector<std::string> parts;
    for (int64_t x : *l) parts.push_back(std::to_string(x));
    return "[" + join(parts, ",") + "]";
  }
  return std::get<std::string>(v);
}

const char* param_type_name(ParamType t) {
  switch (t) {
    case ParamType::Bool: return "boolean";
    case ParamType::Int: return "integer";
    case ParamType::Real: return "number";
    case ParamType::IntList: return "integer list";
    default: return "string";
  }
}

std::vector<ParamDef> expand_per_kind(const std::vector<ParamDef>& defs) {
  std::vector<ParamDef> out;
  for (const ParamDef& d : defs) {
    out.push_back(d);
    if (!d.per_kind) continue;
    for (const char* prefix : {"key_", "value_"}) {
      ParamDef k = d;
      k.name = prefix + d.name;
      k.description = std::string("`") + d.name + "` for " + (prefix[0] == 'k' ? "keys" : "values") + " only";
      k.default_value.reset();
      k.per_kind = false;
      k.optional = true;
      out.push_back(k);
    }
  }
  return out;
}

const ParamValue& Params::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw Error("internal: strategy parameter '" + name + "' missing");
  return it->second;
}
const std::string& Params::str(const std::string& name) const { return std::get<std::string>(get(name)); }
int64_t Params::integer(const std::string& name) const { return std::get<int64_t>(get(name)); }
double Params::real(const std::string& name) const {
  const ParamValue& v = get(name);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}
bool Params::boolean(const std::string& name) const { return std::get<bool>(get(name)); }
const IntList& Params::int_list(const std::string& name) const { return std::get<IntList>(get(name)); }

std::string Params::kind_name(const std::string& name, Kind kind) const {
  const std::string specific = (kind == Kind::Key ? "key_" : "value_") + name;
  return has(specific) ? specific : name;
}

const StrategyType& require_strategy_type(const std::string& name, const std::string& where) {
  std::vector<std::string> names;
  for (const StrategyType& t : strategy_types()) {
    if (t.name == name) return t;
    names.push_back(t.name);
  }
  std::string msg = where + ": unknown strategy type '" + name + "'";
  if (find_strategy_preset(name))  // a preset named as a type
    msg += "; '" + name + "' is a preset: select it with preset = \"" + name + "\"";
  else
    msg += did_you_mean(name, names);
  msg += "; known: " + join(names, ", ");
  throw ConfigError(msg);
}

}  // namespace kvb
