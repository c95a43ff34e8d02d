#include "experiments/strategy_blocks.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "experiments/range_grammar.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/strategies/presets.h"

namespace kvb {

namespace {

// A config value -> candidate parameter values (an array is an axis; a numeric range
// string is an axis; anything else is one value).
std::vector<ParamValue> values_of(const ConfigTable& t, const std::string& key, bool allow_range) {
  const toml::node* n = t.node(key);
  auto scalar = [&](const toml::node& v) -> ParamValue {
    if (v.is_boolean()) return *v.value<bool>();
    if (v.is_integer()) return *v.value<int64_t>();
    if (v.is_floating_point()) return *v.value<double>();
    if (v.is_string()) return *v.value<std::string>();
    t.fail(key, "expected a string, number or boolean (or an array of them), got " + toml_type_with_article(v));
  };
  if (const toml::array* a = n->as_array()) {
    std::vector<ParamValue> out;
    for (const toml::node& e : *a) out.push_back(scalar(e));
    if (out.empty()) t.fail(key, "empty array: a sweep axis needs at least one value");
    return out;
  }
  ParamValue v = scalar(*n);
  const std::string* s = std::get_if<std::string>(&v);
  if (!allow_range || !s) return {v};
  if (auto r = parse_range_at(t, key, *s)) {
    if (r->empty()) t.fail(key, "range '" + *s + "' is empty (LO..HI:STEP needs LO <= HI and STEP > 0)");
    return *r;
  }
  if (looks_like_range(*s))
    t.fail(key, "'" + *s + "' is not a range: write LO..HI or LO..HI:STEP with numbers and a positive STEP "
                "(\"2..8\", \"0.25..1:0.25\")");
  return {v};
}

// A config value of an integer-list parameter -> candidate values: an array of
// integers or a range string ("2..8") is one list; an array of arrays is an axis.
std::vector<ParamValue> list_values_of(const ConfigTable& t, const std::string& key) {
  const toml::node* n = t.node(key);
  auto ints = [&](const toml::array& a) {
    IntList out;
    for (const toml::node& e : a) {
      if (!e.is_integer()) t.fail(key, "expected integers, got " + toml_type_with_article(e));
      out.push_back(*e.value<int64_t>());
    }
    return out;
  };
  if (const toml::array* a = n->as_array()) {
    if (!a->empty() && a->front().is_array()) {
      std::vector<ParamValue> axis;
      for (const toml::node& e : *a) {
        if (!e.is_array()) t.fail(key, "an axis of lists must hold only arrays");
        axis.emplace_back(ints(*e.as_array()));
      }
      return axis;
    }
    return {ParamValue(ints(*a))};
  }
  if (n->is_string()) {
    const std::string text = *n->value<std::string>();
    auto r = parse_range_at(t, key, text);
    if (!r || r->empty()) t.fail(key, "expected an array of integers or a range \"2..8\", got \"" + text + "\"");
    IntList out;
    for (const ParamValue& v : *r) {
      if (!std::holds_alternative<int64_t>(v)) t.fail(key, "range '" + text + "' must hold integers");
      out.push_back(std::get<int64_t>(v));
    }
    return {ParamValue(out)};
  }
  t.fail(key, "expected an array of integers (or an array of such arrays for a sweep), got " + toml_type_with_article(*n));
}

// Coerces a value to a parameter's type, or fails naming the key.
ParamValue coerce(const ParamValue& v, const ParamDef& def, const ConfigTable& t, const std::string& key) {
  switch (def.type) {
    case ParamType::Bool:
      if (std::holds_alternative<bool>(v)) return v;
      break;
    case ParamType::Int:
      if (std::holds_alternative<int64_t>(v)) return v;
      break;
    case ParamType::Real:
      if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
      if (const double* d = std::get_if<double>(&v)) {
        if (!std::isfinite(*d)) t.fail(key, "expected a finite number, got " + param_to_string(v));
        return v;
      }
      break;
    case ParamType::String:
      if (std::holds_alternative<std::string>(v)) return v;
      break;
    case ParamType::IntList:
      if (std::holds_alternative<IntList>(v)) return v;
      break;
  }
  t.fail(key, "expected a " + std::string(param_type_name(def.type)) + ", got '" + param_to_string(v) + "'");
}

}  // namespace

StrategyBlock parse_strategy(const ConfigTable& t, size_t index) {
  StrategyBlock b;
  b.index = index;
  b.where = t.where();
  // A preset names the type and sets parameters that the block's own override.
  const StrategyPreset* preset = nullptr;
  if (const toml::node* n = t.node("preset")) {
    if (!n->is_string())
      t.fail("preset", "expected one preset name (a string); to compare presets use one [[strategy]] block each");
    preset = &require_strategy_preset(*n->value<std::string>(), t.where("preset"));
    b.preset = preset->name;
  }
  b.type = preset && !t.has("type") ? preset->type : t.required_string("type");
  const StrategyType& type = require_strategy_type(b.type, t.where("type"));
  if (preset && b.type != preset->type)
    t.fail("type", "preset '" + preset->name + "' is a '" + preset->type + "' strategy, not '" + b.type + "'");
  b.label = t.string("name", preset ? preset->name : b.type);
  b.named = t.has("name");
  if (b.named && b.label.find_first_not_of(" \t") == std::string::npos)
    t.fail("name", "an empty name would leave the strategy and label columns, the plots' legends and the budget "
                   "answers blank; give a name or leave the key out");
  const std::vector<ParamDef> defs = type.all_params();

  std::vector<std::string> var_names;
  if (auto vars = t.opt_table("vars")) {
    for (const std::string& k : vars->keys()) {
      if (k == "b")
        vars->fail(k, "{b} is reserved for the allocator's width in a format family (family = \"int{b}-asym-g32\"); "
                      "name the variable otherwise");
      Axis a;
      a.name = k;
      a.is_var = true;
      a.where = vars->where(k);
      a.values = values_of(*vars, k, true);
      b.axes.push_back(a);
      var_names.push_back(k);
    }
  }
  std::vector<std::string> param_names;
  for (const ParamDef& def : defs) {
    param_names.push_back(def.name);
    if (!t.has(def.name)) continue;
    Axis a;
    a.name = def.name;
    a.where = t.where(def.name);
    const bool numeric = def.type == ParamType::Int || def.type == ParamType::Real;
    const std::vector<ParamValue> raw =
        def.type == ParamType::IntList ? list_values_of(t, def.name) : values_of(t, def.name, numeric);
    for (const ParamValue& v : raw) a.values.push_back(coerce(v, def, t, def.name));
    // A format parameter naming a preset (format = "kivi-2"): say what it is.
    if (def.name.ends_with("format"))
      for (const ParamValue& v : a.values)
        if (const std::string* s = std::get_if<std::string>(&v))
          if (const std::string hint = preset_not_format_hint(
                  *s, "select it with preset = \"" + *s + "\" (in a [[strategy]] block of its own)");
              !hint.empty())
            t.fail(def.name, "unknown format '" + *s + "'" + hint);
    b.axes.push_back(a);
  }
  if (preset) {
    for (const auto& [name, value] : preset->params) {
      b.preset_values[name] = value;
      // The block's own keys (X also for the preset's key_X / value_X) override it.
      if (preset_value_overridden(type, name, [&](const std::string& k) { return t.has(k); })) continue;
      Axis a;
      a.name = name;
      a.from_preset = true;
      a.where = t.where("preset");
      a.values = {value};
      b.axes.push_back(a);
    }
  }
  // Unknown keys in a strategy are reported with this strategy's parameter list.
  for (const std::string& k : t.keys()) {
    if (k == "type" || k == "name" || k == "vars" || k == "preset") continue;
    if (std::find(param_names.begin(), param_names.end(), k) != param_names.end()) continue;
    std::string msg = "unknown parameter '" + k + "' for strategy type '" + b.type + "'";
    msg += did_you_mean(k, param_names);
    msg += "; `kvbudget strategies` lists the parameters (template variables go under [" + t.path() + ".vars])";
    t.fail(k, msg);
  }
  // Every {var} used in a string parameter must be declared, and every var used;
  // {b} is the allocator's width, filled in by the strategy.
  std::set<std::string> used;
  static const std::regex placeholder(R"(\{([A-Za-z_][A-Za-z0-9_]*)\})");
  for (const Axis& a : b.axes) {
    if (a.is_var) continue;
    for (const ParamValue& v : a.values) {
      const std::string* s = std::get_if<std::string>(&v);
      if (!s) continue;
      for (std::sregex_iterator it(s->begin(), s->end(), placeholder), end; it != end; ++it) {
        const std::string name = (*it)[1];
        if (name == "b") continue;
        if (std::find(var_names.begin(), var_names.end(), name) == var_names.end())
          throw ConfigError(a.where + ": '{" + name + "}' is not declared under [" + t.path() + ".vars]");
        used.insert(name);
      }
    }
  }
  for (const Axis& a : b.axes)
    if (a.is_var && !used.count(a.name))
      throw ConfigError(a.where + ": variable '" + a.name + "' is never used as {" + a.name + "} in a parameter");
  std::sort(b.axes.begin(), b.axes.end(), [](const Axis& x, const Axis& y) { return x.name < y.name; });
  return b;
}

}  // namespace kvb
