// Error-budget attribution (experiments/attribution.*, ErrorRegion in sim/simulator.h):
// a region's simulation equals the simulation of a plan where everything outside the
// region is exact; layer, head and region shares each sum to 1; the concentration
// curve is cumulative and ends at 1.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "experiments/attribution.h"
#include "sim/formats/registry.h"
#include "sim/simulator.h"
#include "strategy_test_util.h"

using namespace kvb;
using kvb::test::build_plan;
using kvb::test::strategy_recording;

namespace {

// A plan with every kind of protection at a lossy format, so each region has error.
Plan protected_plan(RecordingStats& stats) {
  return build_plan("phase",
                    {{"first_format", std::string("int3-asym-g32")},
                     {"second_format", std::string("int2-asym-g32")},
                     {"sink_heads", int64_t{1}},
                     {"sink_head_format", std::string("int6-asym-g32")},
                     {"sink_tokens", int64_t{2}},
                     {"sink_token_format", std::string("int5-asym-g32")},
                     {"window", int64_t{12}},
                     {"window_format", std::string("int4-asym-g32")}},
                    strategy_recording(), stats);
}

// A copy of `plan` where the parts `exact` selects are stored at keep-fp32.
Plan with_exact(Plan plan, bool sink_heads, bool sink_tokens, bool window, bool rest) {
  const FormatPtr exact = make_format("keep-fp32");
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        UnitPlan& u = plan.unit(l, g, kind);
        for (Segment& s : u.segments)
          if ((s.role == SegmentRole::SinkHead && sink_heads) || (s.role == SegmentRole::SinkToken && sink_tokens) ||
              (s.role == SegmentRole::Allocated && rest))
            s.format = exact;
        if (window && u.window.active()) u.window.format = exact;
      }
  return plan;
}

// Indices of the default attributed errors in every ErrorSums.
constexpr size_t kKl = 0, kOutErr2 = 1;

void check_same_rows(const ErrorStats& a, const ErrorStats& b) {
  REQUIRE(a.rows.size() == b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    CHECK(a.rows[i].kl == b.rows[i].kl);
    CHECK(a.rows[i].out_err2 == b.rows[i].out_err2);
  }
}

}  // namespace

TEST_CASE("a region's simulation keeps exactly that region's quantization error") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan plan = protected_plan(stats);
  SimOptions opt;
  using Part = ErrorRegion::Part;
  auto region_stats = [&](ErrorRegion r) {
    SimOptions o = opt;
    o.region = &r;
    return simulate(rec, plan, o);
  };
  check_same_rows(region_stats({Part::Rest}), simulate(rec, with_exact(plan, true, true, true, false), opt));
  check_same_rows(region_stats({Part::SinkHeads}), simulate(rec, with_exact(plan, false, true, true, true), opt));
  check_same_rows(region_stats({Part::SinkTokens}), simulate(rec, with_exact(plan, true, false, true, true), opt));
  check_same_rows(region_stats({Part::Window}), simulate(rec, with_exact(plan, true, true, false, true), opt));
  // Every part has error of its own.
  for (Part p : {Part::Rest, Part::SinkHeads, Part::SinkTokens, Part::Window})
    CHECK(error_sums(region_stats({p}))[kKl] > 0);
  // Tokens: only keys/values from the boundary on; queries before it see no error.
  const ErrorStats second = region_stats({Part::Tokens, 72, 96});
  for (const AttentionRow& r : second.rows)
    if (r.position < 72) {
      CHECK(r.kl == 0);
      CHECK(r.out_err2 == 0);
    }
  CHECK(error_sums(second)[kOutErr2] > 0);
}

TEST_CASE("regions mask keys-only formats' estimated logits too (QJL keys)") {
  // QJL key segments give their logits through a score estimator, not a decoded key:
  // a region that leaves them out must leave their logit errors out too.
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan plan = build_plan("uniform",
                               {{"key_format", std::string("qjl-m128")},
                                {"value_format", std::string("int3-asym-g32")},
                                {"sink_tokens", int64_t{2}},
                                {"sink_token_format", std::string("int5-asym-g32")},
                                {"window", int64_t{12}},
                                {"window_format", std::string("int4-asym-g32")}},
                               rec, stats);
  using Part = ErrorRegion::Part;
  auto region_stats = [&](ErrorRegion r) {
    SimOptions o;
    o.region = &r;
    return simulate(rec, plan, o);
  };
  check_same_rows(region_stats({Part::Window}), simulate(rec, with_exact(plan, true, true, false, true), SimOptions{}));
  check_same_rows(region_stats({Part::SinkTokens}), simulate(rec, with_exact(plan, true, false, true, true), SimOptions{}));
  check_same_rows(region_stats({Part::SinkHeads}), simulate(rec, with_exact(plan, false, true, true, true), SimOptions{}));
  const ErrorStats rest = region_stats({Part::Rest});
  CHECK(error_sums(rest)[kKl] > 0);
  const ErrorStats late = region_stats({Part::Tokens, 72, 96});
  for (const AttentionRow& r : late.rows)
    if (r.position < 72) CHECK(r.kl == 0);
  CHECK(error_sums(late)[kKl] > 0);
}

TEST_CASE("attribution shares sum to 1: layers, heads, each region partition; concentration ends at 1") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan plan = protected_plan(stats);
  const std::vector<AttributionRegion> regions = attribution_regions(plan, rec);
  std::vector<std::string> names;
  for (const AttributionRegion& r : regions) names.push_back(r.partition + "/" + r.name);
  CHECK(names == std::vector<std::string>{"protection/sink_heads", "protection/sink_tokens", "protection/window",
                                          "protection/rest", "phase/first_phase", "phase/second_phase"});
  SimOptions opt;
  const ErrorStats full = simulate(rec, plan, opt);
  std::vector<ErrorStats> per_region;
  for (const AttributionRegion& r : regions) {
    SimOptions o = opt;
    o.region = &r.region;
    per_region.push_back(simulate(rec, plan, o));
  }
  const Attribution a = attribute(full, regions, per_region, rec.num_layers(), rec.q_heads);
  REQUIRE(a.errors.size() == 2);
  CHECK(std::string(a.errors[kKl]->name) == "kl");
  CHECK(std::string(a.errors[kOutErr2]->name) == "out_err2");
  const std::string csv = attribution_rows(3, "k", a);
  // Sum the shares per (metric, scope) from the CSV itself.
  std::map<std::string, double> sums;
  std::istringstream in(csv);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string x;
    while (std::getline(ss, x, ',')) f.push_back(x);
    REQUIRE(f.size() == 7);
    CHECK(f[0] == "3");
    sums[f[2] + "/" + f[3]] += std::stod(f[6]);
  }
  for (const char* key : {"kl/layer", "kl/head", "kl/protection", "kl/phase", "out_err2/layer", "out_err2/head",
                          "out_err2/protection", "out_err2/phase"}) {
    INFO(key);
    CHECK(sums[key] == doctest::Approx(1.0).epsilon(1e-9));
  }
  // The interaction rows carry what the parts' errors do not add up to.
  double parts = 0, interaction = 0;
  for (const Attribution::Region& r : a.regions)
    if (r.partition == "protection") (r.name == "interaction" ? interaction : parts) += r.error[kKl];
  CHECK(parts + interaction == doctest::Approx(a.total[kKl]));
  // Concentration: cumulative, worst heads first, ending at 1.
  std::istringstream cin(concentration_rows(3, "k", a));
  double last = 0;
  int rows = 0;
  while (std::getline(cin, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string x;
    while (std::getline(ss, x, ',')) f.push_back(x);
    if (f[2] != "kl") continue;
    const double share = std::stod(f[6]);
    CHECK(share >= last - 1e-12);
    last = share;
    ++rows;
  }
  CHECK(rows == rec.num_layers() * rec.q_heads);
  CHECK(last == doctest::Approx(1.0));
}

TEST_CASE("a plan without protections is 100% rest, with no region simulation") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan plan = build_plan("uniform", {{"format", std::string("int3-asym-g32")}}, rec, stats);
  const std::vector<AttributionRegion> regions = attribution_regions(plan, rec);
  // The synthetic recording has a phase boundary: only the phase partition is simulated.
  REQUIRE(regions.size() == 2);
  CHECK(regions[0].partition == "phase");
  SimOptions opt;
  const ErrorStats full = simulate(rec, plan, opt);
  std::vector<ErrorStats> per;
  for (const AttributionRegion& r : regions) {
    SimOptions o = opt;
    o.region = &r.region;
    per.push_back(simulate(rec, plan, o));
  }
  const Attribution a = attribute(full, regions, per, rec.num_layers(), rec.q_heads);
  CHECK(a.regions[0].name == "rest");
  CHECK(a.regions[0].error[kKl] == a.total[kKl]);
  CHECK(a.regions[1].name == "interaction");
  CHECK(a.regions[1].error[kKl] == 0);
}

TEST_CASE("any additive metric can be attributed: its row error summed per head, region and total") {
  const Recording& rec = strategy_recording();
  RecordingStats stats(rec, test::calibration_of(rec));
  const Plan plan = protected_plan(stats);
  const std::vector<AttributionRegion> regions = attribution_regions(plan, rec);
  const ErrorStats full = simulate(rec, plan, SimOptions{});
  std::vector<ErrorStats> per_region;
  for (const AttributionRegion& r : regions) {
    SimOptions o;
    o.region = &r.region;
    per_region.push_back(simulate(rec, plan, o));
  }
  std::vector<const AdditiveError*> errors;
  for (const AdditiveError& e : additive_errors()) errors.push_back(&e);
  REQUIRE(errors.size() >= 4);  // logit_err2, kl, out_rel, out_err2 (table order)
  const Attribution a = attribute(full, regions, per_region, rec.num_layers(), rec.q_heads, errors);
  for (size_t m = 0; m < errors.size(); ++m) {
    INFO(errors[m]->name);
    double rows = 0;
    for (const AttentionRow& r : full.rows) rows += errors[m]->of_row(r);
    CHECK(a.total[m] == rows);
    double heads = 0;
    for (const ErrorSums& h : a.head) heads += h[m];
    CHECK(heads == doctest::Approx(a.total[m]).epsilon(1e-12));
    CHECK(a.total[m] > 0);
    // The region rows of the CSV are this error's sums over the region's simulation.
    CHECK(a.regions[0].error[m] == errors[m]->sum(per_region[0].rows));
  }
  const std::string csv = attribution_rows(0, "k", a);
  CHECK(csv.find(",logit_err2,layer,L0,") != std::string::npos);
  CHECK(csv.find(",out_rel,protection,interaction,") != std::string::npos);
  // The metric each error drives is an increasing function of its sum: attn_kl_mean is Σ kl / rows.
  const size_t kl = static_cast<size_t>(
      std::find(errors.begin(), errors.end(), find_additive_error("attn_kl_mean")) - errors.begin());
  REQUIRE(kl < errors.size());
  CHECK(a.total[kl] / static_cast<double>(full.rows.size()) ==
        doctest::Approx(find_metric("attn_kl_mean")->compute(full)).epsilon(1e-12));
}
