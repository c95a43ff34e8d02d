// The Measurer interface (sim/measurer.h) and its CPU implementation: CpuMeasurer is
// the CPU simulator bit for bit (layers, KV heads, whole plans, with and without the
// exact pass prepare() builds), honours regions, never refuses a plan, and runs as
// many measurements at once as OpenMP has threads.
#include <omp.h>

#include "sim/formats/registry.h"
#include "sim/measurer.h"
#include "sim/metrics/metric_table.h"
#include "sim/reconstruction.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
#include "recording_test_util.h"
#include "test_util.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;

namespace {

// Every field of a and b equal, bit for bit.
void check_identical(const ErrorStats& a, const ErrorStats& b, const std::string& label) {
  INFO(label);
  CHECK(a.k_err2 == b.k_err2);
  CHECK(a.k_norm2 == b.k_norm2);
  CHECK(a.v_err2 == b.v_err2);
  CHECK(a.v_norm2 == b.v_norm2);
  CHECK(a.logit_pairs == b.logit_pairs);
  REQUIRE(a.rows.size() == b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    for (const AttentionRowId& id : kAttentionRowIds) CHECK(a.rows[i].*id.member == b.rows[i].*id.member);
    for (const AttentionRowValue& v : kAttentionRowValues) CHECK(a.rows[i].*v.member == b.rows[i].*v.member);
  }
}

}  // namespace

TEST_CASE("CpuMeasurer is the CPU simulator bit for bit, with or without the exact pass it prepares") {
  test::RandomShape shape;
  shape.q_heads = 4;
  shape.kv_heads = 2;
  shape.tokens = 70;
  const Recording rec = test::random_layers(shape);
  const Plan plan = uniform_plan(rec, "int3-asym-g16", "int2-sym-g32");
  SimOptions opt;
  opt.positions = {0, 5, 33, 69};
  opt.topk = 4;

  CpuMeasurer plain(rec);  // no exact pass
  CpuMeasurer prepared(rec, size_t(1) << 30);
  prepared.prepare(opt);
  for (CpuMeasurer* m : {&plain, &prepared}) {
    CHECK(&m->recording() == &rec);
    for (int64_t l = 0; l < rec.num_layers(); ++l) {
      check_identical(m->measure_layer(plan, l, opt), simulate_layer(rec, plan, l, opt), "layer " + std::to_string(l));
      for (int64_t g = 0; g < rec.kv_heads; ++g)
        check_identical(m->measure_kv_head(plan, l, g, opt), simulate_kv_head(rec, plan, l, g, opt),
                        "layer " + std::to_string(l) + " kv_head " + std::to_string(g));
    }
    check_identical(m->measure(plan, opt), simulate(rec, plan, opt), "the whole plan");
    // Other options than the prepared ones (the optimal allocator's calibration positions).
    SimOptions other = opt;
    other.positions = {1, 2, 3};
    check_identical(m->measure_kv_head(plan, 1, 0, other), simulate_kv_head(rec, plan, 1, 0, other), "other positions");
  }
}

TEST_CASE("CpuMeasurer: what it supports, how many at once, and a reconstruction that is not finite") {
  const Recording rec = test::random_recording(2, 1, 40, 32, 3);
  CpuMeasurer m(rec);
  CHECK(std::string(m.name()) == "cpu");
  CHECK(m.measures_regions());
  CHECK(m.unsupported_reason(uniform_plan(rec, "int4-asym-g32", "int2-asym-g32"), SimOptions{}).empty());
  CHECK(m.concurrency() == omp_get_max_threads());

  // Regions are honoured: the first 10 tokens' errors alone, as the simulator keeps them.
  const Plan int2 = uniform_plan(rec, "int2-asym-g32", "int2-asym-g32");
  ErrorRegion first_tokens;
  first_tokens.part = ErrorRegion::Part::Tokens;
  first_tokens.end = 10;
  SimOptions in_region;
  in_region.region = &first_tokens;
  const ErrorStats kept = m.measure_layer(int2, 0, in_region);
  check_identical(kept, simulate_layer(rec, int2, 0, in_region), "region");
  const ErrorStats all = m.measure_layer(int2, 0, SimOptions{});
  CHECK(find_metric("attn_kl_mean")->compute(kept) < find_metric("attn_kl_mean")->compute(all));

  // Values ~ 1e6: q4_0's fp16 scale overflows, and the KV head's measurement says so.
  Recording huge = rec;
  for (LayerTensors& L : huge.layers)
    for (float& v : L.value.data) v *= 1e6f;
  CpuMeasurer on_huge(huge);
  CHECK_THROWS_AS(on_huge.measure_kv_head(uniform_plan(huge, "keep-fp32", "q4_0"), 0, 0, SimOptions{}),
                  NonFiniteReconstruction);
}
