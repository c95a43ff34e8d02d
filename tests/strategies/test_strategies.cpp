// Strategies (sim/strategies/): every budgeted type and their compositions meet the
// budget exactly across a sweep of budgets, impossible budgets are clear errors, the
// rounding and repair edge cases, protections, phase boundaries, the TAQG bound, and
// the optimal allocator against uniform and entropy at equal memory.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/metrics/redundancy.h"
#include "sim/simulator.h"
#include "sim/strategies/budget.h"
#include "sim/strategies/optimal.h"
#include "sim/strategies/phase.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/protections.h"
#include "strategy_test_util.h"

using namespace kvb;
using kvb::test::annotation;
using kvb::test::build_plan;
using kvb::test::strategy_recording;

namespace {

using Values = std::map<std::string, ParamValue>;

const std::string kFamily = "int{b}-asym-g32";  // b + 1 bpe at head_dim 32

// The budget contract of one budget group: achieved <= budget and the slack is less
// than the smallest upgrade that is still possible (checked independently of the
// strategy's own annotations where it can be).
void check_budget(const Plan& plan, double budget_bpe, const std::string& what) {
  INFO(what << " budget " << budget_bpe << " plan " << plan.describe());
  REQUIRE(plan.check().empty());
  const double achieved = plan.bpe();
  CHECK(achieved <= budget_bpe + 1e-12);
  const double slack = annotation(plan, "budget_slack_bpe");
  CHECK(slack == doctest::Approx(budget_bpe - achieved).epsilon(1e-9));
  CHECK(slack >= 0);
  const double step = annotation(plan, "budget_step_bpe");
  if (!std::isnan(step)) CHECK(slack < step);
  CHECK(annotation(plan, "budget_bpe") == budget_bpe);
}

// Smallest width upgrade of any allocated unit, recomputed from the plan itself (the
// allocation units are whole (layer, head, kind) units here, no phases).
double smallest_upgrade_bpe(const Plan& plan, const std::vector<int64_t>& widths) {
  uint64_t step = std::numeric_limits<uint64_t>::max();
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = plan.unit(l, g, kind);
        uint64_t now = 0, up = 0;
        bool any = false;
        for (const Segment& s : u.segments) {
          if (s.role != SegmentRole::Allocated) continue;
          const int64_t w = static_cast<int64_t>(s.format->nominal_bits());
          const auto it = std::upper_bound(widths.begin(), widths.end(), w);
          if (it == widths.end()) {
            any = false;
            break;
          }
          now += plan.segment_bits(u, s.begin, s.end, *s.format, plan.tokens());
          up += plan.segment_bits(u, s.begin, s.end, *make_format(family_format_name(kFamily, *it)), plan.tokens());
          any = true;
        }
        if (any) step = std::min(step, up - now);
      }
  return step == std::numeric_limits<uint64_t>::max()
             ? std::nan("")
             : static_cast<double>(step) /
                   static_cast<double>(2 * plan.layers() * plan.kv_heads() * plan.head_dim() * plan.tokens());
}

const Segment& plan_first_segment(const Plan& plan, int64_t l, int64_t g, Kind kind) {
  return plan.unit(l, g, kind).segments.front();
}

std::string error_of(const std::string& type, const Values& v, RecordingStats& stats) {
  try {
    (void)build_plan(type, v, strategy_recording(), stats);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every budgeted strategy meets its budget exactly across a sweep of budgets") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const std::vector<double> budgets = {3.0, 3.2, 3.5, 4.0, 4.37, 5.0, 5.9, 6.6, 8.1};
  const std::vector<std::pair<std::string, Values>> types = {
      {"uniform", {}},
      {"entropy", {{"alpha", 0.5}}},
      {"entropy", {{"alpha", 1.5}, {"entropy", std::string("shannon")}, {"gqa", std::string("min")}}},
      {"phase", {{"split", 1.0}}},
      {"phase", {{"split", -2.0}, {"phase_marker", int64_t{257}}}},
      {"taqg", {}},
      {"taqg", {{"rule", std::string("water-filling")}}},
      {"optimal", {}},
      {"optimal", {{"objective", std::string("attn_out_rel_fro")}}},
  };
  // Table-driven: every budgeted type of the strategy table must be in the list above
  // (a new type fails here until it is), and its plans add only its declared columns.
  for (const StrategyType& t : strategy_types()) {
    const bool budgeted = std::find(t.params.begin(), t.params.end(), budget_params().front()) != t.params.end();
    const bool listed =
        std::any_of(types.begin(), types.end(), [&](const auto& entry) { return entry.first == t.name; });
    CHECK_MESSAGE((!budgeted || listed), "strategy type '" << t.name << "' takes a budget but is not tested here");
  }
  for (const auto& [type, extra] : types)
    for (double b : budgets) {
      Values v = extra;
      v["budget_bpe"] = b;
      v["family"] = kFamily;
      std::vector<std::string> warnings;
      const Plan plan = build_plan(type, v, rec, stats, 0, &warnings);
      check_budget(plan, b, type);
      CHECK_NOTHROW(require_declared_columns(plan, type));
      if (type != "phase" && type != "taqg") {
        // No single width upgrade would still fit, except where optimal finds none that
        // lowers its objective (values under attn_kl_mean): it then says so.
        const double step = smallest_upgrade_bpe(plan, {2, 3, 4, 5, 6, 8});
        const bool within_step = std::isnan(step) || b - plan.bpe() < step;
        INFO(type << " at " << b << ": " << plan.describe() << ", bpe " << plan.bpe());
        CHECK((within_step || (type == "optimal" && warnings.size() == 1)));
      }
      if (type != "optimal") CHECK(warnings.empty());
    }
}

TEST_CASE("compositions meet the budget: sink heads, sink tokens, windows, prompt, then any allocator") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const std::vector<Values> protections = {
      {{"sink_heads", int64_t{1}}},
      {{"sink_heads", int64_t{2}}, {"sink_tokens", int64_t{2}}},
      {{"sink_tokens", int64_t{3}}, {"sink_token_select", std::string("attention")}},
      {{"sink_tokens", int64_t{2}},
       {"sink_token_select", std::string("attention")},
       {"sink_token_scope", std::string("head")}},
      {{"window", int64_t{16}}},
      {{"window", int64_t{16}}, {"window_mode", std::string("chunked")}, {"prompt", int64_t{24}}},
      {{"key_window", int64_t{20}}, {"key_window_format", std::string("keep-fp32")}, {"key_window_extra_copy", true}},
      {{"sink_head_threshold", 1.0}, {"sink_tokens", int64_t{1}}, {"window", int64_t{8}}},
      {{"value_sink_heads", int64_t{2}}, {"key_sink_tokens", int64_t{4}}, {"value_window", int64_t{12}}},
  };
  for (const std::string type : {"uniform", "entropy", "phase", "optimal"})
    for (const Values& prot : protections)
      for (double b : {6.5, 7.25}) {  // 2 fp16 sink heads of 8 already cost 4 bpe
        Values v = prot;
        v["budget_bpe"] = b;
        v["family"] = kFamily;
        if (type == "phase") v["split"] = 1.0;
        const Plan plan = build_plan(type, v, rec, stats);
        check_budget(plan, b, type + " with protections");
      }
}

TEST_CASE("separate key and value budgets are each met, and so is a budget at a target context") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  for (const std::string type : {"uniform", "entropy", "optimal"}) {
    std::vector<std::string> warnings;
    const Plan plan = build_plan(type,
                                 {{"key_budget_bpe", 5.5},
                                  {"value_budget_bpe", 5.0},
                                  {"family", kFamily},
                                  {"value_family", std::string("int{b}-sym-g32")},
                                  {"sink_heads", int64_t{1}}},
                                 rec, stats, 0, &warnings);
    REQUIRE(plan.check().empty());
    // Bits per K element and per V element, each within one step of its budget.
    uint64_t kbits = 0, vbits = 0;
    for (int64_t l = 0; l < plan.layers(); ++l)
      for (int64_t g = 0; g < plan.kv_heads(); ++g) {
        for (const Segment& s : plan.unit(l, g, Kind::Key).segments)
          kbits += plan.segment_bits(plan.unit(l, g, Kind::Key), s.begin, s.end, *s.format, rec.tokens);
        for (const Segment& s : plan.unit(l, g, Kind::Value).segments) {
          vbits += plan.segment_bits(plan.unit(l, g, Kind::Value), s.begin, s.end, *s.format, rec.tokens);
          if (s.role == SegmentRole::Allocated) CHECK(s.format->name().find("-sym-") != std::string::npos);
        }
      }
    const double per_kind = static_cast<double>(rec.num_layers() * rec.kv_heads * rec.head_dim * rec.tokens);
    CHECK(static_cast<double>(kbits) / per_kind <= 5.5);
    CHECK(static_cast<double>(vbits) / per_kind <= 5.0);
    CHECK(annotation(plan, "key_budget_slack_bpe") < annotation(plan, "key_budget_step_bpe"));
    if (type == "optimal") {  // value widths do not change its attn_kl_mean: their budget stays unspent, with a warning
      REQUIRE(warnings.size() == 1);
      CHECK(warnings[0].find("value_budget_bpe 5 is not spent") != std::string::npos);
    } else {
      CHECK(annotation(plan, "value_budget_slack_bpe") < annotation(plan, "value_budget_step_bpe"));
    }
    CHECK(annotation(plan, "key_budget_slack_bpe") == doctest::Approx(5.5 - static_cast<double>(kbits) / per_kind));
  }
  // One kind budgeted, the other fixed: keys allocated at 3.5 bpe, values kept in fp16.
  for (const std::string type : {"uniform", "entropy", "optimal", "phase"}) {
    const Plan plan = build_plan(
        type, {{"key_budget_bpe", 3.5}, {"family", kFamily}, {"value_format", std::string("keep-fp16")}}, rec, stats);
    REQUIRE(plan.check().empty());
    CHECK(plan.bpe() <= (3.5 + 16) / 2);
    CHECK(annotation(plan, "key_budget_slack_bpe") < annotation(plan, "key_budget_step_bpe"));
    CHECK(plan.unit(1, 1, Kind::Value).segments.back().format->name() == "keep-fp16");
  }
  // A sliding window weighs less at 32K tokens than at 96: the budget holds there.
  const Plan plan = build_plan(
      "uniform",
      {{"budget_bpe", 3.5}, {"family", kFamily}, {"window", int64_t{32}}, {"budget_context", int64_t{32768}}}, rec,
      stats);
  CHECK(plan.bpe_at(32768) <= 3.5);
  CHECK(3.5 - plan.bpe_at(32768) < annotation(plan, "budget_step_bpe"));
  CHECK(plan.bpe() > 3.5);  // at the recorded 96 tokens the 32-token window dominates
}

TEST_CASE("a plan's make-up across contexts and the context it was sized for (methods.md §1, extrapolated)") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  // One format per unit without a window: the same make-up (and bpe) at any context.
  const std::vector<Values> alike = {
      {{"format", std::string("int4-asym-g32")}},
      {{"key_format", std::string("int2-asym-g64")}, {"value_format", std::string("int3-asym-g32")}},
      {{"budget_bpe", 3.5}, {"family", kFamily}},
      {{"budget_bpe", 7.25}, {"family", kFamily}, {"sink_heads", int64_t{1}}},
  };
  for (const Values& v : alike) {
    const Plan plan = build_plan("uniform", v, rec, stats);
    CHECK(plan.stores_tokens_alike());
    CHECK(!plan.sized_for_context());
    CHECK(plan.bpe_at(32768) == doctest::Approx(plan.bpe()).epsilon(1e-12));
  }
  // Windows, sink tokens, phases and the open group of groups along tokens keep their
  // token counts as the rest grows.
  const std::vector<Values> fixed_counts = {
      {{"format", std::string("int4-asym-g32")}, {"window", int64_t{16}}},
      {{"budget_bpe", 6.5}, {"family", kFamily}, {"sink_tokens", int64_t{2}}},
      {{"key_format", std::string("int2-asym-ch32")}, {"value_format", std::string("int3-asym-g32")}},
  };
  for (const Values& v : fixed_counts) {
    const Plan plan = build_plan("uniform", v, rec, stats);
    CHECK(!plan.stores_tokens_alike());
    CHECK(plan.bpe_at(32768) < plan.bpe());
  }
  const Values two_phases = {{"first_format", std::string("int4-asym-g32")},
                             {"second_format", std::string("int2-asym-g32")}};
  CHECK(!build_plan("phase", two_phases, rec, stats).stores_tokens_alike());
  // A budget met at another context records it; met at the recording's, nothing.
  const Values sized = {
      {"budget_bpe", 3.5}, {"family", kFamily}, {"window", int64_t{32}}, {"budget_context", int64_t{32768}}};
  CHECK(build_plan("uniform", sized, rec, stats).sized_for_context() == std::optional<int64_t>(32768));
  CHECK(!build_plan("entropy", {{"budget_bpe", 3.5}, {"family", kFamily}}, rec, stats).sized_for_context());
}

TEST_CASE("a budget below the cheapest or above the dearest allocation is a clear error") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  for (const std::string type : {"uniform", "entropy", "phase", "taqg", "optimal"}) {
    std::string err = error_of(type, {{"budget_bpe", 2.5}, {"family", kFamily}}, stats);
    CHECK(err.find("budget_bpe 2.5 is below the cheapest allocation, 3 bpe") != std::string::npos);
    err = error_of(type, {{"budget_bpe", 3.2}, {"family", kFamily}, {"sink_heads", int64_t{2}}}, stats);
    CHECK(err.find("budget_bpe 3.2 is below the cheapest allocation") != std::string::npos);
    CHECK(err.find("protections and fixed cells") != std::string::npos);
    err = error_of(type, {{"budget_bpe", 9.5}, {"family", kFamily}}, stats);
    CHECK(err.find("budget_bpe 9.5 exceeds the dearest allocation, 9 bpe") != std::string::npos);
  }
  // A single width: only its exact cost is a feasible budget.
  CHECK(error_of("uniform", {{"budget_bpe", 5.0}, {"family", kFamily}, {"widths", IntList{4}}}, stats).empty());
  CHECK(error_of("uniform", {{"budget_bpe", 5.5}, {"family", kFamily}, {"widths", IntList{4}}}, stats)
            .find("exceeds the dearest allocation, 5 bpe") != std::string::npos);
  CHECK(error_of("uniform", {{"key_budget_bpe", 2.0}, {"value_budget_bpe", 4.0}, {"family", kFamily}}, stats)
            .find("key_budget_bpe 2 is below the cheapest allocation, 3 bpe") != std::string::npos);
}

TEST_CASE("configuration errors name the parameter") {
  auto make_error = [](const std::string& type, const Values& v) -> std::string {
    try {
      (void)require_strategy_type(type, "test").make(test::params_of(type, v));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(make_error("uniform", {{"budget_bpe", 4.0}, {"family", std::string("int4-asym-g32")}})
            .find("has no {b} placeholder") != std::string::npos);
  CHECK(make_error("uniform", {{"format", std::string("int{b}-asym-g32")}}).find("contains {b}") != std::string::npos);
  CHECK(make_error("uniform", {{"budget_bpe", 4.0}}).find("needs a format family") != std::string::npos);
  CHECK(make_error("uniform", {{"budget_bpe", 4.0}, {"family", kFamily}, {"format", std::string("int4-asym-g32")}})
            .find("not both") != std::string::npos);
  CHECK(make_error("uniform", {{"budget_bpe", 4.0}, {"family", kFamily}, {"min_bits", 7.0}, {"max_bits", 7.5}})
            .find("no width of [2,3,4,5,6,8] lies within [min_bits, max_bits]") != std::string::npos);
  CHECK(make_error("uniform", {{"budget_bpe", 4.0}, {"family", std::string("int{b}-asym-g48")}, {"widths", IntList{9}}})
            .find("bits must be 1..8") != std::string::npos);
  CHECK(make_error("uniform", {{"value_budget_bpe", 4.0}, {"family", kFamily}}).find("or a fixed key_format") !=
        std::string::npos);
  CHECK(make_error("entropy", {{"family", kFamily}}).find("entropy needs budget_bpe") != std::string::npos);
  CHECK(make_error("optimal", {{"family", kFamily}}).find("optimal needs budget_bpe") != std::string::npos);
  CHECK(make_error("phase", {{"first_format", std::string("int4-asym-g32")}}).find("second_format") !=
        std::string::npos);
  CHECK(make_error("phase", {{"split", 1.0},
                             {"first_format", std::string("int4-asym-g32")},
                             {"second_format", std::string("int3-asym-g32")}})
            .find("`split` needs budget_bpe") != std::string::npos);
  // Parameters of another mode are refused, not ignored.
  const std::string int4 = "int4-asym-g32";
  CHECK(make_error("phase", {{"budget_bpe", 4.0}, {"family", kFamily}, {"first_bits", int64_t{3}}})
            .find("phase: `first_bits` is not used with budget_bpe") != std::string::npos);
  CHECK(make_error("phase", {{"first_format", int4}, {"second_format", int4}, {"key_first_bits", int64_t{3}}})
            .find("phase: `key_first_bits` is not used with first_format/second_format") != std::string::npos);
  CHECK(make_error("phase", {{"first_bits", int64_t{3}}, {"second_bits", int64_t{4}}, {"family", kFamily},
                             {"format", int4}})
            .find("phase: `format` is not used without budget_bpe") != std::string::npos);
  CHECK(make_error("taqg", {{"low_bits", int64_t{4}}, {"family", kFamily}, {"value_format", int4}})
            .find("taqg: `value_format` is not used without budget_bpe") != std::string::npos);
  CHECK(make_error("taqg", {{"budget_bpe", 4.0}, {"family", kFamily}, {"low_bits", int64_t{4}}})
            .find("taqg: `low_bits` is not used with budget_bpe") != std::string::npos);
  CHECK(make_error("entropy", {{"mean_bits", 4.0}, {"family", kFamily}, {"format", int4}})
            .find("entropy: `format` is not used with mean_bits") != std::string::npos);
  {
    RecordingStats st(strategy_recording(), test::calibration_of(strategy_recording()));
    const std::string short_context = error_of(
        "phase", {{"budget_bpe", 4.5}, {"family", kFamily}, {"budget_context", int64_t{16}}}, st);
    CHECK(short_context.find("budget_context: 16 tokens is shorter than the recording's") != std::string::npos);
    const std::string all_prompt = error_of(
        "uniform", {{"budget_bpe", 4.5}, {"family", kFamily}, {"prompt_fraction", 0.9999}}, st);
    CHECK(all_prompt.find("prompt_fraction: 0.9999 of the recording's") != std::string::npos);
  }
  CHECK(make_error("uniform", {{"format", int4}, {"budget_context", int64_t{1024}}})
            .find("uniform: `budget_context` is not used without budget_bpe") != std::string::npos);
  CHECK(make_error("uniform", {{"format", int4}, {"max_bits", 4.0}})
            .find("uniform: `max_bits` is not used without budget_bpe") != std::string::npos);
  CHECK(make_error("uniform",
                   {{"format", std::string("int4-asym-g32")}, {"sink_heads", int64_t{2}}, {"sink_head_threshold", 1.0}})
            .find("not both") != std::string::npos);
  CHECK(make_error("uniform", {{"format", std::string("int4-asym-g32")},
                               {"value_sink_heads", int64_t{2}},
                               {"value_sink_head_threshold", 1.0}})
            .find("value_sink_heads and value_sink_head_threshold: give a count or a threshold, not both") !=
        std::string::npos);
  // A kind's own form wins over the generic alternative, as over the generic form of itself.
  const auto protections_of = [](const Values& v) {
    return Protections::from_params(test::params_of("uniform", v));
  };
  const Protections value_count = protections_of(
      {{"format", int4}, {"sink_head_threshold", 1.5}, {"value_sink_heads", int64_t{2}}});
  CHECK(*value_count.kind(Kind::Key).sink_head_threshold == 1.5);
  CHECK(value_count.kind(Kind::Key).sink_heads == 0);
  CHECK(value_count.kind(Kind::Value).sink_heads == 2);
  CHECK(!value_count.kind(Kind::Value).sink_head_threshold);
  const Protections key_threshold =
      protections_of({{"format", int4}, {"sink_heads", int64_t{3}}, {"key_sink_head_threshold", 0.5}});
  CHECK(*key_threshold.kind(Kind::Key).sink_head_threshold == 0.5);
  CHECK(key_threshold.kind(Kind::Key).sink_heads == 0);
  CHECK(key_threshold.kind(Kind::Value).sink_heads == 3);
  CHECK(!key_threshold.kind(Kind::Value).sink_head_threshold);
  CHECK(make_error("uniform", {{"format", std::string("int4-asym-g32")}, {"window_mode", std::string("rolling")}})
            .find("window_mode: must be \"sliding\" or \"chunked\"") != std::string::npos);
  CHECK(make_error("taqg", {{"rule", std::string("sound")}, {"budget_bpe", 4.0}, {"family", kFamily}})
            .find("rule: must be") != std::string::npos);
  CHECK(make_error("uniform", {{"format", std::string("int4-asym-g32")}, {"entropy", std::string("renyi3")}})
            .find("entropy must be \"shannon\" or \"renyi2\"") != std::string::npos);
}

TEST_CASE("width rounding: nearest width, ties to the lower one, clamped to the allowed range") {
  WidthFamily f;
  f.pattern = kFamily;
  f.widths = {2, 3, 4, 6, 8};
  CHECK(f.widths[f.nearest(2.49)] == 2);
  CHECK(f.widths[f.nearest(2.5)] == 2);  // tie
  CHECK(f.widths[f.nearest(2.51)] == 3);
  CHECK(f.widths[f.nearest(5.0)] == 4);  // tie between 4 and 6
  CHECK(f.widths[f.nearest(5.01)] == 6);
  CHECK(f.widths[f.nearest(7.0)] == 6);
  CHECK(f.widths[f.nearest(-3.0)] == 2);
  CHECK(f.widths[f.nearest(40.0)] == 8);
  const Params p = test::params_of("uniform", {{"budget_bpe", 4.0},
                                               {"family", kFamily},
                                               {"widths", IntList{8, 2, 4, 4, 3}},
                                               {"max_bits", 4.0},
                                               {"key_min_bits", 3.0}});
  const WidthFamily k = WidthFamily::from_params(p, Kind::Key), v = WidthFamily::from_params(p, Kind::Value);
  CHECK(k.widths == std::vector<int64_t>{3, 4});
  CHECK(v.widths == std::vector<int64_t>{2, 3, 4});
  CHECK(v.formats[1]->name() == "int3-asym-g32");
}

TEST_CASE("budget repair: downgrades the lowest priority when over, then fills by priority until nothing fits") {
  BudgetProblem prob;
  prob.cost = {{10, 20, 30}, {10, 20, 30}, {10, 15, 40}};
  prob.budget = 60;
  std::vector<size_t> choice = {2, 2, 2};            // 100 bits: over
  const std::vector<double> want = {1.0, 5.0, 3.0};  // unit 1 most deserving
  repair_budget(
      prob, choice, [&](size_t u, size_t) { return want[u]; }, spread_ranks(3));
  CHECK(prob.total(choice) <= 60);
  // Downgrades take unit 0 (lowest priority) first, then unit 2: {0, 2, 0} costs 50,
  // and the fill adds unit 2's cheap 5-bit step: {0, 2, 1} = 55; no other step fits.
  CHECK(choice == std::vector<size_t>{0, 2, 1});
  for (size_t u = 0; u < 3; ++u)
    if (choice[u] + 1 < 3) CHECK(prob.total(choice) + prob.cost[u][choice[u] + 1] - prob.cost[u][choice[u]] > 60);
  // Equal priorities: ties are spread, not given to the first units.
  BudgetProblem flat;
  flat.cost.assign(8, {1, 2});
  flat.budget = 12;
  std::vector<size_t> c(8, 0);
  repair_budget(
      flat, c, [](size_t, size_t) { return 0.0; }, spread_ranks(8));
  CHECK(c == std::vector<size_t>{1, 0, 1, 0, 0, 1, 0, 1});  // golden-ratio order 0, 5, 2, 7, ...
  // ... and every stride gets its share: even and odd units (e.g. two phases) alike.
  BudgetProblem many;
  many.cost.assign(64, {1, 2});
  many.budget = 64 + 32;
  std::vector<size_t> m(64, 0);
  repair_budget(
      many, m, [](size_t, size_t) { return 0.0; }, spread_ranks(64));
  size_t even = 0, low_quarter = 0;
  for (size_t u = 0; u < 64; ++u) {
    even += (u % 2 == 0) ? m[u] : 0;
    low_quarter += (u % 4 == 0) ? m[u] : 0;
  }
  CHECK(even >= 14);
  CHECK(even <= 18);
  CHECK(low_quarter >= 6);
  CHECK(low_quarter <= 10);
  // Target bits: offsets +1 / -1 around b̄ with widths 2..6 and a budget for 4 on average.
  WidthFamily f;
  f.widths = {2, 3, 4, 5, 6};
  BudgetProblem t;
  t.cost = {{2, 3, 4, 5, 6}, {2, 3, 4, 5, 6}};
  t.budget = 8;
  double mean = 0;
  const std::vector<size_t> tc = solve_target_bits(t, {1.0, -1.0}, {&f, &f}, &mean);
  CHECK(f.widths[tc[0]] == 5);
  CHECK(f.widths[tc[1]] == 3);
  CHECK(mean >= 4.0);  // the largest b̄ whose rounding fits: anything below 4.5 rounds to 5 / 3
  CHECK(mean <= 4.5);
}

TEST_CASE("entropy: hand-computed distributions, GQA aggregation, allocation follows entropy") {
  // Shannon and Rényi-2 of known distributions, in bits.
  const double p1[] = {0.5, 0.25, 0.25};
  CHECK(shannon_entropy_bits(p1, 3) == doctest::Approx(1.5));
  CHECK(renyi2_entropy_bits(p1, 3) == doctest::Approx(-std::log2(0.375)));
  const double p2[] = {0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125};
  CHECK(shannon_entropy_bits(p2, 8) == doctest::Approx(3.0));
  CHECK(renyi2_entropy_bits(p2, 8) == doctest::Approx(3.0));
  const double p3[] = {1.0, 0.0};
  CHECK(shannon_entropy_bits(p3, 2) == 0.0);
  CHECK(renyi2_entropy_bits(p3, 2) == 0.0);

  // A recording whose attention is known in closed form: d = 1, keys 0 except key 1
  // (score a / √1 for query head 0, 0 for query head 1, whose query is 0), so head 1
  // is uniform over the causal prefix and head 0 puts e^a / (e^a + t) on key 1.
  Recording r;
  r.name = "hand";
  r.q_heads = 2;
  r.kv_heads = 1;
  r.head_dim = 1;
  r.tokens = 4;
  LayerTensors L;
  L.query = Tensor({2, 4, 1});
  L.key = Tensor({1, 4, 1});
  L.value = Tensor({1, 4, 1});
  const double a = 2.0;
  for (int64_t t = 0; t < 4; ++t) L.query.slice(0)[t] = static_cast<float>(a);
  L.key.slice(0)[1] = 1.0f;
  r.layers = {L};
  r.layer_ids = {0};
  r.validate();
  RecordingStats stats(r, {2, 3});
  double sh0 = 0, re0 = 0, sh1 = 0, re1 = 0;
  for (int t : {2, 3}) {
    const double z = std::exp(a) + t;  // t keys at score 0, one at a
    std::vector<double> p(static_cast<size_t>(t + 1), 1.0 / z);
    p[1] = std::exp(a) / z;
    sh0 += shannon_entropy_bits(p.data(), t + 1) / 2;
    re0 += renyi2_entropy_bits(p.data(), t + 1) / 2;
    sh1 += std::log2(t + 1.0) / 2;
    re1 += std::log2(t + 1.0) / 2;
  }
  const auto& e = stats.head_entropies();
  CHECK(e[0][0].mean.shannon == doctest::Approx(sh0).epsilon(1e-6));
  CHECK(e[0][0].mean.renyi2 == doctest::Approx(re0).epsilon(1e-6));
  CHECK(e[0][1].mean.shannon == doctest::Approx(sh1).epsilon(1e-6));
  CHECK(e[0][1].mean.renyi2 == doctest::Approx(re1).epsilon(1e-6));
  // Effective entropy: −log₂ of the mean of 2^(−H(t)); head 1 at t = 2, 3 is uniform.
  CHECK(e[0][1].effective.renyi2 == doctest::Approx(-std::log2((1.0 / 3 + 1.0 / 4) / 2)).epsilon(1e-6));
  CHECK(e[0][1].effective.renyi2 < e[0][1].mean.renyi2);  // Jensen: low-entropy queries weigh more
  CHECK(stats.kv_head_entropy(0, 0, EntropyKind::Renyi2, GqaAggregate::Max, EntropyAverage::Effective) ==
        doctest::Approx(e[0][1].effective.renyi2));
  CHECK(stats.kv_head_entropy(0, 0, EntropyKind::Shannon, GqaAggregate::Mean) == doctest::Approx((sh0 + sh1) / 2));
  CHECK(stats.kv_head_entropy(0, 0, EntropyKind::Renyi2, GqaAggregate::Min) == doctest::Approx(re0));
  CHECK(stats.kv_head_entropy(0, 0, EntropyKind::Renyi2, GqaAggregate::Max) == doctest::Approx(re1));
  // Received attention: summed over both query heads and both calibration queries.
  const auto& recv = stats.received_attention()[0][0];
  double total = 0;
  for (double x : recv) total += x;
  CHECK(total == doctest::Approx(4.0));  // 2 heads x 2 queries, each row sums to 1
  CHECK(recv[1] == doctest::Approx(std::exp(a) / (std::exp(a) + 2) + std::exp(a) / (std::exp(a) + 3) + 1.0 / 3 + 0.25));

  // On the synthetic recording: lower-entropy heads never get fewer bits.
  const Recording& rec = strategy_recording();
  RecordingStats s2(rec, test::calibration_of(rec));
  const Plan plan = build_plan("entropy", {{"budget_bpe", 4.5}, {"family", kFamily}, {"alpha", 1.0}}, rec, s2);
  for (Kind kind : {Kind::Key, Kind::Value}) {
    std::vector<std::pair<double, double>> hb;  // (entropy, bits)
    for (int64_t l = 0; l < rec.num_layers(); ++l)
      for (int64_t g = 0; g < rec.kv_heads; ++g)
        hb.emplace_back(s2.kv_head_entropy(l, g, EntropyKind::Renyi2, GqaAggregate::Mean),
                        plan.unit(l, g, kind).segments.front().format->nominal_bits());
    std::sort(hb.begin(), hb.end());
    for (size_t i = 1; i < hb.size(); ++i) CHECK(hb[i].second <= hb[i - 1].second + 1.0);  // repair moves one step
    CHECK(hb.front().second > hb.back().second);
  }
  // Research mode: b̄ given, rounded without a repair.
  const Plan research = build_plan("entropy", {{"mean_bits", 4.0}, {"family", kFamily}, {"alpha", 0.0}}, rec, s2);
  CHECK(research.bpe() == doctest::Approx(5.0));
}

TEST_CASE("protections: sink heads by count and threshold, sink tokens by position and attention, windows") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan two =
      build_plan("uniform", {{"format", std::string("int4-asym-g32")}, {"sink_heads", int64_t{2}}}, rec, stats);
  // The two lowest-entropy KV heads are kept whole.
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < rec.kv_heads; ++g)
      ranked.emplace_back(stats.kv_head_entropy(l, g, EntropyKind::Renyi2, GqaAggregate::Mean), l * rec.kv_heads + g);
  std::sort(ranked.begin(), ranked.end());
  for (size_t i = 0; i < ranked.size(); ++i) {
    const int64_t l = ranked[i].second / rec.kv_heads, g = ranked[i].second % rec.kv_heads;
    for (Kind kind : {Kind::Key, Kind::Value}) {
      const Segment& s = plan_first_segment(two, l, g, kind);
      CHECK((s.role == SegmentRole::SinkHead) == (i < 2));
      if (i < 2) CHECK(s.format->name() == "keep-fp16");
    }
  }
  CHECK(test::annotation_text(two, "sink_heads_selected").find("K:L") == 0);
  // Threshold: exactly the heads below it.
  const double tau = (ranked[2].first + ranked[3].first) / 2;
  const Plan thr =
      build_plan("uniform", {{"format", std::string("int4-asym-g32")}, {"sink_head_threshold", tau}}, rec, stats);
  int64_t kept = 0;
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < rec.kv_heads; ++g)
      kept += thr.unit(l, g, Kind::Key).segments.front().role == SegmentRole::SinkHead;
  CHECK(kept == 3);
  // The synthetic sink token (position 0) receives the most attention.
  const Plan att = build_plan("uniform",
                              {{"format", std::string("int4-asym-g32")},
                               {"sink_tokens", int64_t{1}},
                               {"sink_token_select", std::string("attention")}},
                              rec, stats);
  CHECK(test::annotation_text(att, "sink_tokens_selected") == "0");
  const Plan first = build_plan("uniform",
                                {{"format", std::string("int4-asym-g32")},
                                 {"key_sink_tokens", int64_t{3}},
                                 {"sink_token_format", std::string("keep-fp32")}},
                                rec, stats);
  const auto& ks = first.unit(1, 2, Kind::Key).segments;
  REQUIRE(ks.size() == 2);
  CHECK(ks[0].begin == 0);
  CHECK(ks[0].end == 3);
  CHECK(ks[0].role == SegmentRole::SinkToken);
  CHECK(ks[0].format->name() == "keep-fp32");
  CHECK(first.unit(1, 2, Kind::Value).segments.size() == 1);  // values: no sink tokens
  // Per-kind windows, modes and copies; the prompt.
  const Plan w = build_plan("uniform",
                            {{"format", std::string("int2-asym-g32")},
                             {"window", int64_t{16}},
                             {"key_window_mode", std::string("chunked")},
                             {"value_window_extra_copy", true},
                             {"prompt_fraction", 0.25}},
                            rec, stats);
  CHECK(w.prefill() == 24);
  CHECK(w.unit(0, 0, Kind::Key).window.mode == RecentWindow::Mode::Chunked);
  CHECK(!w.unit(0, 0, Kind::Key).window.extra_copy);
  CHECK(w.unit(0, 0, Kind::Value).window.mode == RecentWindow::Mode::Sliding);
  CHECK(w.unit(0, 0, Kind::Value).window.extra_copy);
  // Counts beyond the recording are errors.
  CHECK_THROWS_WITH_AS(
      build_plan("uniform", {{"format", std::string("int4-asym-g32")}, {"sink_heads", int64_t{9}}}, rec, stats),
      doctest::Contains("exceeds the recording's 8 KV heads"), Error);
  // A sweep without statistics fails loudly rather than guessing.
  StrategyInput bare{rec, 0, nullptr};
  CHECK_THROWS_WITH_AS(
      require_strategy_type("uniform", "t")
          .make(test::params_of("uniform", {{"format", std::string("int4-asym-g32")}, {"sink_heads", int64_t{1}}}))
          ->build(bare),
      doctest::Contains("needs recording statistics"), Error);
  // Statistics of no calibration query are no data: entropies and attention-selected
  // sinks fail the point (a [calibration] rule can select nothing below T).
  RecordingStats empty(rec, {});
  CHECK(error_of("uniform", {{"format", std::string("int4-asym-g32")}, {"sink_heads", int64_t{1}}}, empty)
            .find("attention entropies need calibration queries") != std::string::npos);
  CHECK(error_of("uniform",
                 {{"format", std::string("int4-asym-g32")}, {"sink_tokens", int64_t{2}},
                  {"sink_token_select", std::string("attention")}},
                 empty)
            .find("attention-selected sink tokens need calibration queries") != std::string::npos);
  CHECK(error_of("uniform", {{"format", std::string("int4-asym-g32")}, {"sink_tokens", int64_t{2}}}, empty).empty());
}
