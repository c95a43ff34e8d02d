// Phase strategies (sim/strategies/phase.*): the boundary by marker, index or
// fraction, the research ρ per phase, the TAQG bound as written and its variants, and
// each phase's own setting.
#include <cmath>

#include "sim/core/error.h"
#include "sim/metrics/redundancy.h"
#include "sim/strategies/phase.h"
#include "strategy_test_util.h"

using namespace kvb;
using kvb::test::annotation;
using kvb::test::annotation_text;
using kvb::test::build_plan;
using kvb::test::strategy_recording;

TEST_CASE("the phase boundary comes from a marker token, an index or a fraction") {
  const Recording& rec = strategy_recording();  // 96 tokens, marker 257 at token 72
  RecordingStats stats(rec, test::calibration_of(rec));
  auto boundary = [&](const std::map<std::string, ParamValue>& v) {
    std::map<std::string, ParamValue> all = v;
    all["first_format"] = std::string("int4-asym-g32");
    all["second_format"] = std::string("int2-asym-g32");
    return static_cast<int64_t>(annotation(build_plan("phase", all, rec, stats), "phase_boundary"));
  };
  CHECK(boundary({}) == 72);  // default fraction 0.75
  CHECK(boundary({{"phase_fraction", 0.5}}) == 48);
  CHECK(boundary({{"phase_index", int64_t{30}}}) == 30);
  CHECK(boundary({{"phase_marker", int64_t{257}}, {"phase_fraction", 0.5}}) == 72);  // the marker wins
  CHECK_THROWS_WITH_AS(boundary({{"phase_marker", int64_t{999}}}),
                       doctest::Contains("phase_marker 999 does not occur in the recording's 96 token ids"), Error);
  CHECK_THROWS_WITH_AS(boundary({{"phase_index", int64_t{95}}}), doctest::Contains("at least two tokens"), Error);
}

TEST_CASE("each phase gets its own setting, and the plan reports the research rho per phase") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan p = build_plan("phase",
                            {{"first_format", std::string("int4-asym-g32")},
                             {"second_format", std::string("int2-asym-g32")},
                             {"value_second_format", std::string("int8-asym-g32")}},
                            rec, stats);
  REQUIRE(p.check().empty());
  REQUIRE(p.phase_boundary() == 72);
  const auto& k = p.unit(1, 3, Kind::Key).segments;
  REQUIRE(k.size() == 2);
  CHECK(k[0].end == 72);
  CHECK(k[0].format->name() == "int4-asym-g32");
  CHECK(k[1].format->name() == "int2-asym-g32");
  CHECK(p.unit(1, 3, Kind::Value).segments[1].format->name() == "int8-asym-g32");
  // bpe: 72 tokens at 5, 24 at 3 (keys) / 9 (values).
  CHECK(p.bpe() == doctest::Approx((72 * 5.0 * 2 + 24 * 3.0 + 24 * 9.0) / (2 * 96)));
  CHECK(annotation(p, "rho_first") == doctest::Approx(key_rho(rec, 0, 72)));
  CHECK(annotation(p, "rho_second") == doctest::Approx(key_rho(rec, 72, 96)));
  CHECK(annotation(p, "rho_second") > annotation(p, "rho_first"));  // the generator's 0.3 / 0.5
  // Widths of a family, without a budget.
  const Plan w = build_plan(
      "phase", {{"family", std::string("int{b}-sym-g32")}, {"first_bits", int64_t{3}}, {"second_bits", int64_t{6}}},
      rec, stats);
  CHECK(w.unit(0, 0, Kind::Key).segments[0].format->name() == "int3-sym-g32");
  CHECK(w.unit(0, 0, Kind::Key).segments[1].format->name() == "int6-sym-g32");
  // A split at equal budget moves bits from one phase to the other.
  const Plan s = build_plan("phase", {{"budget_bpe", 5.0}, {"family", std::string("int{b}-asym-g32")}, {"split", 2.0}},
                            rec, stats);
  CHECK(annotation(s, "phase_first_bits") > annotation(s, "phase_second_bits"));
  CHECK(annotation(s, "phase_first_bits") - annotation(s, "phase_second_bits") == doctest::Approx(2.0).epsilon(0.3));
}

TEST_CASE("TAQG refuses a phase whose rho is undefined (fewer than 2 nonzero keys)") {
  Recording rec = strategy_recording();
  for (LayerTensors& L : rec.layers)  // tokens 0 and 1: the first phase at phase_index 2
    for (int64_t g = 0; g < rec.kv_heads; ++g)
      std::fill(L.key.slice(g), L.key.slice(g) + 2 * rec.head_dim, 0.0f);
  RecordingStats stats(rec, test::calibration_of(rec));
  CHECK_THROWS_WITH_AS(build_plan("taqg", {{"low_bits", int64_t{4}}, {"family", std::string("int{b}-asym-g32")},
                                           {"phase_index", int64_t{2}}},
                                  rec, stats),
                       doctest::Contains("rho of the first phase is undefined"), Error);
}

TEST_CASE("TAQG: the bound as written, water-filling and reversed, at the research's rho") {
  const PhaseRho research{0.463, 0.544};  // think, answer (R1-Distill-1.5B)
  const TaqgPrediction as_written = taqg_predict(research, TaqgRule::AsWritten);
  CHECK(as_written.redundant_phase == 1);
  // floor(log2(0.537 / 0.456 + 1)) = floor(log2(2.178)) = 1: the answer phase gets 1 bit less.
  CHECK(as_written.reduction == 1.0);
  CHECK(as_written.split() == 1.0);
  // The +1 inside the log makes even equal redundancy cost one bit.
  CHECK(taqg_predict(PhaseRho{0.5, 0.5}, TaqgRule::AsWritten).reduction == 1.0);
  const TaqgPrediction wf = taqg_predict(research, TaqgRule::WaterFilling);
  CHECK(wf.reduction == doctest::Approx(0.5 * std::log2(0.537 / 0.456)));
  CHECK(taqg_predict(PhaseRho{0.5, 0.5}, TaqgRule::WaterFilling).reduction == 0.0);
  CHECK(taqg_predict(research, TaqgRule::Reversed).split() == -1.0);
  CHECK(taqg_predict(PhaseRho{0.7, 0.2}, TaqgRule::AsWritten).split() < 0);  // the first phase is the redundant one

  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  // As published: b_L = 4 for the less redundant (first) phase, the bound's width for the other.
  const Plan fixed =
      build_plan("taqg", {{"low_bits", int64_t{4}}, {"family", std::string("int{b}-asym-g32")}}, rec, stats);
  const double k = annotation(fixed, "taqg_reduction_bits");
  CHECK(annotation_text(fixed, "taqg_redundant_phase") == "second");
  CHECK(annotation(fixed, "taqg_first_bits") == 4);
  CHECK(annotation(fixed, "taqg_second_bits") == std::max(1.0, 4 - k));
  CHECK(fixed.unit(0, 0, Kind::Key).segments[1].format->name() ==
        "int" + std::to_string(static_cast<int>(std::max(1.0, 4 - k))) + "-asym-g32");
  // At equal budget: the predicted split.
  const Plan eq = build_plan("taqg", {{"budget_bpe", 4.5}, {"family", std::string("int{b}-asym-g32")}}, rec, stats);
  CHECK(annotation(eq, "taqg_split_bits") == annotation(eq, "split_bits"));
  CHECK(eq.bpe() <= 4.5);
}

TEST_CASE("phase and taqg name the rho ranges their plans read; RecordingStats::key_rho is key_rho bit for bit") {
  const Recording& rec = strategy_recording();  // 2 layers, 96 tokens, marker 257 at token 72
  auto ranges_of = [&](const std::string& type, const std::map<std::string, ParamValue>& values) {
    return require_strategy_type(type, "test").make(test::params_of(type, values))->key_rho_ranges(rec);
  };
  const std::map<std::string, ParamValue> taqg = {{"low_bits", int64_t{4}},
                                                  {"family", std::string("int{b}-asym-g32")},
                                                  {"phase_marker", int64_t{257}},
                                                  {"rho_layers", IntList{1, 0, 1}}};
  const std::vector<KeyRhoRange> ranges = ranges_of("taqg", taqg);
  REQUIRE(ranges.size() == 2);
  CHECK(ranges[0] == KeyRhoRange{0, 72, {1, 0, 1}});
  CHECK(ranges[1] == KeyRhoRange{72, 96, {1, 0, 1}});
  CHECK(ranges_of("phase", {{"first_format", std::string("int4-asym-g32")},
                            {"second_format", std::string("int2-asym-g32")},
                            {"phase_fraction", 0.5}}) ==
        std::vector<KeyRhoRange>{{0, 48, {}}, {48, 96, {}}});
  // Where the plan would throw, no range: the plan throws the same error later.
  CHECK(ranges_of("taqg", {{"low_bits", int64_t{4}},
                           {"family", std::string("int{b}-asym-g32")},
                           {"phase_marker", int64_t{999}}})
            .empty());
  CHECK(ranges_of("taqg", {{"low_bits", int64_t{4}},
                           {"family", std::string("int{b}-asym-g32")},
                           {"rho_layers", IntList{2}}})
            .empty());
  CHECK(ranges_of("uniform", {{"format", std::string("int4-asym-g32")}}).empty());
  CHECK(require_strategy_type("phase", "test").plan_reads == PlanReads::KeyRho);
  CHECK(require_strategy_type("taqg", "test").plan_reads == PlanReads::KeyRho);
  CHECK(require_strategy_type("optimal", "test").plan_reads == PlanReads::Tensors);

  // Held: the same bits as key_rho, and as the plan's annotation.
  RecordingStats held(rec, test::calibration_of(rec));
  for (const KeyRhoRange& r : ranges) CHECK(held.key_rho(r) == key_rho(rec, r.t0, r.t1, r.layers));
  CHECK(annotation(build_plan("taqg", taqg, rec, held), "rho_first") == key_rho(rec, 0, 72, {1, 0, 1}));

  // One layer's keys at a time, as a streamed recording's first pass holds them.
  Recording skeleton = rec;
  for (LayerTensors& L : skeleton.layers) L = LayerTensors{};
  RecordingStats streamed(skeleton, test::calibration_of(rec));
  const std::vector<KeyRhoRange> with_bad = {ranges[0], ranges[1], KeyRhoRange{0, 72, {5}}, KeyRhoRange{95, 96, {}}};
  for (int64_t l = 0; l < rec.num_layers(); ++l) {
    skeleton.layers[static_cast<size_t>(l)] = rec.layers[static_cast<size_t>(l)];
    streamed.add_key_rho_layer(l, with_bad);  // the bad ranges are skipped
    skeleton.layers[static_cast<size_t>(l)] = LayerTensors{};
  }
  for (const KeyRhoRange& r : ranges) CHECK(streamed.key_rho(r) == key_rho(rec, r.t0, r.t1, r.layers));
  CHECK(streamed.key_rho(KeyRhoRange{0, 72, {}}) == key_rho(rec, 0, 72));  // layers 0 and 1 over [0, 72): added
  // The bad ranges throw key_rho's errors; a range not added says so.
  CHECK_THROWS_WITH_AS(streamed.key_rho(with_bad[2]), doctest::Contains("layer index 5 outside [0, 2)"), Error);
  CHECK_THROWS_WITH_AS(streamed.key_rho(with_bad[3]), doctest::Contains("must hold at least two"), Error);
  CHECK_THROWS_WITH_AS(streamed.key_rho(KeyRhoRange{0, 50, {0}}),
                       doctest::Contains("internal: key rho of layer 0 over tokens [0, 50) was not computed"), Error);
}
