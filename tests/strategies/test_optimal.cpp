// The optimal allocator (sim/strategies/optimal.*): the knapsack solver against brute
// force, and, at the same bpe on the same data, never a worse objective than uniform or
// entropy-adaptive allocation; the additivity check it reports; a budget it cannot
// spend on anything that lowers its objective left unspent, with a warning.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/measurer.h"
#include "sim/simulator.h"
#include "sim/strategies/optimal.h"
#include "strategy_test_util.h"

using namespace kvb;
using kvb::test::annotation;
using kvb::test::build_plan;
using kvb::test::strategy_recording;

namespace {

using Values = std::map<std::string, ParamValue>;

// The objective of a plan on the given query positions.
double objective_of(const Recording& rec, const Plan& plan, const std::vector<int64_t>& positions,
                    const std::string& metric) {
  SimOptions opt;
  opt.positions = positions;
  return require_additive_error(metric, "test").sum(simulate(rec, plan, opt).rows);
}

}  // namespace

TEST_CASE("the Lagrangian solver finds the brute-force optimum of small problems") {
  // Random convex-ish problems: distortion halves (with noise) per width step.
  uint64_t state = 12345;
  auto rnd = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) * 0x1.0p-53;
  };
  for (int trial = 0; trial < 40; ++trial) {
    const size_t n = 5, m = 4;
    BudgetProblem prob;
    std::vector<std::vector<double>> D(n);
    uint64_t cheapest = 0, dearest = 0;
    for (size_t u = 0; u < n; ++u) {
      const uint64_t base = 10 + static_cast<uint64_t>(rnd() * 10);
      const double scale = 0.1 + rnd() * 10;
      std::vector<uint64_t> c;
      for (size_t i = 0; i < m; ++i) {
        c.push_back(base * (i + 2));
        D[u].push_back(scale * std::pow(0.25, static_cast<double>(i)) * (0.8 + 0.4 * rnd()));
      }
      cheapest += c.front();
      dearest += c.back();
      prob.cost.push_back(c);
    }
    prob.budget = cheapest + static_cast<uint64_t>(rnd() * static_cast<double>(dearest - cheapest));
    double best = INFINITY;
    std::vector<size_t> c(n, 0);
    std::function<void(size_t)> search = [&](size_t u) {
      if (u == n) {
        if (prob.total(c) > prob.budget) return;
        double d = 0;
        for (size_t k = 0; k < n; ++k) d += D[k][c[k]];
        best = std::min(best, d);
        return;
      }
      for (size_t i = 0; i < m; ++i) {
        c[u] = i;
        search(u + 1);
      }
    };
    search(0);
    double lambda = 0;
    const std::vector<size_t> got = solve_lagrangian(prob, D, &lambda);
    double d = 0;
    for (size_t k = 0; k < n; ++k) d += D[k][got[k]];
    INFO("trial " << trial);
    CHECK(prob.total(got) <= prob.budget);
    CHECK(d <= best * 1.15 + 1e-12);  // pairwise exchanges get within reach of the optimum
  }
}

TEST_CASE("at the same bpe on the same data, optimal never does worse than uniform or entropy on its objective") {
  const Recording& rec = strategy_recording();
  const std::vector<int64_t> calib = test::calibration_of(rec);
  RecordingStats stats(rec, calib);
  const std::vector<Values> protections = {{}, {{"sink_heads", int64_t{1}}, {"window", int64_t{8}}}};
  for (const std::string objective : {"attn_kl_mean", "attn_out_rel_fro"})
    for (const Values& prot : protections)
      for (double b : {3.5, 4.0, 4.6, 5.5, 7.0}) {
        if (!prot.empty() && b < 6.0) continue;  // a fp16 sink head of 8 and the window cost 3.2 bpe
        Values v = prot;
        v["budget_bpe"] = b;
        v["family"] = std::string("int{b}-asym-g32");
        Values opt_v = v;
        opt_v["objective"] = std::string(objective);
        const Plan opt = build_plan("optimal", opt_v, rec, stats);
        const double d_opt = objective_of(rec, opt, calib, objective);
        CHECK(annotation(opt, "objective_joint") == doctest::Approx(d_opt).epsilon(1e-9));
        for (const std::string other : {"uniform", "entropy"}) {
          const Plan p = build_plan(other, v, rec, stats);
          const double d = objective_of(rec, p, calib, objective);
          INFO(objective << " budget " << b << " protections " << prot.size() << " vs " << other << ": optimal "
                         << d_opt << " (bpe " << opt.bpe() << "), " << other << " " << d << " (bpe " << p.bpe() << ")");
          CHECK(d_opt <= d * (1 + 1e-9));
        }
      }
}

TEST_CASE("optimal minimizes any additive metric of the metric table; another objective is an error naming them") {
  const Recording& rec = strategy_recording();
  const std::vector<int64_t> calib = test::calibration_of(rec);
  RecordingStats stats(rec, calib);
  const Values v = {{"budget_bpe", 4.0}, {"family", std::string("int{b}-asym-g32")}};
  Values opt_v = v;
  opt_v["objective"] = std::string("logit_rmse");
  const Plan opt = build_plan("optimal", opt_v, rec, stats);
  CHECK(test::annotation_text(opt, "objective") == "logit_rmse");
  const double d_opt = objective_of(rec, opt, calib, "logit_rmse");
  CHECK(annotation(opt, "objective_joint") == doctest::Approx(d_opt).epsilon(1e-9));
  CHECK(d_opt <= objective_of(rec, build_plan("uniform", v, rec, stats), calib, "logit_rmse") * (1 + 1e-9));
  opt_v["objective"] = std::string("attn_kl_max");  // a maximum: not a sum over rows
  CHECK_THROWS_WITH_AS(build_plan("optimal", opt_v, rec, stats),
                       doctest::Contains("objective: 'attn_kl_max' is not an additive attention metric"), ConfigError);
  opt_v["objective"] = std::string("attn_kl_maen");
  CHECK_THROWS_WITH_AS(build_plan("optimal", opt_v, rec, stats), doctest::Contains("attn_kl_mean"), ConfigError);
}

TEST_CASE("optimal reports the additivity of its per-unit distortions") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  for (double b : {3.5, 6.0}) {
    const Plan p = build_plan("optimal", {{"budget_bpe", b}, {"family", std::string("int{b}-asym-g32")}}, rec, stats);
    const double predicted = annotation(p, "objective_predicted"), joint = annotation(p, "objective_joint");
    CHECK(predicted > 0);
    CHECK(annotation(p, "additivity") == doctest::Approx(joint / predicted));
    // Small errors add up: K and V errors of a head interact only at second order.
    CHECK(annotation(p, "additivity") == doctest::Approx(1.0).epsilon(0.35));
    CHECK(test::annotation_text(p, "objective") == "attn_kl_mean");
  }
  // Units outside the allocation (here: values at a fixed int2) are in objective_joint but
  // in no per-unit distortion; additivity leaves them out, so it still measures additivity.
  const Plan fixed_v = build_plan("optimal",
                                  {{"key_budget_bpe", 4.0}, {"key_family", std::string("int{b}-asym-g32")},
                                   {"value_format", std::string("int2-asym-g32")},
                                   {"objective", std::string("attn_out_rel_fro")}},
                                  rec, stats);
  CHECK(annotation(fixed_v, "objective_joint") > 2 * annotation(fixed_v, "objective_predicted"));  // int2 values
  CHECK(annotation(fixed_v, "additivity") == doctest::Approx(1.0).epsilon(0.35));
  // Distortion tables are computed once per run: a second point reads them back.
  const Plan a = build_plan("optimal", {{"budget_bpe", 4.0}, {"family", std::string("int{b}-asym-g32")}}, rec, stats);
  const Plan b = build_plan("optimal", {{"budget_bpe", 4.0}, {"family", std::string("int{b}-asym-g32")}}, rec, stats);
  CHECK(a.describe() == b.describe());
  CHECK(annotation(a, "objective_predicted") == annotation(b, "objective_predicted"));
}

TEST_CASE("a width whose format overflows on the data is measured as infinitely bad, never chosen") {
  // Values ~ N(0, 1e6²): q4_0's fp16 scale (max|x| / 8) overflows to Inf; q8_0's
  // (max|x| / 127) does not.
  SyntheticSpec s = kvb::test::strategy_spec();
  s.value_scale = 1e6;
  const Recording rec = generate_synthetic(s);
  RecordingStats stats(rec, kvb::test::calibration_of(rec));
  const Plan plan = build_plan(
      "optimal", {{"budget_bpe", 6.5}, {"family", std::string("q{b}_0")}, {"widths", IntList{4, 8}}}, rec, stats);
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (const Segment& seg : plan.unit(l, g, Kind::Value).segments) CHECK(seg.format->name() == "q8_0");
  CHECK(std::isfinite(objective_of(rec, plan, {40, 80}, "attn_kl_mean")));
}

// The extended search space (protections as choices) and calibration on other data.
namespace {

// Bits the plan spends on every unit: what budget_bpe bounds.
double plan_bpe_at(const Plan& plan, int64_t context) { return plan.bpe_at(context); }

// Counts the units of `plan` with a segment of role `role` (or a window, for `window`).
int64_t units_with(const Plan& plan, std::optional<SegmentRole> role, bool window = false) {
  int64_t n = 0;
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = plan.unit(l, g, kind);
        bool has = window && u.window.active();
        for (const Segment& s : u.segments) has |= role && s.role == *role;
        n += has;
      }
  return n;
}

// Every unit of `a` and `b` alike: segments (bounds, formats, roles) and windows.
bool same_units(const Plan& a, const Plan& b) {
  if (a.layers() != b.layers() || a.kv_heads() != b.kv_heads()) return false;
  for (int64_t l = 0; l < a.layers(); ++l)
    for (int64_t g = 0; g < a.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan &x = a.unit(l, g, kind), &y = b.unit(l, g, kind);
        if (x.segments.size() != y.segments.size() || x.window.size != y.window.size) return false;
        for (size_t i = 0; i < x.segments.size(); ++i)
          if (x.segments[i].begin != y.segments[i].begin || x.segments[i].end != y.segments[i].end ||
              x.segments[i].format->name() != y.segments[i].format->name() || x.segments[i].role != y.segments[i].role)
            return false;
      }
  return true;
}

}  // namespace

TEST_CASE("efficient_choices keeps the candidates no cheaper one beats, cheapest first") {
  // cost 10: D 5 and 4 (keep 4); cost 12: D 6 (beaten); cost 15: D 1; cost 20: D 1 (not better).
  const std::vector<uint64_t> cost = {10, 12, 10, 20, 15};
  const std::vector<double> D = {5, 6, 4, 1, 1};
  CHECK(efficient_choices(cost, D) == std::vector<size_t>{2, 4});
  // An infinitely bad cheapest candidate stays: it is what the cheapest allocation is made of.
  CHECK(efficient_choices({4, 8}, {INFINITY, 2.0}) == std::vector<size_t>{0, 1});
}

TEST_CASE("optimal picks sink tokens where they are the cheapest way to cut the error") {
  // The strategy recording's first token is a sink: it receives most of the sink heads'
  // attention, so its key and value errors weigh most. Keeping it in fp16 costs 13 bits
  // per channel more than int2-g32's 3; one more bit for all 96 tokens costs 96.
  const Recording& rec = strategy_recording();
  const std::vector<int64_t> calib = test::calibration_of(rec);
  RecordingStats stats(rec, calib);
  const Values width_only = {{"budget_bpe", 3.3}, {"family", std::string("int{b}-asym-g32")}, {"widths", IntList{2, 3, 4}}};
  Values with_sinks = width_only;
  with_sinks["candidate_sink_tokens"] = IntList{1};
  const Plan plain = build_plan("optimal", width_only, rec, stats);
  const Plan sinks = build_plan("optimal", with_sinks, rec, stats);
  const int64_t chosen = units_with(sinks, SegmentRole::SinkToken);
  INFO("protections chosen: " << test::annotation_text(sinks, "protections_chosen"));
  CHECK(chosen > 0);
  CHECK(test::annotation_text(sinks, "protections_chosen").find("sink_tokens=1x") != std::string::npos);
  CHECK(units_with(plain, SegmentRole::SinkToken) == 0);
  // The search space holds every width-only allocation, so it does no worse at the same budget.
  const double d_plain = objective_of(rec, plain, calib, "attn_kl_mean");
  const double d_sinks = objective_of(rec, sinks, calib, "attn_kl_mean");
  CHECK(d_sinks < d_plain);
  CHECK(annotation(sinks, "objective_joint") == doctest::Approx(d_sinks).epsilon(1e-9));
  CHECK(sinks.bpe() <= 3.3);
  // Each sink token is the first token, in keep-fp16, marked as a sink token.
  for (int64_t l = 0; l < sinks.layers(); ++l)
    for (int64_t g = 0; g < sinks.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value})
        for (const Segment& s : sinks.unit(l, g, kind).segments)
          if (s.role == SegmentRole::SinkToken) {
            CHECK(s.begin == 0);
            CHECK(s.end == 1);
            CHECK(s.format->name() == "keep-fp16");
          }
}

TEST_CASE("optimal keeps a unit whole as a sink head when nothing cheaper keeps it finite") {
  // Values ~ N(0, 1e6²): q4_0's fp16 scale overflows (the values' only width is
  // infinitely bad); kept whole in fp32 (the sink-head choice) they are exact.
  SyntheticSpec s = kvb::test::strategy_spec();
  s.value_scale = 1e6;
  const Recording rec = generate_synthetic(s);
  RecordingStats stats(rec, kvb::test::calibration_of(rec));
  const Plan plan = build_plan("optimal",
                               {{"budget_bpe", 19.0},
                                {"family", std::string("q{b}_0")},
                                {"key_widths", IntList{4, 8}},
                                {"value_widths", IntList{4}},
                                {"value_candidate_sink_heads", true},
                                {"value_sink_head_format", std::string("keep-fp32")}},
                               rec, stats);
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g) {
      const UnitPlan& v = plan.unit(l, g, Kind::Value);
      REQUIRE(v.segments.size() == 1);
      CHECK(v.segments[0].role == SegmentRole::SinkHead);
      CHECK(v.segments[0].format->name() == "keep-fp32");
      CHECK(plan.unit(l, g, Kind::Key).segments[0].role == SegmentRole::Allocated);  // keys have no such choice
    }
  CHECK(std::isfinite(objective_of(rec, plan, {40, 80}, "attn_kl_mean")));
  CHECK(plan.bpe() <= 19.0);
}

TEST_CASE("optimal with protections as choices meets its budget exactly, memory counted as methods.md §1 counts it") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const std::vector<Values> spaces = {
      {{"candidate_sink_tokens", IntList{1, 4}}},
      {{"candidate_windows", IntList{8, 16}}},
      {{"candidate_windows", IntList{8}}, {"window_mode", std::string("chunked")}},
      {{"candidate_windows", IntList{8}}, {"window_extra_copy", true}, {"window_format", std::string("int8-asym-g32")}},
      {{"phase_split", true}},
      {{"phase_split", true}, {"phase_index", int64_t{40}}, {"candidate_sink_tokens", IntList{1}}},
      {{"candidate_sink_heads", true}, {"candidate_sink_tokens", IntList{1}}, {"candidate_windows", IntList{8}}},
      {{"key_candidate_windows", IntList{16}}, {"prompt", int64_t{10}}},
      {{"candidate_windows", IntList{8}}, {"budget_context", int64_t{1024}}},
      {{"candidate_sink_tokens", IntList{1}}, {"sink_heads", int64_t{1}}},
  };
  for (const Values& space : spaces)
    for (double b : {3.2, 4.4, 6.5}) {
      Values v = space;
      v["budget_bpe"] = b;
      v["family"] = std::string("int{b}-asym-g32");
      const bool has_sink_head = space.count("sink_heads") > 0;
      if (has_sink_head && b < 5) continue;  // a fp16 sink head of 8 costs 1.6 bpe
      const Plan plan = build_plan("optimal", v, rec, stats);
      CHECK(plan.check().empty());
      const int64_t context = space.count("budget_context") ? std::get<int64_t>(space.at("budget_context")) : rec.tokens;
      const double bpe = plan_bpe_at(plan, context);
      const double slack = annotation(plan, "budget_slack_bpe"), step = annotation(plan, "budget_step_bpe");
      INFO("space " << plan.describe() << " budget " << b << ": bpe " << bpe << ", slack " << slack << ", step " << step);
      CHECK(bpe <= b);
      // The slack is what Plan's own memory count leaves: the costs are its costs.
      CHECK(slack == doctest::Approx(b - bpe).epsilon(1e-9));
      CHECK((std::isnan(step) || slack < step));
      if (space.count("phase_split")) {
        REQUIRE(plan.phase_boundary().has_value());
        CHECK(*plan.phase_boundary() == (space.count("phase_index") ? 40 : 72));
      }
    }
  // A phase split is a choice of a pair of widths, measured together: at some budget
  // some unit takes different widths for the two phases.
  bool split_chosen = false;
  for (double b : {3.2, 3.6, 4.2, 5.1}) {
    const Plan plan = build_plan(
        "optimal", {{"budget_bpe", b}, {"family", std::string("int{b}-asym-g32")}, {"phase_split", true}}, rec, stats);
    split_chosen |= test::annotation_text(plan, "protections_chosen").find("phase_split") != std::string::npos;
  }
  CHECK(split_chosen);
}

TEST_CASE("optimal's candidate protections refuse what they cannot mean") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Values base = {{"budget_bpe", 4.0}, {"family", std::string("int{b}-asym-g32")}};
  auto with = [&](Values extra) {
    Values v = base;
    for (auto& [k, x] : extra) v[k] = x;
    return v;
  };
  CHECK_THROWS_WITH_AS(build_plan("optimal", with({{"candidate_windows", IntList{0}}}), rec, stats),
                       doctest::Contains("candidate_windows: every entry must be > 0"), ConfigError);
  CHECK_THROWS_WITH_AS(build_plan("optimal", with({{"candidate_sink_tokens", IntList{2, 2}}}), rec, stats),
                       doctest::Contains("candidate_sink_tokens: 2 is given twice"), ConfigError);
  CHECK_THROWS_WITH_AS(build_plan("optimal", with({{"candidate_windows", IntList{8}}, {"window", int64_t{4}}}), rec, stats),
                       doctest::Contains("candidate_windows with window = 4"), ConfigError);
  CHECK_THROWS_WITH_AS(
      build_plan("optimal",
                 with({{"candidate_sink_tokens", IntList{1}}, {"sink_token_select", std::string("attention")}}), rec,
                 stats),
      doctest::Contains("candidate sink tokens are the first N tokens"), ConfigError);
  CHECK_THROWS_WITH_AS(build_plan("optimal", with({{"phase_index", int64_t{40}}}), rec, stats),
                       doctest::Contains("not used without phase_split"), ConfigError);
  CHECK_THROWS_WITH_AS(build_plan("optimal", with({{"candidate_sink_tokens", IntList{96}}}), rec, stats),
                       doctest::Contains("candidate sink tokens 96 are not fewer than the recording's 96 tokens"), Error);
  CHECK_THROWS_WITH_AS(build_plan("optimal", with({{"calibration_data", std::string("other.safetensors")}}), rec, stats),
                       doctest::Contains("calibration_data: needs an experiment config"), ConfigError);
  CHECK_THROWS_WITH_AS(
      build_plan("optimal", with({{"calibration_data", std::string("x")}, {"sink_heads", int64_t{1}}}), rec, stats),
      doctest::Contains("calibration_data with sink_heads"), ConfigError);
}

TEST_CASE("calibrated on other data, optimal builds the plan that data gives and is evaluated on its own") {
  // Two recordings of one shape (synthetic seeds 11 and 12). The plan calibrated on
  // seed 12 and built for seed 11 is the plan built in-sample on seed 12; evaluated on
  // seed 11 it measures other numbers than on seed 12, which objective_calibration reports.
  const Recording& evaluated = strategy_recording();
  SyntheticSpec other_spec = test::strategy_spec();
  other_spec.seed = 12;
  const Recording other = generate_synthetic(other_spec);
  const std::vector<int64_t> calib = test::calibration_of(evaluated);
  RecordingStats eval_stats(evaluated, calib), other_stats(other, calib);
  std::vector<std::string> asked;
  const CalibrationResolver resolver = [&](const std::string& value) {
    asked.push_back(value);
    return CalibrationData{&other, &other_stats, "synthetic seed 12"};
  };
  const Values v = {{"budget_bpe", 3.5},
                    {"family", std::string("int{b}-asym-g32")},
                    {"candidate_sink_tokens", IntList{1}},
                    {"candidate_windows", IntList{8}}};
  Values cv = v;
  cv["calibration_data"] = std::string("seed 12");
  const Params params = test::params_of("optimal", cv);
  const std::unique_ptr<Strategy> strategy = require_strategy_type("optimal", "test").make(params);
  const Plan calibrated = strategy->build(StrategyInput{evaluated, 0, &eval_stats, &resolver});
  CHECK(asked == std::vector<std::string>{"seed 12"});
  const Plan in_sample_other = build_plan("optimal", v, other, other_stats);
  const Plan in_sample_evaluated = build_plan("optimal", v, evaluated, eval_stats);
  CHECK(same_units(calibrated, in_sample_other));
  CHECK(calibrated.bpe() == in_sample_other.bpe());
  CHECK(annotation(calibrated, "objective_joint") == annotation(in_sample_other, "objective_joint"));
  CHECK(test::annotation_text(calibrated, "calibration_data") == "synthetic seed 12");
  // objective_calibration: the objective's metric on the calibration data's positions.
  SimOptions opt;
  opt.positions = calib;
  const double on_other = require_metric("attn_kl_mean", "test").compute(simulate(other, calibrated, opt));
  const double on_evaluated = require_metric("attn_kl_mean", "test").compute(simulate(evaluated, calibrated, opt));
  CHECK(annotation(calibrated, "objective_calibration") == doctest::Approx(on_other).epsilon(1e-12));
  CHECK(on_evaluated != doctest::Approx(on_other).epsilon(1e-3));
  // In-sample on the evaluated data, the allocation differs (it was measured there).
  CHECK(annotation(in_sample_evaluated, "objective_joint") != annotation(calibrated, "objective_joint"));
  SyntheticSpec short_spec = test::strategy_spec();
  short_spec.tokens = 48;
  short_spec.calibration_queries = 47;
  const Recording shorter = generate_synthetic(short_spec);
  RecordingStats short_stats(shorter, test::calibration_of(shorter));
  const CalibrationResolver short_resolver = [&](const std::string&) {
    return CalibrationData{&shorter, &short_stats, "short"};
  };
  // A calibration recording of another length is fine: its choices, costed on the evaluated one.
  const Plan from_short = strategy->build(StrategyInput{evaluated, 0, &eval_stats, &short_resolver});
  CHECK(from_short.tokens() == evaluated.tokens);
  CHECK(from_short.bpe() <= 3.5);
}

namespace {

// The CPU simulator behind another backend's name, counting what it is asked: stands
// for the run's measurer (a sweep's planning backend) the tables are measured with.
class CountingMeasurer final : public Measurer {
 public:
  explicit CountingMeasurer(const Recording& rec) : cpu_(rec) {}
  const char* name() const override { return "counting"; }
  const Recording& recording() const override { return cpu_.recording(); }
  std::string unsupported_reason(const Plan&, const SimOptions&) const override { return {}; }
  bool measures_regions() const override { return true; }
  int concurrency() const override { return 1; }
  ErrorStats measure_layer(const Plan& plan, int64_t layer, const SimOptions& opt) override {
    return cpu_.measure_layer(plan, layer, opt);
  }
  ErrorStats measure_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) override {
    ++kv_heads;
    return cpu_.measure_kv_head(plan, layer, kv_head, opt);
  }
  ErrorStats measure(const Plan& plan, const SimOptions& opt) override {
    ++plans;
    return cpu_.measure(plan, opt);
  }
  std::atomic<int> kv_heads{0}, plans{0};

 private:
  CpuMeasurer cpu_;
};

// The optimal plan of `values` with `measurer_for` (nullptr: the CPU simulator).
Plan optimal_plan(const Values& values, const Recording& rec, RecordingStats& stats, const MeasurerFor* measurer_for,
                  const CalibrationResolver* calibration = nullptr) {
  const std::unique_ptr<Strategy> s =
      require_strategy_type("optimal", "test").make(test::params_of("optimal", values));
  return s->build(StrategyInput{rec, 0, &stats, calibration, measurer_for});
}

void check_same_plan(const Plan& a, const Plan& b) {
  CHECK(a.describe() == b.describe());
  CHECK(same_units(a, b));
  REQUIRE(a.annotations().size() == b.annotations().size());
  for (size_t i = 0; i < a.annotations().size(); ++i) {
    INFO(a.annotations()[i].name);
    CHECK(a.annotations()[i].name == b.annotations()[i].name);
    CHECK(a.annotations()[i].value == b.annotations()[i].value);
  }
}

}  // namespace

TEST_CASE("optimal measures its tables and its additivity check with the run's measurer, keyed by its backend") {
  const Recording& rec = strategy_recording();
  const std::vector<int64_t> calib = test::calibration_of(rec);
  CountingMeasurer counting(rec);
  std::vector<const Recording*> asked;
  const MeasurerFor measurer_for = [&](const Recording& r) -> Measurer& {
    asked.push_back(&r);
    return counting;
  };
  for (const Values& v : {Values{{"budget_bpe", 3.5}, {"family", std::string("int{b}-asym-g32")}},
                          Values{{"budget_bpe", 3.5},
                                 {"family", std::string("int{b}-asym-g32")},
                                 {"candidate_windows", IntList{8}}}}) {
    INFO("extended search space: " << v.count("candidate_windows"));
    RecordingStats stats(rec, calib);
    const Plan on_cpu = optimal_plan(v, rec, stats, nullptr);
    counting.kv_heads = counting.plans = 0;
    asked.clear();
    // The same statistics: the CPU's table entries are not another backend's.
    const Plan measured = optimal_plan(v, rec, stats, &measurer_for);
    CHECK(counting.kv_heads > 0);
    CHECK(counting.plans >= 1);  // objective_joint
    CHECK(!asked.empty());
    CHECK(std::all_of(asked.begin(), asked.end(), [&](const Recording* r) { return r == &rec; }));
    // The CPU simulator under another name gives the CPU's plan, bit for bit.
    check_same_plan(measured, on_cpu);
    // Its own entries are reused by the next point.
    const int before = counting.kv_heads;
    check_same_plan(optimal_plan(v, rec, stats, &measurer_for), on_cpu);
    CHECK(counting.kv_heads == before);
  }
  // With calibration data, the measurer is asked for that recording.
  SyntheticSpec other_spec = test::strategy_spec();
  other_spec.seed = 12;
  const Recording other = generate_synthetic(other_spec);
  RecordingStats eval_stats(rec, calib), other_stats(other, calib);
  const CalibrationResolver resolver = [&](const std::string&) {
    return CalibrationData{&other, &other_stats, "synthetic seed 12"};
  };
  CountingMeasurer on_other(other);
  const MeasurerFor other_for = [&](const Recording& r) -> Measurer& {
    REQUIRE(&r == &other);
    return on_other;
  };
  const Values cv = {{"budget_bpe", 3.5}, {"family", std::string("int{b}-asym-g32")},
                     {"calibration_data", std::string("seed 12")}};
  const Plan calibrated = optimal_plan(cv, rec, eval_stats, &other_for, &resolver);
  CHECK(on_other.kv_heads > 0);
  CHECK(on_other.plans >= 1);
  RecordingStats fresh_other(other, calib);
  const CalibrationResolver fresh_resolver = [&](const std::string&) {
    return CalibrationData{&other, &fresh_other, "synthetic seed 12"};
  };
  RecordingStats fresh_eval(rec, calib);
  check_same_plan(calibrated, optimal_plan(cv, rec, fresh_eval, nullptr, &fresh_resolver));
}

TEST_CASE("optimal buys no candidate that does not lower its objective, and warns of the budget it leaves unspent") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  // Under attn_kl_mean value widths do not change the attention weights: values keep
  // int2 (3 bpe with g32 metadata) and keys stop at int8 (9 bpe), 6 bpe in all.
  for (const Values& space : {Values{}, Values{{"candidate_windows", IntList{8}}}}) {
    Values v = space;
    v["budget_bpe"] = 8.0;
    v["family"] = std::string("int{b}-asym-g32");
    std::vector<std::string> warnings;
    const Plan plan = build_plan("optimal", v, rec, stats, 0, &warnings);
    INFO("candidate windows " << space.size() << ": " << plan.describe());
    for (int64_t l = 0; l < plan.layers(); ++l)
      for (int64_t g = 0; g < plan.kv_heads(); ++g)
        for (const Segment& s : plan.unit(l, g, Kind::Value).segments) CHECK(s.format->name() == "int2-asym-g32");
    CHECK(plan.bpe() < 7.0);
    CHECK(std::isnan(annotation(plan, "budget_step_bpe")));
    CHECK(annotation(plan, "budget_slack_bpe") == doctest::Approx(8.0 - plan.bpe()).epsilon(1e-9));
    REQUIRE(warnings.size() == 1);
    const std::string& w = warnings[0];
    CHECK(w.find("budget_bpe 8 is not spent: the allocation reaches " + format_double(std::round(plan.bpe() * 1e6) / 1e6) +
                 " bpe") != std::string::npos);
    CHECK(w.find("no candidate that fits lowers attn_kl_mean further") != std::string::npos);
    CHECK(w.find("value widths do not change the attention weights") != std::string::npos);
  }
  // Separate budgets: the value budget is the one left unspent.
  std::vector<std::string> warnings;
  const Plan separate = build_plan(
      "optimal", {{"key_budget_bpe", 5.5}, {"value_budget_bpe", 5.0}, {"family", std::string("int{b}-asym-g32")}}, rec,
      stats, 0, &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("value_budget_bpe 5 is not spent: the allocation reaches 3 bpe (2 bpe unspent)") !=
        std::string::npos);
  CHECK(annotation(separate, "key_budget_slack_bpe") < annotation(separate, "key_budget_step_bpe"));
  // A budget the objective can still use is spent within one step, without a word; so is
  // any budget under an objective that sees the values.
  for (const auto& [objective, budget] : {std::pair{"attn_kl_mean", 4.0}, std::pair{"attn_out_rel_fro", 8.0}}) {
    warnings.clear();
    const Plan plan = build_plan(
        "optimal",
        {{"budget_bpe", budget}, {"family", std::string("int{b}-asym-g32")}, {"objective", std::string(objective)}},
        rec, stats, 0, &warnings);
    INFO(objective << " at " << budget << ": " << plan.describe());
    CHECK(warnings.empty());
    CHECK(annotation(plan, "budget_slack_bpe") < annotation(plan, "budget_step_bpe"));
  }
}
