#include "sim/strategies/presets.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"

namespace kvb {

namespace {

using P = std::vector<std::pair<std::string, ParamValue>>;

// KIVI (Liu et al. 2024): keys per channel in groups of G = 32 tokens, values per
// token in groups of 32 channels, both asymmetric with fp16 scale and minimum; the
// last R = 128 tokens in fp16, keys flushed in chunks of R (a key group needs R
// tokens; the query attends with the residual plus its own token, 1..R tokens, before
// a full residual is flushed), values sliding (the oldest residual value is quantized
// as a new one comes). KIVI's reference code appends the new value and attends before
// it quantizes the oldest, so its query sees R + 1 fp16 values where the sliding rule
// (methods.md §3) gives R: a difference of one token in 129, not modelled.
P kivi(int bits) {
  const std::string b = std::to_string(bits);
  return {{"key_format", "int" + b + "-asym-ch32"},
          {"value_format", "int" + b + "-asym-g32"},
          {"window", int64_t{128}},
          {"window_format", std::string("keep-fp16")},
          {"key_window_mode", std::string("chunked")},
          {"value_window_mode", std::string("sliding")}};
}

// Hugging Face QuantizedCache, quanto backend: asymmetric nbits per group of 64
// channels of each token (q_group_size 64, axis 0), a residual of 128 tokens in the
// model's precision flushed in chunks (each query attends with the residual plus its
// own token, 1..128 tokens, before a full residual is flushed), and the whole prompt
// quantized at prefill (here the first quarter of the recording is taken as the
// prompt).
P hf_quanto(int bits) {
  return {{"format", "int" + std::to_string(bits) + "-asym-g64"},
          {"window", int64_t{128}},
          {"window_format", std::string("keep-fp16")},
          {"window_mode", std::string("chunked")},
          {"prompt_fraction", 0.25}};
}

// quant.cpp `-k <type> --k-window W`: keys quantized, the last W keys also kept in
// fp32 as an extra copy beside the complete quantized cache (sliding), values fp16.
// Its 4-bit and 2-bit key types are approximated by int4/int2 asym g32 (the rotation
// formats, turbo-<b>, are available but not what these presets have measured; a
// block can set key_format = "turbo-4" itself).
P quantcpp(int bits, int64_t window) {
  return {{"key_format", "int" + std::to_string(bits) + "-asym-g32"},
          {"value_format", std::string("keep-fp16")},
          {"key_window", window},
          {"key_window_format", std::string("keep-fp32")},
          {"key_window_mode", std::string("sliding")},
          {"key_window_extra_copy", true}};
}

}  // namespace

const std::vector<StrategyPreset>& strategy_presets() {
  static const std::vector<StrategyPreset> presets = {
      {"kivi-2", "uniform", "KIVI-2: int2 keys per channel (G=32 tokens), values per token (G=32), R=128 fp16 residual",
       kivi(2)},
      {"kivi-4", "uniform", "KIVI-4: as kivi-2 with 4 bits", kivi(4)},
      {"hf-quanto-int4", "uniform",
       "Hugging Face QuantizedCache (quanto): int4 group 64, residual 128 (chunked), prompt quantized", hf_quanto(4)},
      {"hf-quanto-int2", "uniform",
       "Hugging Face QuantizedCache (quanto): int2 group 64, residual 128, prompt quantized", hf_quanto(2)},
      {"quantcpp-k4-w128", "uniform", "quant.cpp -k 4-bit --k-window 128: fp32 key window as an extra copy",
       quantcpp(4, 128)},
      {"quantcpp-k2-w512", "uniform", "quant.cpp -k uniform_2b --k-window 512: fp32 key window as an extra copy",
       quantcpp(2, 512)},
      {"quantcpp-k4", "uniform", "quant.cpp -k 4-bit, no window", quantcpp(4, 0)},
      {"quantcpp-k2", "uniform", "quant.cpp -k uniform_2b, no window", quantcpp(2, 0)},
      {"research-entropy",
       "entropy",
       "the entropy-adaptive research as committed: Shannon entropy, alpha 0.25, b̄ = 4 (rounded, no budget), int{b} "
       "asym g32",
       {{"entropy", std::string("shannon")},
        {"alpha", 0.25},
        {"mean_bits", 4.0},
        {"family", std::string("int{b}-asym-g32")}}},
      {"research-skip3",
       "entropy",
       "research-entropy with the 3 lowest-entropy heads kept in fp16",
       {{"entropy", std::string("shannon")},
        {"alpha", 0.25},
        {"mean_bits", 4.0},
        {"family", std::string("int{b}-asym-g32")},
        {"sink_heads", int64_t{3}}}},
      {"taqg-4-3",
       "taqg",
       "TAQG as published: the less redundant phase at 4 bits, the bound's width for the other "
       "(unequal budgets)",
       {{"low_bits", int64_t{4}}, {"family", std::string("int{b}-asym-g32")}}},
  };
  return presets;
}

const StrategyPreset* find_strategy_preset(const std::string& name) {
  for (const StrategyPreset& p : strategy_presets())
    if (p.name == name) return &p;
  return nullptr;
}

const StrategyPreset& require_strategy_preset(const std::string& name, const std::string& where) {
  if (const StrategyPreset* p = find_strategy_preset(name)) return *p;
  std::vector<std::string> names;
  for (const StrategyPreset& p : strategy_presets()) names.push_back(p.name);
  std::string msg = where + ": unknown preset '" + name + "'";
  msg += did_you_mean(name, names);
  throw ConfigError(msg + "; known: " + join(names, ", "));
}

NamedStrategy resolve_strategy_name(const std::string& name, const std::string& where,
                                    const std::string& format_option) {
  std::vector<std::string> names;
  for (const StrategyType& t : strategy_types()) {
    if (t.name == name) return {&t, nullptr};
    names.push_back(t.name);
  }
  if (const StrategyPreset* p = find_strategy_preset(name))
    return {&require_strategy_type(p->type, where + " (preset '" + p->name + "')"), p};
  for (const StrategyPreset& p : strategy_presets()) names.push_back(p.name);
  std::string msg = where + ": unknown strategy type or preset '" + name + "'";
  bool is_format = false;
  try {
    make_format(name);
    is_format = true;
  } catch (const ConfigError&) {
  }
  if (is_format)
    msg += "; '" + name + "' is a format, not a strategy: give " + format_option + " " + name;
  else
    msg += did_you_mean(name, names);
  throw ConfigError(msg + "; types and presets: " + join(names, ", ") + " (kvbudget strategies describes them)");
}

std::string preset_not_format_hint(const std::string& name, const std::string& advice) {
  if (!find_strategy_preset(name)) return {};
  return "; '" + name + "' is a strategy preset, not a format: " + advice;
}

namespace {

// Parameters that are alternatives to one another, grouped by the mode they select:
// setting one of a mode makes a preset's parameters of the group's other modes give way.
using Mode = std::vector<std::string>;
const std::vector<std::vector<Mode>>& alternative_modes() {
  static const std::vector<std::vector<Mode>> groups = {
      {{"prompt"}, {"prompt_fraction"}},
      {{"sink_heads"}, {"sink_head_threshold"}},
      {{"budget_bpe", "key_budget_bpe", "value_budget_bpe"},
       {"mean_bits"},
       {"low_bits"},
       {"first_bits", "second_bits"},
       {"first_format", "second_format"}},
  };
  return groups;
}

// `name` without a key_ / value_ prefix, and the prefix ("" when none).
std::pair<std::string, std::string> split_kind_prefix(const std::string& name) {
  for (const char* prefix : {"key_", "value_"})
    if (name.rfind(prefix, 0) == 0) return {name.substr(std::string(prefix).size()), prefix};
  return {name, ""};
}

// Whether the block sets a parameter of another mode than the preset's `name`: the
// generic form overrides any kind, key_X only the preset's key_ parameters.
bool alternative_set(const std::string& name, const std::function<bool(const std::string&)>& is_set) {
  const auto [base, prefix] = split_kind_prefix(name);
  for (const std::vector<Mode>& group : alternative_modes())
    for (const Mode& mode : group) {
      if (std::find(mode.begin(), mode.end(), base) == mode.end() &&
          std::find(mode.begin(), mode.end(), name) == mode.end())
        continue;
      for (const Mode& other : group) {
        if (&other == &mode) continue;
        for (const std::string& k : other)
          if (is_set(k) || (!prefix.empty() && is_set(prefix + k))) return true;
      }
    }
  return false;
}

}  // namespace

bool preset_value_overridden(const StrategyType& type, const std::string& name,
                             const std::function<bool(const std::string&)>& is_set) {
  if (is_set(name) || alternative_set(name, is_set)) return true;
  const auto [base, prefix] = split_kind_prefix(name);
  if (prefix.empty() || !is_set(base)) return false;
  return std::any_of(type.params.begin(), type.params.end(),
                     [&](const ParamDef& def) { return def.per_kind && def.name == base; });
}

Params resolve_strategy_params(const StrategyType& type, const StrategyPreset* preset,
                               const std::vector<ParamAssignment>& assignments,
                               const std::function<std::string(const std::string& name)>& how_to_set) {
  const std::vector<ParamDef> defs = type.all_params();
  std::map<std::string, ParamValue> values;
  for (const ParamDef& d : defs)
    if (d.default_value) values[d.name] = *d.default_value;
  std::set<std::string> assigned;
  for (const ParamAssignment& a : assignments) assigned.insert(a.name);
  if (preset)
    for (const auto& [name, value] : preset->params)
      if (!preset_value_overridden(type, name, [&](const std::string& k) { return assigned.count(k) > 0; }))
        values[name] = value;
  std::vector<std::string> names;
  for (const ParamDef& d : defs) names.push_back(d.name);
  for (const ParamAssignment& a : assignments) {
    const auto def = std::find_if(defs.begin(), defs.end(), [&](const ParamDef& d) { return d.name == a.name; });
    if (def == defs.end())
      throw ConfigError(a.where + "strategy '" + type.name + "' has no parameter '" + a.name + "'" +
                        did_you_mean(a.name, names) + "; parameters: " + join(names, ", "));
    values[a.name] = a.value(*def);
  }
  for (const ParamDef& d : defs)
    if (!values.count(d.name) && !d.optional)
      throw ConfigError("strategy '" + type.name + "' needs " + how_to_set(d.name));
  return Params(values);
}

}  // namespace kvb
