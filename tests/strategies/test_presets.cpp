// The preset table (sim/strategies/presets.*): every preset is valid for its type, and
// the cache presets cost what methods.md §1 says: KIVI-2 G=32 3.0 bpe plus its fp16
// residual W·(16 − 3)/T, HF quanto int4 g64 4.5 and int2 2.5 plus the residual,
// quant.cpp's fp32 key window W·32/T of the keys as an extra copy.
#include <set>

#include "sim/core/error.h"
#include "sim/strategies/presets.h"
#include "recording_test_util.h"
#include "strategy_test_util.h"

using namespace kvb;

namespace {

Plan preset_plan(const std::string& name, const Recording& rec, std::map<std::string, ParamValue> overrides = {}) {
  const StrategyPreset& p = require_strategy_preset(name, "test");
  std::map<std::string, ParamValue> v(p.params.begin(), p.params.end());
  for (const auto& [k, x] : overrides) v[k] = x;
  RecordingStats stats(rec, {});
  return test::build_plan(p.type, v, rec, stats);
}

}  // namespace

TEST_CASE("every preset names a type and only parameters of that type, with their types") {
  std::set<std::string> names;
  for (const StrategyPreset& p : strategy_presets()) {
    INFO(p.name);
    CHECK(names.insert(p.name).second);
    const StrategyType& type = require_strategy_type(p.type, "test");
    const std::vector<ParamDef> defs = type.all_params();
    for (const auto& [k, v] : p.params) {
      auto it = std::find_if(defs.begin(), defs.end(), [&](const ParamDef& d) { return d.name == k; });
      REQUIRE(it != defs.end());
      const ParamType want = it->type;
      const bool ok = (want == ParamType::Bool && std::holds_alternative<bool>(v)) ||
                      (want == ParamType::Int && std::holds_alternative<int64_t>(v)) ||
                      (want == ParamType::Real && std::holds_alternative<double>(v)) ||
                      (want == ParamType::String && std::holds_alternative<std::string>(v)) ||
                      (want == ParamType::IntList && std::holds_alternative<IntList>(v));
      CHECK(ok);
    }
    CHECK_NOTHROW((void)type.make(test::params_of(p.type, {p.params.begin(), p.params.end()})));
  }
  CHECK_THROWS_WITH_AS(require_strategy_preset("kivi2", "here"), doctest::Contains("did you mean 'kivi-2'"),
                       ConfigError);
}

TEST_CASE("KIVI-2 G=32: 3.0 bpe plus the fp16 residual W·(16 − 3)/T, keys chunked, values sliding") {
  // T = 300: keys flush in chunks of 128 (44 left in the residual, 256 quantized in
  // 8 groups of 32 tokens), values slide (128 in the residual, 172 quantized).
  const Recording rec = test::random_layers({2, 2, 2, 300, 64, 3});
  const Plan p = preset_plan("kivi-2", rec);
  REQUIRE(p.check().empty());
  const double held = 44 + 128;  // residual tokens of K and of V
  CHECK(p.bpe() == doctest::Approx(3.0 + held * (16 - 3.0) / (2 * 300)));
  // At T = 512 the last query attends with a full key residual (flushed after it):
  // memory counts it, so keys and values both hold 128 fp16 tokens.
  const Recording r512 = test::random_layers({1, 2, 2, 512, 64, 3});
  CHECK(preset_plan("kivi-2", r512).bpe() == doctest::Approx(3.0 + 256 * 13.0 / (2 * 512)));
  // At a 32K target the residual is W/32K of the cache, for keys and values.
  CHECK(p.bpe_at(32768) == doctest::Approx(3.0 + 256 * 13.0 / (2 * 32768)));
  CHECK(preset_plan("kivi-4", r512).bpe() == doctest::Approx(5.0 + 256 * 11.0 / (2 * 512)));
}

TEST_CASE("HF QuantizedCache (quanto): int4 g64 4.5 and int2 g64 2.5 bpe plus the chunked residual") {
  // T = 600, prompt = 150 (quantized whole); the last query (t = 599) attends with
  // (599 - 150) % 128 + 1 = 66 residual tokens, for keys and values alike.
  const Recording rec = test::random_layers({2, 2, 2, 600, 64, 3});
  const Plan p4 = preset_plan("hf-quanto-int4", rec);
  REQUIRE(p4.check().empty());
  CHECK(p4.prefill() == 150);
  CHECK(p4.bpe() == doctest::Approx(4.5 + 66 * (16 - 4.5) / 600));
  const Plan p2 = preset_plan("hf-quanto-int2", rec);
  CHECK(p2.bpe() == doctest::Approx(2.5 + 66 * (16 - 2.5) / 600));
  // T = 512, prompt 128: 384 decoded tokens, a multiple of W; the last query still
  // attends with a full residual of 128 tokens, flushed after it.
  const Recording r = test::random_layers({1, 1, 1, 512, 64, 3});
  CHECK(preset_plan("hf-quanto-int4", r).bpe() == doctest::Approx(4.5 + 128 * (16 - 4.5) / 512));
  CHECK(preset_plan("hf-quanto-int2", r).bpe() == doctest::Approx(2.5 + 128 * (16 - 2.5) / 512));
}

TEST_CASE("quant.cpp --k-window: the fp32 key window is an extra copy costing W·32/T of the keys") {
  for (int64_t T : {957, 3970}) {
    const Recording rec = test::random_layers({1, 2, 2, T, 64, 3});
    const Plan flat = preset_plan("quantcpp-k2", rec);
    const Plan win = preset_plan("quantcpp-k2-w512", rec);
    REQUIRE(win.check().empty());
    // Keys: 3 bpe (int2 g32) + 512·32/T; values fp16. bpe is over K and V elements.
    const double key_bpe = 3.0 + 512.0 * 32 / static_cast<double>(T);
    CHECK(win.bpe() == doctest::Approx((key_bpe + 16) / 2));
    CHECK(win.bpe() - flat.bpe() == doctest::Approx(512.0 * 32 / static_cast<double>(T) / 2));
    const Plan w128 = preset_plan("quantcpp-k4-w128", rec);
    CHECK(w128.bpe() == doctest::Approx((5.0 + 128.0 * 32 / static_cast<double>(T) + 16) / 2));
  }
  // The window's share of the tokens is the context dependence: 53% at 957, 13% at 3970.
  CHECK(512.0 / 957 == doctest::Approx(0.535).epsilon(0.01));
  CHECK(512.0 / 3970 == doctest::Approx(0.129).epsilon(0.01));
}

TEST_CASE("resolve_strategy_name: a type, a preset, and for neither the closest name or what it is") {
  const NamedStrategy type = resolve_strategy_name("entropy", "--strategy", "--format");
  REQUIRE(type.type != nullptr);
  CHECK(type.type->name == "entropy");
  CHECK(type.preset == nullptr);
  const NamedStrategy preset = resolve_strategy_name("kivi-2", "--strategy", "--format");
  REQUIRE(preset.preset != nullptr);
  CHECK(preset.type->name == preset.preset->type);
  CHECK_THROWS_WITH_AS(resolve_strategy_name("kivi-3", "--strategy", "--format"),
                       doctest::Contains("--strategy: unknown strategy type or preset 'kivi-3' (did you mean 'kivi-2'?)"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(resolve_strategy_name("q4_0", "--strategy", "--format"),
                       doctest::Contains("'q4_0' is a format, not a strategy: give --format q4_0"), ConfigError);
}

TEST_CASE("a preset named where a format belongs: the hint; a format or an unknown name: none") {
  CHECK(preset_not_format_hint("kivi-2", "give --strategy kivi-2") ==
        "; 'kivi-2' is a strategy preset, not a format: give --strategy kivi-2");
  CHECK(preset_not_format_hint("q4_0", "x").empty());
  CHECK(preset_not_format_hint("kivi-9", "x").empty());
  // A type's check says a preset is one (a config's type = "kivi-2").
  CHECK_THROWS_WITH_AS(require_strategy_type("kivi-2", "strategy.type"),
                       doctest::Contains("'kivi-2' is a preset: select it with preset = \"kivi-2\""), ConfigError);
}

TEST_CASE("resolve_strategy_params: defaults, then the preset, then the assignments; unknown and missing ones named") {
  const NamedStrategy kivi = resolve_strategy_name("kivi-2", "--strategy", "--format");
  auto assign = [](const std::string& name, ParamValue v) {
    return ParamAssignment{name, "--param '" + name + "': ", [v](const ParamDef&) { return v; }};
  };
  auto how = [](const std::string& name) { return "--param " + name + "=..."; };
  // The preset's values, over the type's defaults.
  const Params preset = resolve_strategy_params(*kivi.type, kivi.preset, {}, how);
  CHECK(preset.str("key_format") == "int2-asym-ch32");
  CHECK(preset.integer("window") == 128);
  // An assignment overrides the preset's value; a base `format` its key_ and value_format.
  const Params windowed = resolve_strategy_params(*kivi.type, kivi.preset, {assign("window", int64_t{64})}, how);
  CHECK(windowed.integer("window") == 64);
  CHECK(windowed.str("value_format") == "int2-asym-g32");
  const Params formatted =
      resolve_strategy_params(*kivi.type, kivi.preset, {assign("format", std::string("int4-asym-g32"))}, how);
  CHECK(formatted.str("format") == "int4-asym-g32");
  CHECK_FALSE(formatted.has("key_format"));
  // An unknown name: the assignment's place, the closest parameter and the list.
  CHECK_THROWS_WITH_AS(resolve_strategy_params(*kivi.type, kivi.preset, {assign("windw", int64_t{64})}, how),
                       doctest::Contains("--param 'windw': strategy 'uniform' has no parameter 'windw' (did you mean "
                                         "'window'?); parameters: "),
                       ConfigError);
  // A required parameter left unset says how to set it; the value reader's own error passes.
  const StrategyType needy{"needy", "a type with a required parameter", {{"bits", ParamType::Int, "required", std::nullopt}},
                           nullptr, {}};
  CHECK_THROWS_WITH_AS(resolve_strategy_params(needy, nullptr, {}, how),
                       doctest::Contains("strategy 'needy' needs --param bits=..."), ConfigError);
  CHECK(resolve_strategy_params(needy, nullptr, {assign("bits", int64_t{4})}, how).integer("bits") == 4);
  const ParamAssignment unreadable{"window", "", [](const ParamDef&) -> ParamValue {
                                     throw ConfigError("window: not a number");
                                   }};
  CHECK_THROWS_WITH_AS(resolve_strategy_params(*kivi.type, kivi.preset, {unreadable}, how),
                       doctest::Contains("window: not a number"), ConfigError);
}
