// Helpers shared by the strategy tests: a small synthetic recording with sink heads,
// GQA and two phases, and strategies built straight from the strategy table.
#pragma once
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/formats/registry.h"
#include "sim/strategies/statistics.h"
#include "sim/strategies/strategy.h"
#include "sim/strategies/uniform.h"
#include "sim/synthetic.h"
#include "test_util.h"

namespace kvb::test {

// The uniform plan of rec: `key` for keys, `value` for values (empty: `key` too).
inline Plan uniform_plan(const Recording& rec, const std::string& key, const std::string& value = "") {
  return UniformStrategy(make_format(key), make_format(value.empty() ? key : value)).build({rec, 0});
}

// uniform_plan(rec, "int2-asym-g8", "int3-sym-g8") with `prefill` tokens of prefill and a
// keep-fp16 recent window of `window` tokens (`mode`) on every key unit, and on every
// value unit unless keys_only.
inline Plan windowed_plan(const Recording& rec, RecentWindow::Mode mode, bool keys_only, int64_t prefill,
                          int64_t window) {
  Plan plan = uniform_plan(rec, "int2-asym-g8", "int3-sym-g8");
  plan.set_prefill(prefill);
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < rec.kv_heads; ++g)
      for (Kind k : {Kind::Key, Kind::Value}) {
        if (keys_only && k == Kind::Value) continue;
        RecentWindow& w = plan.unit(l, g, k).window;
        w.size = window;
        w.format = make_format("keep-fp16");
        w.mode = mode;
      }
  return plan;
}

// 2 layers, 8 query / 4 KV heads (GQA), head_dim 32, 96 tokens, one sink head per
// layer, a recency bias, two phases (boundary at token 72, marker id 257).
inline SyntheticSpec strategy_spec() {
  SyntheticSpec s;
  s.seed = 11;
  s.layers = 2;
  s.q_heads = 8;
  s.kv_heads = 4;
  s.head_dim = 32;
  s.tokens = 96;
  s.entropy_mean = 3.0;
  s.entropy_spread = 3.0;
  s.sink_heads = 1;
  s.sink_tokens = 1;
  s.recency = 1.0;
  s.phase_fraction = 0.75;
  s.rho_first = 0.3;
  s.rho_second = 0.5;
  s.calibration_queries = 95;
  return s;
}

inline const Recording& strategy_recording() {
  static const Recording rec = generate_synthetic(strategy_spec());
  return rec;
}

// Every 4th position from 3: the calibration set of the strategy tests.
inline std::vector<int64_t> calibration_of(const Recording& rec) {
  std::vector<int64_t> pos;
  for (int64_t t = 3; t < rec.tokens; t += 4) pos.push_back(t);
  return pos;
}

// Parameters of `type`: its defaults, then `values`.
inline Params params_of(const std::string& type, const std::map<std::string, ParamValue>& values) {
  std::map<std::string, ParamValue> all;
  for (const ParamDef& d : require_strategy_type(type, "test").all_params())
    if (d.default_value) all[d.name] = *d.default_value;
  for (const auto& [k, v] : values) all[k] = v;
  return Params(all);
}

// The plan of strategy `type` with `values` on rec; *warnings (when given) receives
// what the strategy said about it (StrategyInput::warnings).
inline Plan build_plan(const std::string& type, const std::map<std::string, ParamValue>& values, const Recording& rec,
                       RecordingStats& stats, uint64_t seed = 0, std::vector<std::string>* warnings = nullptr) {
  const StrategyType& t = require_strategy_type(type, "test");
  const std::unique_ptr<Strategy> s = t.make(params_of(type, values));
  StrategyInput in{rec, seed, &stats};
  in.warnings = warnings;
  Plan plan = s->build(in);
  // Every column a plan adds is declared in the strategy table (the sweep refuses others).
  for (const Annotation& a : plan.annotations()) {
    INFO(type << " reported column " << a.name);
    CHECK(std::find(t.columns.begin(), t.columns.end(), a.name) != t.columns.end());
  }
  return plan;
}

inline double annotation(const Plan& plan, const std::string& name) {
  for (const Annotation& a : plan.annotations())
    if (a.name == name) return std::get<double>(a.value);
  FAIL("no annotation " << name);
  return 0;
}

inline std::string annotation_text(const Plan& plan, const std::string& name) {
  for (const Annotation& a : plan.annotations())
    if (a.name == name) return std::get<std::string>(a.value);
  return "";
}

}  // namespace kvb::test
