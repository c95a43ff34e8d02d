// The CUDA backend behind the Measurer interface (kernels/cuda_measurer.h) against the
// CPU's (sim/measurer.h): layers, KV heads and whole plans within 1e-5 relative
// (gpu_test_util.h); a reconstruction that is not finite refused alike on a KV head;
// the optimal allocator's distortion tables measured on the GPU giving the CPU's
// allocation; a sweep of optimal points on backend = "cuda" (tables on the GPU) giving
// the CPU's points; a streamed recording measured one layer on the device at a time,
// giving the held run's points bit for bit. Without a device: what the CUDA backend
// refuses, through backend.h's make_measurer() side.
#include <cmath>

#include "experiments/backend.h"
#include "experiments/config.h"
#include "experiments/data_building.h"
#include "experiments/experiment.h"
#include "experiments/streaming.h"
#include "experiments/sweep.h"
#include "gpu_test_util.h"
#include "kernels/cuda_measurer.h"
#include "kernels/cuda_simulator.h"
#include "point_results_test_util.h"
#include "streaming_test_config.h"
#include "sim/layer_stream.h"
#include "sim/formats/registry.h"
#include "sim/reconstruction.h"
#include "sim/strategies/uniform.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;
using kvb::test::CpuOnlyFormat;

namespace {

// Every unit's recency window: `size` tokens at `format`.
Plan windowed(const Recording& rec, const std::string& rest, int64_t size, const std::string& format) {
  Plan plan = uniform_plan(rec, rest, rest);
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) plan.unit(l, g, kind).window = RecentWindow{size, make_format(format)};
  return plan;
}

// The CPU side of a comparison: the fast path whose fp32 arithmetic the GPU kernels
// follow (as tests/gpu/test_attention.cpp compares).
SimOptions reference_of(SimOptions opt) {
  opt.reference = false;
  return opt;
}

double relative(double gpu, double cpu) { return std::fabs(gpu - cpu) / std::max(std::fabs(cpu), 1e-300); }

}  // namespace

TEST_SUITE("no_device") {
  TEST_CASE("the CUDA backend's refusals reach the sweep through backend_unsupported_reason") {
    const Recording& rec = test::strategy_recording();
    Plan plan = uniform_plan(rec, "int4-asym-g32", "int4-asym-g32");
    CHECK(backend_unsupported_reason(Backend::Cuda, plan, SimOptions{}).empty());
    plan.unit(1, 2, Kind::Key).segments[0].format = std::make_shared<CpuOnlyFormat>();
    const std::string why = backend_unsupported_reason(Backend::Cuda, plan, SimOptions{});
    CHECK(why == cuda::unsupported_reason(plan, SimOptions{}));
    CHECK(why.find("format 'cpu-only-double' has no CUDA twin") != std::string::npos);
    CHECK(backend_unsupported_reason(Backend::Cpu, plan, SimOptions{}).empty());
  }
}

TEST_CASE("CudaMeasurer measures layers, KV heads and whole plans as CpuMeasurer does") {
  const Recording& rec = test::strategy_recording();  // GQA: 8 query heads over 4 KV heads
  const std::unique_ptr<Measurer> gpu = make_measurer(Backend::Cuda, rec);
  CpuMeasurer cpu(rec);
  CHECK(std::string(gpu->name()) == "cuda");
  CHECK(&gpu->recording() == &rec);
  CHECK(gpu->concurrency() == 1);
  CHECK_FALSE(gpu->measures_regions());
  SimOptions opt;
  opt.topk = 8;
  opt.positions = test::calibration_of(rec);
  for (const auto& [label, plan] :
       {std::pair<std::string, Plan>{"int4/int2", uniform_plan(rec, "int4-asym-g32", "int2-asym-g32")},
        std::pair<std::string, Plan>{"int2 + window", windowed(rec, "int2-asym-g32", 16, "int8-sym-g32")}}) {
    REQUIRE(gpu->unsupported_reason(plan, opt).empty());
    for (int64_t l = 0; l < rec.num_layers(); ++l) {
      test::check_metrics_agree(cpu.measure_layer(plan, l, reference_of(opt)), gpu->measure_layer(plan, l, opt),
                                label + " layer " + std::to_string(l));
      for (int64_t g = 0; g < rec.kv_heads; ++g)
        test::check_metrics_agree(cpu.measure_kv_head(plan, l, g, reference_of(opt)),
                                  gpu->measure_kv_head(plan, l, g, opt),
                                  label + " layer " + std::to_string(l) + " kv_head " + std::to_string(g));
    }
    test::check_metrics_agree(cpu.measure(plan, reference_of(opt)), gpu->measure(plan, opt), label + " whole plan");
  }
}

TEST_CASE("a format that overflows is refused on a KV head by both backends, stored or in a window") {
  // Values ~ N(0, 1e6²): q4_0's fp16 scale (max|x| / 8) overflows to Inf.
  SyntheticSpec s = test::strategy_spec();
  s.value_scale = 1e6;
  const Recording rec = generate_synthetic(s);
  const std::unique_ptr<Measurer> gpu = make_measurer(Backend::Cuda, rec);
  CpuMeasurer cpu(rec);
  Plan stored = uniform_plan(rec, "keep-fp32", "keep-fp32");
  stored.unit(1, 3, Kind::Value).segments[0].format = make_format("q4_0");
  Plan window = uniform_plan(rec, "keep-fp32", "keep-fp32");
  window.unit(1, 3, Kind::Value).window = RecentWindow{16, make_format("q4_0")};
  for (const Plan* plan : {&stored, &window}) {
    CHECK_THROWS_AS(cpu.measure_kv_head(*plan, 1, 3, SimOptions{}), NonFiniteReconstruction);
    CHECK_THROWS_AS(gpu->measure_kv_head(*plan, 1, 3, SimOptions{}), NonFiniteReconstruction);
    // The other KV heads read no such unit.
    CHECK_NOTHROW(gpu->measure_kv_head(*plan, 1, 2, SimOptions{}));
  }
}

TEST_CASE("the optimal allocator's tables measured on the GPU give the CPU's allocation") {
  const Recording& rec = test::strategy_recording();
  Measurers measurers;
  const MeasurerFor on_cpu = measurers.source(Backend::Cpu), on_gpu = measurers.source(Backend::Cuda);
  using Values = std::map<std::string, ParamValue>;
  for (const Values& v : {Values{{"budget_bpe", 3.5}, {"family", std::string("int{b}-asym-g32")}},
                          Values{{"budget_bpe", 3.5},
                                 {"family", std::string("int{b}-asym-g32")},
                                 {"candidate_sink_tokens", IntList{1}},
                                 {"candidate_windows", IntList{8}}}}) {
    const std::unique_ptr<Strategy> s =
        require_strategy_type("optimal", "test").make(test::params_of("optimal", v));
    RecordingStats cpu_stats(rec, test::calibration_of(rec)), gpu_stats(rec, test::calibration_of(rec));
    const Plan cpu = s->build(StrategyInput{rec, 0, &cpu_stats, nullptr, &on_cpu});
    const Plan gpu = s->build(StrategyInput{rec, 0, &gpu_stats, nullptr, &on_gpu});
    const std::string label = v.count("candidate_windows") ? "protections as choices" : "widths";
    // The tables differ by float rounding only: far below the gaps the allocation turns on.
    CHECK_MESSAGE(gpu.describe() == cpu.describe(), label);
    CHECK(gpu.bpe() == cpu.bpe());
    for (const char* name : {"objective_predicted", "objective_joint", "additivity"}) {
      const double c = test::annotation(cpu, name), g = test::annotation(gpu, name);
      MESSAGE(label << " " << name << ": cpu " << c << " gpu " << g << " (relative " << relative(g, c) << ")");
      CHECK_MESSAGE(relative(g, c) <= test::kMetricRtol, label << " " << name);
    }
  }
}

TEST_CASE("a sweep of optimal points on backend = \"cuda\" calibrates on the GPU and gives the CPU's points") {
  const std::string config = (test::gpu_source_dir() / "configs" / "optimal_yardstick.toml").string();
  // One budget per block: widths only, protections as choices, calibrated on other data.
  ExperimentSpec spec = load_experiment(
      config, {"strategy.0.budget_bpe=[3.4]", "strategy.1.budget_bpe=[3.4]", "strategy.2.budget_bpe=[3.4]"});
  const Recording rec = build_recording(spec.data);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(points.size() == 3);
  BackendChoice chosen;
  spec.backend = BackendRequest::Cpu;
  const std::vector<PointResult> cpu = run_sweep(spec, rec, points, nullptr, nullptr, &chosen);
  spec.backend = BackendRequest::Cuda;
  CHECK(planning_backend(spec.backend) == Backend::Cuda);
  const std::vector<PointResult> gpu = run_sweep(spec, rec, points, nullptr, nullptr, &chosen);
  CHECK(chosen.used == Backend::Cuda);
  REQUIRE(gpu.size() == cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(points[i].display_label);
    REQUIRE_MESSAGE(gpu[i].ok, gpu[i].error);
    CHECK(gpu[i].plan == cpu[i].plan);
    CHECK(gpu[i].bpe == cpu[i].bpe);
    REQUIRE(gpu[i].metrics.size() == cpu[i].metrics.size());
    for (size_t m = 0; m < cpu[i].metrics.size(); ++m) {
      const double c = cpu[i].metrics[m], g = gpu[i].metrics[m];
      const bool same_inf = std::isinf(c) && std::isinf(g);
      CHECK_MESSAGE((same_inf || std::fabs(g - c) <= test::kMetricAtol + test::kMetricRtol * std::fabs(c)),
                    spec.metrics.report[m] << ": cpu " << c << " gpu " << g);
    }
  }
}

TEST_CASE("a streamed recording on backend = \"cuda\": one layer on the device at a time, the held run's points") {
  // The CPU streaming test's sweep (streaming_test_config.h: uniform, KIVI-2 with its
  // recency window, entropy reading the first pass's statistics, sink tokens chosen by
  // attention; attribution, which CUDA gives per layer and head), on backend = "cuda".
  ExperimentSpec spec = parse_experiment(ConfigDoc::parse(test::kStreamingConfig, "stream_cuda.toml"));
  spec.backend = BackendRequest::Cuda;
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(streams_layers(spec, points));
  const SyntheticKeep keep = synthetic_keep(spec, points, spec.data);
  const Recording held = build_recording(spec.data, keep);
  BackendChoice chosen;
  const std::vector<PointResult> want = run_sweep(spec, held, points, nullptr, nullptr, &chosen);
  CHECK(chosen.used == Backend::Cuda);

  StreamedData data = stream_recording(spec, spec.data, keep, points);
  StreamedRecording& streamed = *data.streamed;
  PlanCheck check = check_plans(spec, streamed.recording(), points, nullptr, data.stats.get());
  REQUIRE(check.errors.empty());
  const std::vector<PointResult> got = run_sweep(spec, streamed.recording(), points, nullptr, nullptr, &chosen, nullptr,
                                                 nullptr, &check, &streamed);
  CHECK(chosen.used == Backend::Cuda);
  // The same kernels on the same operands, layer by layer: the held run's bits.
  test::check_same_results(want, got);
  CHECK(streamed.loads() == 2 * held.num_layers());
  // On the host, the layer measured and the next, loaded meanwhile (prefetched while the
  // device measures); the device holds the measured one only.
  CHECK(streamed.max_layers_held() == 2);
  CHECK(streamed.layers_held() == 0);

  // A streamed simulator measures only the layer it was given.
  cuda::CudaSimulator sim(streamed.recording(), MatmulPrecision::Fp32, /*layers_streamed=*/true);
  const Plan plan = uniform_plan(held, "int4-asym-g32", "int4-asym-g32");
  SimOptions opt;
  opt.positions = {964, 1000, 1020};  // evaluated positions: their queries are kept
  CHECK_THROWS_WITH_AS(sim.simulate_layer(plan, 1, opt), doctest::Contains("is not on the device"), Error);
  {
    const HeldLayer layer(streamed, 1);
    sim.upload_layer(1);
    const ErrorStats one = sim.simulate_layer(plan, 1, opt);
    cuda::CudaSimulator whole(held);
    const ErrorStats all = whole.simulate_layer(plan, 1, opt);
    REQUIRE(one.rows.size() == all.rows.size());
    for (size_t r = 0; r < one.rows.size(); ++r) CHECK(one.rows[r].kl == all.rows[r].kl);
    sim.drop_layer(1);
  }
  CHECK_THROWS_WITH_AS(sim.simulate_layer(plan, 1, opt), doctest::Contains("is not on the device"), Error);
  cuda::CudaSimulator whole(held);
  CHECK_THROWS_WITH_AS(whole.upload_layer(0), doctest::Contains("uploaded whole"), Error);
}
