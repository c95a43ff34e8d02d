// The CUDA attention-error path (kernels/cuda_simulator.h) against the CPU simulator:
// every tensor- and attention-level metric within 1e-5 relative (gpu_test_util.h), on
// random recordings with GQA and on the bundled real recordings, under segments,
// sliding and chunked windows (replacing and extra copy), prefill, evaluated-position
// subsets, several top-k, and logit shifts large enough for the max-shifted softmax.
// Also the sweep on backend = "cuda" / "auto", and (no device needed) which plans the
// CUDA backend refuses.
#include <cmath>
#include <random>

#include "experiments/data_building.h"
#include "experiments/experiment.h"
#include "experiments/sweep.h"
#include "gpu_test_util.h"
#include "kernels/cuda_simulator.h"
#include "sim/formats/registry.h"
#include "sim/metrics/attention_shift.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;
using kvb::test::CpuOnlyFormat;

namespace {

// [layers] of queries [q_heads, T, d] and keys/values [kv_heads, T, d], N(0, 1) with
// queries scaled by `sharpness` (peaked attention) and keys by `key_scale`.
Recording random_recording(int64_t layers, int64_t q_heads, int64_t kv_heads, int64_t T, int64_t d, uint64_t seed,
                           float sharpness = 2.0f, float key_scale = 1.0f) {
  Recording r;
  r.name = "random";
  r.source = "test seed " + std::to_string(seed);
  r.q_heads = q_heads;
  r.kv_heads = kv_heads;
  r.tokens = T;
  r.head_dim = d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t l = 0; l < layers; ++l) {
    LayerTensors L;
    L.query = Tensor({q_heads, T, d});
    L.key = Tensor({kv_heads, T, d});
    L.value = Tensor({kv_heads, T, d});
    for (float& v : L.query.data) v = sharpness * normal(rng);
    for (float& v : L.key.data) v = key_scale * normal(rng);
    for (float& v : L.value.data) v = normal(rng);
    r.layers.push_back(std::move(L));
    r.layer_ids.push_back(static_cast<int>(l));
  }
  r.validate();
  return r;
}

void set_window(Plan& plan, Kind kind, int64_t size, const std::string& format, RecentWindow::Mode mode, bool copy) {
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g) {
      RecentWindow& w = plan.unit(l, g, kind).window;
      w.size = size;
      w.format = make_format(format);
      w.mode = mode;
      w.extra_copy = copy;
    }
}

// Sinks: the first `sinks` tokens of every unit in `sink_format`, the rest in `rest`.
void set_sinks(Plan& plan, int64_t sinks, const std::string& sink_format, const std::string& rest) {
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind k : {Kind::Key, Kind::Value})
        plan.unit(l, g, k).segments = {Segment{0, sinks, make_format(sink_format)},
                                       Segment{sinks, plan.tokens(), make_format(rest)}};
}

double worst = 0;
std::string worst_case;

// Compares the GPU's rows with the CPU's fast path; returns the CPU's stats (for the
// caller's checks of which forms its rows took).
ErrorStats compare(const Recording& rec, const Plan& plan, const SimOptions& opt, const std::string& label) {
  REQUIRE(plan.check().empty());
  REQUIRE(cuda::unsupported_reason(plan, opt).empty());
  // The GPU kernels follow the CPU's fast path (sim/attention_error_fast.cpp: fp32 rows
  // from the exact pass, the fp64 reference form for rows with large logit shifts):
  // compared with it; it agrees with the reference within 1e-5
  // (tests/test_attention_fast.cpp).
  const ErrorStats cpu = simulate(rec, plan, opt);
  cuda::CudaSimulator gpu(rec);
  const ErrorStats dev = gpu.simulate(plan, opt);
  const test::MetricAgreement a = test::check_metrics_agree(cpu, dev, label);
  if (a.worst_rel > worst) {
    worst = a.worst_rel;
    worst_case = label + ": " + a.worst_metric;
  }
  return cpu;
}

// How many rows take each form of the row kernels (sim/metrics/attention_shift.h), in
// all rows and in rows of more than 4096 keys (the block-per-row kernels).
struct FormCounts {
  int64_t large = 0, by_exp = 0, large_long = 0, by_exp_long = 0;
};

FormCounts form_counts(const ErrorStats& s) {
  FormCounts c;
  for (const AttentionRow& r : s.rows) {
    const bool large = attn_large_shift(r.logit_err_max) || !std::isfinite(r.logit_err_max);
    const bool by_exp = !large && attn_phat_by_exp(r.logit_err_max);
    const bool long_row = r.position + 1 > 4096;
    c.large += large;
    c.by_exp += by_exp;
    c.large_long += large && long_row;
    c.by_exp_long += by_exp && long_row;
  }
  return c;
}

SimOptions options(int64_t topk, std::vector<int64_t> positions = {}) {
  SimOptions o;
  o.topk = topk;
  o.positions = std::move(positions);
  return o;
}

}  // namespace

TEST_SUITE("no_device") {
  TEST_CASE("the CUDA backend names the format it cannot run, and the top-k it cannot compute") {
    const Recording rec = random_recording(2, 4, 2, 16, 8, 1);
    Plan plan = uniform_plan(rec, "int4-asym-g8", "int4-asym-g8");
    CHECK(cuda::unsupported_reason(plan, SimOptions{}).empty());
    plan.unit(1, 1, Kind::Value).segments[0].format = std::make_shared<CpuOnlyFormat>();
    const std::string why = cuda::unsupported_reason(plan, SimOptions{});
    CHECK(why.find("format 'cpu-only-double' has no CUDA twin") != std::string::npos);
    CHECK(why.find("layer 1 kv_head 1 V") != std::string::npos);
    Plan windowed = uniform_plan(rec, "int4-asym-g8", "int4-asym-g8");
    windowed.unit(0, 0, Kind::Key).window = RecentWindow{4, std::make_shared<CpuOnlyFormat>()};
    CHECK(cuda::unsupported_reason(windowed, SimOptions{}).find("window") != std::string::npos);
    CHECK(cuda::unsupported_reason(uniform_plan(rec, "keep-fp16", "keep-fp16"), options(65)).find("topk") !=
          std::string::npos);
    const ErrorRegion region;
    SimOptions attributed;
    attributed.region = &region;
    CHECK(cuda::unsupported_reason(plan, attributed).find("attribution") != std::string::npos);
  }
  TEST_CASE("the comparison itself: the CPU's stats agree with themselves on every measured metric") {
    // So that a device run fails only on a real CPU/GPU difference (model-level
    // metrics, NaN without a model, are not compared).
    const Recording rec = random_recording(2, 4, 2, 32, 16, 3);
    const ErrorStats cpu = simulate(rec, uniform_plan(rec, "int3-asym-g8", "int2-sym-tok"), options(4));
    const test::MetricAgreement a = test::check_metrics_agree(cpu, cpu, "cpu vs itself");
    CHECK(a.worst_rel == 0);
  }
}

TEST_CASE("uniform formats on random GQA recordings: every metric within 1e-5 of the CPU") {
  const Recording rec = random_recording(2, 8, 2, 300, 64, 11);
  compare(rec, uniform_plan(rec, "int4-asym-g32", "int4-asym-g32"), options(8), "int4-asym-g32");
  compare(rec, uniform_plan(rec, "int2-asym-ch32", "int2-asym-g32-sbf16-zfp32"), options(8), "int2 ch32 keys");
  compare(rec, uniform_plan(rec, "int3-sym-tok", "int1-sym-g16"), options(1), "int3 tok / int1, top-1");
  compare(rec, uniform_plan(rec, "int8-sym-g64-sfp32", "keep-bf16"), options(64), "int8 / bf16, top-64");
  compare(rec, uniform_plan(rec, "int3-asym-ch", "int5-asym-ch300"), options(8), "whole-span channels");
  compare(rec, uniform_plan(rec, "q4_0", "iq4_nl-ntry7"), options(8), "ggml q4_0 / iq4_nl-ntry7");
  compare(rec, uniform_plan(rec, "q5_1", "q8_0"), options(8), "ggml q5_1 / q8_0");
  compare(rec, uniform_plan(rec, "fp8-e4m3-cal64", "fp8-e5m2-tok"), options(8), "fp8 calibrated / per token");
  compare(rec, uniform_plan(rec, "mxfp4", "nvfp4"), options(8), "mxfp4 / nvfp4");
  compare(rec, uniform_plan(rec, "nf4-g32", "nf4-g64-sfp32"), options(8), "nf4");
}

TEST_CASE("an fp32 cache gives exactly zero error on the GPU too") {
  const Recording rec = random_recording(1, 4, 4, 64, 32, 3);
  cuda::CudaSimulator gpu(rec);
  const ErrorStats s = gpu.simulate(uniform_plan(rec, "keep-fp32", "keep-fp32"), SimOptions{});
  REQUIRE(s.rows.size() == 4u * 64u);
  for (const AttentionRow& r : s.rows) {
    CHECK(r.kl == 0.0f);
    CHECK(r.out_err2 == 0.0f);
    CHECK(r.logit_err2 == 0.0f);
    CHECK(r.topk_overlap == 1.0f);
    CHECK(r.out_norm2 > 0.0f);
  }
  CHECK(s.k_err2 == 0.0);
  CHECK(s.k_norm2 > 0.0);
}

TEST_CASE("time semantics: sinks, sliding and chunked windows, extra copies and prefill match the CPU") {
  const Recording rec = random_recording(2, 6, 3, 257, 64, 21);
  {
    Plan p = uniform_plan(rec, "int2-asym-g32", "int2-asym-g32");
    set_sinks(p, 4, "keep-fp16", "int2-asym-g32");
    compare(rec, p, options(8), "sinks");
  }
  {
    Plan p = uniform_plan(rec, "nvfp4", "fp8-e4m3-cal16");  // span scales per segment
    set_sinks(p, 5, "q8_0", "nvfp4");
    set_window(p, Kind::Value, 32, "fp8-e5m2-cal8", RecentWindow::Mode::Sliding, false);
    compare(rec, p, options(8), "sinks and windows with span-calibrated formats");
  }
  {
    Plan p = uniform_plan(rec, "int2-asym-g32", "int3-sym-g32");
    set_window(p, Kind::Key, 32, "keep-fp16", RecentWindow::Mode::Sliding, false);
    set_window(p, Kind::Value, 32, "keep-fp16", RecentWindow::Mode::Sliding, false);
    p.set_prefill(64);
    compare(rec, p, options(8), "sliding K/V window 32, prefill 64");
  }
  {
    Plan p = uniform_plan(rec, "int1-sym-g32", "int4-asym-g32");
    set_window(p, Kind::Key, 48, "int8-sym-tok", RecentWindow::Mode::Chunked, false);
    compare(rec, p, options(8), "chunked K window 48 (int8 window), no V window");
  }
  {
    Plan p = uniform_plan(rec, "int4-asym-g32", "int2-asym-ch32");
    set_window(p, Kind::Value, 40, "keep-fp16", RecentWindow::Mode::Chunked, true);
    p.set_prefill(100);
    compare(rec, p, options(4), "chunked V window 40 as an extra copy, prefill 100");
  }
  {
    Plan p = uniform_plan(rec, "int2-asym-g32", "int2-asym-g32");
    set_sinks(p, 8, "keep-bf16", "int3-asym-ch32");
    set_window(p, Kind::Key, 16, "keep-fp16", RecentWindow::Mode::Sliding, true);
    set_window(p, Kind::Value, 64, "keep-fp32", RecentWindow::Mode::Chunked, false);
    p.set_prefill(30);
    compare(rec, p, options(8, {0, 1, 2, 29, 30, 31, 63, 64, 100, 200, 256}), "everything, position subset");
  }
  {
    Plan p = uniform_plan(rec, "int4-asym-g32", "int4-asym-g32");
    p.set_prefill(rec.tokens);  // the whole recording is prompt: no error at all
    compare(rec, p, options(8), "prefill of every token");
  }
}

TEST_CASE("large logit shifts use the max-shifted softmax on both sides") {
  // Large keys quantized to 1 bit: |Δs| reaches hundreds of nats.
  const Recording rec = random_recording(1, 4, 2, 200, 64, 31, 1.0f, 12.0f);
  const Plan p = uniform_plan(rec, "int1-asym-g64", "int2-asym-g64");
  const ErrorStats cpu = compare(rec, p, options(8), "large logit shifts");
  CHECK(find_metric("logit_err_max")->compute(cpu) > 30.0);
  // Both forms of such rows: the fp64 large-shift form (774 of 800 rows) and p̂ by its
  // own exp (26 rows with 4 <= max|Δs| < 30).
  const FormCounts forms = form_counts(cpu);
  CHECK(forms.large > 100);
  CHECK(forms.by_exp > 10);
}

TEST_CASE("large-shift and by-exp rows of more than 4096 keys (a block per row) match the CPU") {
  // Keys scaled by 12: every row's max|Δs| >= 30 (the fp64 large-shift form); by 3:
  // every row's 4 <= max|Δs| < 30 (p̂ by its own exp). Positions on both sides of 4096
  // keys (kWarpRowKeys: row blocks of more keys take a block per row); top-8 in
  // registers, top-16 in local memory: all four block-per-row kernels. The CPU's rows
  // are checked to take the form the case is about, so that it keeps covering it.
  const std::vector<int64_t> positions = {100, 4095, 4096, 4097, 4200, 4300, 4400, 4499};
  for (const float key_scale : {12.0f, 3.0f}) {
    const Recording rec = random_recording(1, 4, 2, 4500, 32, 43, 1.0f, key_scale);
    const Plan p = uniform_plan(rec, "int1-asym-g32", "int2-asym-g32");
    for (const int64_t topk : {8, 16}) {
      const std::string label = "4500 keys, key scale " + std::to_string(static_cast<int>(key_scale)) + ", top-" +
                                std::to_string(topk);
      const ErrorStats cpu = compare(rec, p, options(topk, positions), label);
      INFO(label);
      REQUIRE(cpu.rows.size() == 32u);  // 4 query heads x 8 positions; 24 rows of more than 4096 keys
      const FormCounts forms = form_counts(cpu);
      if (key_scale == 12.0f) {
        CHECK(forms.large == 32);
        CHECK(forms.large_long == 24);
      } else {
        CHECK(forms.by_exp == 32);
        CHECK(forms.by_exp_long == 24);
      }
    }
  }
}

TEST_CASE("rows of more than 4096 keys (a block per row) and a few positions match the CPU") {
  const Recording rec = random_recording(1, 8, 2, 4500, 32, 41);
  const std::vector<int64_t> positions = {0, 7, 1000, 4095, 4096, 4097, 4300, 4499};
  compare(rec, uniform_plan(rec, "int4-asym-g32", "int2-asym-ch32"), options(8, positions), "4500 keys");
  Plan p = uniform_plan(rec, "int2-asym-g32", "int3-sym-g32");
  set_window(p, Kind::Key, 128, "keep-fp16", RecentWindow::Mode::Sliding, false);
  set_window(p, Kind::Value, 256, "int8-sym-tok", RecentWindow::Mode::Chunked, true);
  compare(rec, p, options(16, positions), "4500 keys, windows");
}

TEST_CASE("one simulator over several plans (the exact attention's norms reused) matches the CPU each time") {
  // A sweep measures every point on one simulator: the first plan computes o = P·V per
  // layer, the later ones reuse ||o||² (also after plans with windows, batched apart).
  const Recording rec = random_recording(2, 8, 4, 300, 64, 51);
  cuda::CudaSimulator gpu(rec);
  Plan windowed = uniform_plan(rec, "int2-asym-g32", "int2-asym-g32");
  set_window(windowed, Kind::Value, 32, "keep-fp16", RecentWindow::Mode::Sliding, false);
  windowed.unit(1, 2, Kind::Key).window = RecentWindow{16, make_format("keep-fp16")};  // one unit apart
  const std::vector<Plan> plans = {uniform_plan(rec, "int4-asym-g32", "int4-asym-g32"), windowed,
                                   uniform_plan(rec, "int8-sym-tok", "int3-asym-ch32")};
  for (const std::vector<int64_t>& positions : {std::vector<int64_t>{}, std::vector<int64_t>{3, 100, 299}})
    for (size_t i = 0; i < plans.size(); ++i) {
      const SimOptions reference = options(8, positions);  // the CPU's fast path, as compare()
      const ErrorStats cpu = simulate(rec, plans[i], reference);
      const ErrorStats dev = gpu.simulate(plans[i], options(8, positions));
      test::check_metrics_agree(cpu, dev, "plan " + std::to_string(i) + ", " + std::to_string(positions.size()) +
                                              " positions (0: all)");
      // The KV-head path (the optimal allocator's) on the same simulator.
      const ErrorStats head = gpu.simulate_kv_head(plans[i], 1, 2, options(8, positions));
      test::check_metrics_agree(simulate_kv_head(rec, plans[i], 1, 2, reference), head,
                                "plan " + std::to_string(i) + ", layer 1 KV head 2");
    }
}

TEST_CASE("a recording that keeps sampled queries gives the full recording's rows") {
  const Recording full = random_recording(2, 8, 2, 400, 64, 61);
  const std::vector<int64_t> kept = {5, 90, 200, 333, 399};
  Recording sampled = full;
  for (LayerTensors& lt : sampled.layers) {
    Tensor q({full.q_heads, static_cast<int64_t>(kept.size()), full.head_dim});
    for (int64_t h = 0; h < full.q_heads; ++h)
      for (size_t i = 0; i < kept.size(); ++i)
        std::copy_n(lt.query_row(h, kept[i]), full.head_dim,
                    q.slice(h) + static_cast<int64_t>(i) * full.head_dim);
    lt.query = std::move(q);
    lt.query_positions = kept;
  }
  const Plan p = uniform_plan(full, "int4-asym-g32", "int2-asym-ch32");
  const std::vector<int64_t> read = {90, 333, 399};
  cuda::CudaSimulator on_full(full), on_sampled(sampled);
  const ErrorStats a = on_full.simulate(p, options(8, read)), b = on_sampled.simulate(p, options(8, read));
  REQUIRE(a.rows.size() == b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i)
    for (const AttentionRowValue& v : kAttentionRowValues) CHECK(a.rows[i].*v.member == b.rows[i].*v.member);
  CHECK_THROWS_WITH_AS(on_sampled.simulate(p, options(8, {90, 91})), doctest::Contains("position 91 was not kept"),
                       Error);
}

TEST_CASE("the bundled real recordings (GQA llama-bytes, gpt2-bytes) match the CPU") {
  // Hugging Face's recordings as the repository keeps them (data/reference/: 128 tokens,
  // first and last layer), so that a GPU machine given only the repository's files has
  // them; data/records/ is made by the build (data/CMakeLists.txt).
  for (const char* file : {"llama-bytes-record-slice.safetensors", "gpt2-bytes-record-slice.safetensors"}) {
    RecordingSpec rs;
    rs.path = test::gpu_data_dir() / "reference" / file;
    rs.layers = {0, 5};  // the slice's layers
    const Recording rec = load_recording(rs);
    compare(rec, uniform_plan(rec, "int4-asym-g32", "int4-asym-g32"), options(8), std::string(file) + " int4");
    compare(rec, uniform_plan(rec, "int2-asym-ch32", "int2-asym-tok"), options(8), std::string(file) + " KIVI-2");
    Plan p = uniform_plan(rec, "int3-sym-g32", "int3-sym-g32");
    set_sinks(p, 4, "keep-fp16", "int3-sym-g32");
    set_window(p, Kind::Key, 64, "keep-fp16", RecentWindow::Mode::Sliding, false);
    set_window(p, Kind::Value, 32, "keep-fp16", RecentWindow::Mode::Chunked, false);
    p.set_prefill(32);
    compare(rec, p, options(8), std::string(file) + " sinks + windows + prefill");
  }
  MESSAGE("worst relative metric difference over all plans: " << worst << " (" << worst_case << ")");
}

TEST_CASE("a sweep on backend = \"cuda\" and \"auto\" gives the CPU's points") {
  const std::string config = (test::gpu_source_dir() / "configs" / "quickstart.toml").string();
  const std::string rec_path = (test::gpu_data_dir() / "reference" / "gpt2-bytes-record-slice.safetensors").string();
  ExperimentSpec spec = load_experiment(config, {"data.path=\"" + rec_path + "\"", "data.layers=[0, 5]",
                                                 "data.max_tokens=128", "strategy.0.vars.bits=[2, 4]"});
  const Recording rec = build_recording(spec.data);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  BackendChoice chosen;
  spec.backend = BackendRequest::Cpu;
  const std::vector<PointResult> cpu = run_sweep(spec, rec, points, nullptr, nullptr, &chosen);
  CHECK(chosen.used == Backend::Cpu);
  for (BackendRequest req : {BackendRequest::Cuda, BackendRequest::Auto}) {
    spec.backend = req;
    const std::vector<PointResult> gpu = run_sweep(spec, rec, points, nullptr, nullptr, &chosen);
    CHECK(chosen.used == Backend::Cuda);
    CHECK(!chosen.device.empty());
    MESSAGE(std::string(backend_request_name(req)) << ": " << chosen.reason << " on " << chosen.device);
    REQUIRE(gpu.size() == cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      REQUIRE(gpu[i].ok);
      REQUIRE(gpu[i].metrics.size() == cpu[i].metrics.size());
      CHECK(gpu[i].bpe == cpu[i].bpe);
      for (size_t m = 0; m < cpu[i].metrics.size(); ++m) {
        const double c = cpu[i].metrics[m], g = gpu[i].metrics[m];
        const bool same_inf = std::isinf(c) && std::isinf(g);
        CHECK_MESSAGE((same_inf || std::fabs(g - c) <= test::kMetricAtol + test::kMetricRtol * std::fabs(c)),
                      points[i].key << " " << spec.metrics.report[m] << ": cpu " << c << " gpu " << g);
      }
    }
  }
}
