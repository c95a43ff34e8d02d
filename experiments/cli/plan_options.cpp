#include "experiments/cli/plan_options.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/strategies/presets.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// The parameter name of "name=value".
std::string assigned_name(const std::string& assignment) {
  return trim(assignment.substr(0, assignment.find('=')));
}

// "--param name=value" against a strategy's parameter table (resolve_strategy_params:
// defaults, then a preset's values, then the assignments; as in a config block, an
// assigned base parameter X also overrides the preset's key_X / value_X). Lists of
// integers are written "2,3,4".
Params strategy_params(const StrategyType& type, const StrategyPreset* preset,
                       const std::vector<std::string>& assignments) {
  std::set<std::string> assigned;
  for (const std::string& a : assignments)
    if (!assigned.insert(assigned_name(a)).second)
      throw ConfigError("--param " + assigned_name(a) + " is given twice");
  std::vector<ParamAssignment> typed;
  for (const std::string& a : assignments) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) throw ConfigError("--param '" + a + "': expected name=value");
    const std::string text = trim(a.substr(eq + 1));
    auto read = [a, text](const ParamDef& def) -> ParamValue {
      auto whole_int = [](const std::string& t) {
        size_t used = 0;
        const int64_t v = std::stoll(t, &used);
        if (used != t.size()) throw std::invalid_argument(t);
        return v;
      };
      try {
        switch (def.type) {
          case ParamType::Bool:
            if (text != "true" && text != "false") throw std::invalid_argument(text);
            return text == "true";
          case ParamType::Int: return whole_int(text);
          case ParamType::Real: {
            size_t used = 0;
            const double v = std::stod(text, &used);
            if (used != text.size() || !std::isfinite(v)) throw std::invalid_argument(text);
            return v;
          }
          case ParamType::String: return text;
          case ParamType::IntList: {
            IntList list;
            for (const std::string& part : split(text, ',')) list.push_back(whole_int(trim(part)));
            return list;
          }
        }
      } catch (const std::exception&) {
      }
      throw ConfigError("--param '" + a + "': expected a " + std::string(def.type == ParamType::Real ? "finite " : "") +
                        param_type_name(def.type) + (def.type == ParamType::IntList ? " (e.g. 2,3,4)" : ""));
    };
    typed.push_back({trim(a.substr(0, eq)), "--param '" + a + "': ", read});
  }
  return resolve_strategy_params(type, preset, typed,
                                 [](const std::string& name) { return "--param " + name + "=..."; });
}

}  // namespace

void PlanOptions::add_options(po::options_description& opts) {
  opts.add_options()("format", po::value(&format), "quantize keys and values with this format (e.g. int4-asym-g32)")(
      "key-format", po::value(&key_format), "format of keys (with --value-format)")(
      "value-format", po::value(&value_format), "format of values (with --key-format)")(
      "strategy", po::value(&strategy), "an allocation strategy or a preset (`kvbudget strategies`), with --param")(
      "param", po::value(&params)->composing(), "a strategy parameter: --param format=int4-asym-g32 (repeatable)");
}

std::unique_ptr<Strategy> PlanOptions::make_strategy() {
  const int quant_choices = (format.empty() ? 0 : 1) + (key_format.empty() && value_format.empty() ? 0 : 1) +
                            (strategy.empty() ? 0 : 1);
  if (quant_choices > 1) throw ConfigError("give one of --format, --key-format/--value-format and --strategy");
  if (key_format.empty() != value_format.empty()) throw ConfigError("--key-format and --value-format go together");
  if (!params.empty() && strategy.empty()) throw ConfigError("--param needs --strategy");
  if (!format.empty()) {
    strategy = "uniform";
    params = {"format=" + format};
  } else if (!key_format.empty()) {
    strategy = "uniform";
    params = {"key_format=" + key_format, "value_format=" + value_format};
  }
  if (strategy.empty()) return nullptr;
  // --strategy names a type (`kvbudget strategies`) or a preset of one.
  const NamedStrategy named = resolve_strategy_name(strategy, "--strategy", "--format");
  const StrategyType& type = *named.type;
  const StrategyPreset* preset = named.preset;
  try {
    const Params resolved = strategy_params(type, preset, params);
    for (const char* budget : {"budget_bpe", "key_budget_bpe", "value_budget_bpe"})
      if (budget_param.empty() && resolved.has(budget)) budget_param = budget;
    return type.make(resolved);
  } catch (const ConfigError& e) {
    // A format option naming a preset: --format kivi-2 means --strategy kivi-2.
    std::string hint;
    for (const auto& [option, value] : {std::pair{"--format", format}, std::pair{"--key-format", key_format},
                                        std::pair{"--value-format", value_format}})
      if (hint.empty() && !value.empty()) hint = preset_not_format_hint(value, "give --strategy " + value);
    if (hint.empty()) throw;
    throw ConfigError(e.what() + hint);
  }
}

std::string PlanOptions::source() const { return strategy + "(" + join(params, ",") + ")"; }

}  // namespace kvb::cli
