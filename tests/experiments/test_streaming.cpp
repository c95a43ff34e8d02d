// Layer streaming (experiments/streaming.h, sim/layer_stream.h): a run that holds one
// layer of its synthetic recording at a time gives the held run's results bit for bit,
// and holds at most one layer at once (counted by the StreamedRecording, not measured as
// memory); which runs stream, and why not.
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "experiments/data_building.h"
#include "experiments/query_positions.h"
#include "experiments/shard.h"
#include "experiments/streaming.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "sim/io/recording_writer.h"
#include "sim/synthetic.h"
#include "point_results_test_util.h"
#include "streaming_test_config.h"
#include "test_util.h"

using namespace kvb;
using kvb::test::check_same_results;

namespace {

ExperimentSpec parse(const std::string& text) { return parse_experiment(ConfigDoc::parse(text, "test.toml")); }

// The shared streamed sweep (streaming_test_config.h).
const std::string& kConfig = kvb::test::kStreamingConfig;

// Two phases (the second from token 768, at marker 257) of different key redundancy,
// and points whose plans read ρ (phase, taqg: by marker, fraction and index, over all
// layers and subsets, one layer twice), next to one reading the attention statistics,
// with attribution of a taqg point (its token regions split at the boundary).
const std::string kPhaseConfig = R"(
backend = "cpu"

[data]
stream_layers = true

[data.synthetic]
layers = 3
q_heads = 4
kv_heads = 2
head_dim = 32
tokens = 1024
entropy_mean = 5.0
recency = 1.0
rope = true
phase_fraction = 0.75
rho_first = 0.3
rho_second = 0.5
phase_marker = 257
calibration_queries = 32

[[strategy]]
type = "taqg"
low_bits = 4
family = "int{b}-asym-g32"
phase_marker = 257
rho_layers = [2, 0]

[[strategy]]
type = "taqg"
budget_bpe = 4.0
family = "int{b}-asym-g32"
rule = "water-filling"
phase_fraction = 0.6

[[strategy]]
type = "phase"
first_format = "int4-asym-g32"
second_format = "int2-asym-g32"
phase_index = 500
rho_layers = [1, 1]

[[strategy]]
type = "phase"
budget_bpe = 4.0
family = "int{b}-asym-g32"
phase_marker = 257
split = 1.0

[[strategy]]
type = "entropy"
budget_bpe = 4.0
family = "int{b}-asym-g32"

[calibration]
positions = "900..963:8"

[metrics]
positions = "964..1023:4"

[attribution]
points = [0]
)";

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("streaming: the generator one layer at a time gives generate_synthetic's recording and report") {
  const ExperimentSpec spec = parse(kConfig);
  const SyntheticKeep keep = synthetic_keep(spec, expand_sweep(spec), spec.data);
  SyntheticReport held_report, streamed_report;
  const Recording held = generate_synthetic(spec.data.synthetic, &held_report, keep);
  SyntheticLayers layers(spec.data.synthetic, keep);
  Recording rec = layers.skeleton();
  REQUIRE(rec.num_layers() == held.num_layers());
  CHECK(rec.layers[1].key.empty());
  CHECK(rec.layers[1].query_positions == held.layers[1].query_positions);
  CHECK_THROWS_WITH_AS(layers.finish(rec), doctest::Contains("before layer 0 was generated"), Error);
  for (int64_t l : {2, 0, 1, 2}) layers.generate_into(rec, l);  // any order, a layer twice: the same tensors
  layers.finish(rec, &streamed_report);
  for (size_t l = 0; l < held.layers.size(); ++l) {
    INFO("layer " << l);
    CHECK(same_tensor(rec.layers[l].query, held.layers[l].query));
    CHECK(same_tensor(rec.layers[l].key, held.layers[l].key));
    CHECK(same_tensor(rec.layers[l].value, held.layers[l].value));
    CHECK(same_tensor(rec.layers[l].key_pre_rope, held.layers[l].key_pre_rope));
    CHECK(streamed_report.layers[l].rho_first == held_report.layers[l].rho_first);
  }
  CHECK(rec.metadata == held.metadata);
  CHECK(streamed_report.warnings == held_report.warnings);
  CHECK(recording_identity(rec) == recording_identity(held));
}

TEST_CASE("streaming: a sweep holding one layer at a time gives the held sweep's results bit for bit") {
  const ExperimentSpec spec = parse(kConfig);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(streams_layers(spec, points));
  REQUIRE(points_need_statistics(points));
  const SyntheticKeep keep = synthetic_keep(spec, points, spec.data);
  const Recording held = build_recording(spec.data, keep);

  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    omp_set_num_threads(threads);
    const std::vector<PointResult> want = run_sweep(spec, held, points, nullptr, nullptr);
    StreamedData data = stream_recording(spec, spec.data, keep, points);
    StreamedRecording& streamed = *data.streamed;
    const Recording& rec = streamed.recording();
    // The first pass: every layer once, one at a time, none held after.
    CHECK(streamed.loads() == held.num_layers());
    CHECK(streamed.max_layers_held() == 1);
    CHECK(streamed.layers_held() == 0);
    CHECK(rec.layers[0].key.empty());
    CHECK(data.identity == recording_identity(held));
    CHECK(rec.metadata == held.metadata);
    PlanCheck check = check_plans(spec, rec, points, nullptr, data.stats.get());
    REQUIRE(check.errors.empty());
    CHECK(streamed.loads() == held.num_layers());  // plans read the statistics, no layer
    const std::vector<PointResult> got =
        run_sweep(spec, rec, points, nullptr, nullptr, nullptr, nullptr, nullptr, &check, &streamed);
    check_same_results(want, got);
    // The sweep: every layer once more, still one at a time.
    CHECK(streamed.loads() == 2 * held.num_layers());
    CHECK(streamed.max_layers_held() == 1);
    CHECK(streamed.layers_held() == 0);
    REQUIRE(got.size() == points.size());
    CHECK(got[0].attribution.has_value());
  }
  omp_set_num_threads(saved);
}

TEST_CASE("streaming: a recording file read one layer at a time gives load_recording's recording and results") {
  ExperimentSpec spec = parse(kConfig);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  // Every query and the pre-RoPE keys, as a file holds them.
  const std::filesystem::path file = test::scratch_dir("streaming_file") / "rec.safetensors";
  write_recording(file, generate_synthetic(spec.data.synthetic), DType::F32);
  spec.data.source = DataSpec::Source::File;
  spec.data.file = RecordingSpec{};
  spec.data.file.path = file;

  // Read layer by layer (in any order, a layer twice), cut to max_tokens or not.
  for (int64_t max_tokens : {int64_t{0}, int64_t{700}}) {
    INFO("max_tokens " << max_tokens);
    RecordingSpec rs = spec.data.file;
    rs.max_tokens = max_tokens;
    const Recording held = load_recording(rs);
    const RecordingFileLayers layers(rs);
    Recording rec = layers.skeleton();
    CHECK(rec.tokens == held.tokens);
    CHECK(rec.layers[0].key.empty());
    for (int64_t l : {1, 0, 2, 1}) layers.load_into(rec, l);
    for (size_t l = 0; l < held.layers.size(); ++l) {
      CHECK(same_tensor(rec.layers[l].query, held.layers[l].query));
      CHECK(same_tensor(rec.layers[l].key, held.layers[l].key));
      CHECK(same_tensor(rec.layers[l].value, held.layers[l].value));
      CHECK(same_tensor(rec.layers[l].key_pre_rope, held.layers[l].key_pre_rope));
    }
    CHECK(rec.token_ids == held.token_ids);
    CHECK(rec.positions == held.positions);
    CHECK(rec.rope.applied == held.rope.applied);
    CHECK(rec.metadata == held.metadata);
    CHECK(recording_identity(rec) == recording_identity(held));
  }

  // The sweep: the held recording's results, one layer held at a time.
  REQUIRE(streams_layers(spec, points));
  const Recording held = build_recording(spec.data);
  const std::vector<PointResult> want = run_sweep(spec, held, points, nullptr, nullptr);
  StreamedData data = stream_recording(spec, spec.data, {}, points);
  CHECK(data.identity == recording_identity(held));
  PlanCheck check = check_plans(spec, data.streamed->recording(), points, nullptr, data.stats.get());
  REQUIRE(check.errors.empty());
  const std::vector<PointResult> got = run_sweep(spec, data.streamed->recording(), points, nullptr, nullptr, nullptr,
                                                 nullptr, nullptr, &check, data.streamed.get());
  check_same_results(want, got);
  CHECK(data.streamed->loads() == 2 * held.num_layers());
  CHECK(data.streamed->max_layers_held() == 1);
  // Not automatic for a file (its size is known once it is open).
  spec.data.stream_layers.reset();
  CHECK_FALSE(streams_layers(spec, points));
}

TEST_CASE("streaming: phase and taqg points plan on rho computed one layer at a time, as held bit for bit") {
  const ExperimentSpec spec = parse(kPhaseConfig);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(streaming_obstacle(spec, points).empty());
  REQUIRE(streams_layers(spec, points));
  const SyntheticKeep keep = synthetic_keep(spec, points, spec.data);
  const Recording held = build_recording(spec.data, keep);
  REQUIRE(held.token_ids[768] == 257);

  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    omp_set_num_threads(threads);
    const std::vector<PointResult> want = run_sweep(spec, held, points, nullptr, nullptr);
    StreamedData data = stream_recording(spec, spec.data, keep, points);
    StreamedRecording& streamed = *data.streamed;
    const Recording& rec = streamed.recording();
    // The ranges: [0, 768) and [768, 1024) over layers 2, 0 (the taqg point at the
    // marker) and over every layer (the phase point at it), [0, 614) and [614, 1024)
    // over every layer, [0, 500) and [500, 1024) over layer 1 twice.
    CHECK(points_key_rho_ranges(points, rec).size() == 8);
    CHECK(streamed.max_layers_held() == 1);
    CHECK(streamed.layers_held() == 0);
    REQUIRE(data.stats);
    PlanCheck check = check_plans(spec, rec, points, nullptr, data.stats.get());
    REQUIRE(check.errors.empty());
    CHECK(streamed.loads() == held.num_layers());  // plans read the stored rho, no layer
    const std::vector<PointResult> got =
        run_sweep(spec, rec, points, nullptr, nullptr, nullptr, nullptr, nullptr, &check, &streamed);
    check_same_results(want, got);
    CHECK(streamed.loads() == 2 * held.num_layers());
    CHECK(streamed.max_layers_held() == 1);
    REQUIRE(got.size() == points.size());
    for (const PointResult& r : got) {
      INFO("point " << r.id << ": " << r.error);
      CHECK(r.error.empty());
    }
    CHECK(got[0].attribution.has_value());
  }
  omp_set_num_threads(saved);

  // Without a point reading the attention statistics: the rho alone is computed.
  ExperimentSpec rho_only = spec;
  rho_only.strategies.pop_back();  // the entropy point
  const std::vector<SweepPoint> rho_points = expand_sweep(rho_only);
  REQUIRE_FALSE(points_need_statistics(rho_points));
  StreamedData data = stream_recording(rho_only, rho_only.data, keep, rho_points);
  REQUIRE(data.stats);
  PlanCheck check = check_plans(rho_only, data.streamed->recording(), rho_points, nullptr, data.stats.get());
  REQUIRE(check.errors.empty());
  check_same_results(run_sweep(rho_only, held, rho_points, nullptr, nullptr),
                     run_sweep(rho_only, data.streamed->recording(), rho_points, nullptr, nullptr, nullptr, nullptr,
                               nullptr, &check, data.streamed.get()));
}

TEST_CASE("streaming: a phase or taqg point that cannot plan on the data gives the held run's error") {
  for (const char* bad : {"rho_layers = [0, 3]", "phase_marker = 999", "phase_index = 1023"}) {
    INFO(bad);
    const ExperimentSpec spec = parse(kConfig + "\n[[strategy]]\ntype = \"taqg\"\nlow_bits = 4\n"
                                                "family = \"int{b}-asym-g32\"\n" + bad + "\n");
    const std::vector<SweepPoint> points = expand_sweep(spec);
    REQUIRE(streams_layers(spec, points));
    const SyntheticKeep keep = synthetic_keep(spec, points, spec.data);
    const Recording held = build_recording(spec.data, keep);
    const PlanCheck want = check_plans(spec, held, points);
    StreamedData data = stream_recording(spec, spec.data, keep, points);  // no error in the first pass
    const PlanCheck got = check_plans(spec, data.streamed->recording(), points, nullptr, data.stats.get());
    REQUIRE(want.errors.size() == 1);
    CHECK(got.errors == want.errors);
    CHECK(data.streamed->max_layers_held() == 1);
  }
}

TEST_CASE("streaming: which runs stream their layers, and why not") {
  const ExperimentSpec spec = parse(kConfig);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  CHECK(streaming_obstacle(spec, points).empty());

  // Automatic (stream_layers not given): only when the keys and values are large.
  ExperimentSpec automatic = spec;
  automatic.data.stream_layers.reset();
  CHECK_FALSE(streams_layers(automatic, points));
  automatic.data.synthetic.layers = 32;
  automatic.data.synthetic.kv_heads = 8;
  automatic.data.synthetic.head_dim = 128;
  automatic.data.synthetic.tokens = 65536;  // 4 GiB of keys and values
  CHECK(streams_layers(automatic, points));
  ExperimentSpec off = automatic;
  off.data.stream_layers = false;
  CHECK_FALSE(streams_layers(off, points));

  // phase and taqg read rho, computed in the first pass: they stream.
  const ExperimentSpec phases = parse(kPhaseConfig);
  CHECK(streaming_obstacle(phases, expand_sweep(phases)).empty());

  // A strategy that reads the layers' tensors while planning.
  const ExperimentSpec optimal = parse(kConfig + R"(
[[strategy]]
type = "optimal"
budget_bpe = 4.0
family = "int{b}-asym-g32"
)");
  const std::vector<SweepPoint> with_optimal = expand_sweep(optimal);
  CHECK(streaming_obstacle(optimal, with_optimal).find("strategy type 'optimal'") != std::string::npos);
  CHECK_THROWS_WITH_AS(streams_layers(optimal, with_optimal),
                       doctest::Contains("test.toml:5: data.stream_layers: stream_layers = true, but"), ConfigError);
  automatic = optimal;
  automatic.data.stream_layers.reset();
  automatic.data.synthetic.tokens = 1 << 24;
  CHECK_FALSE(streams_layers(automatic, with_optimal));  // held, without a word

  // Data cut after generation, several sequences; the CUDA backend streams too (it
  // uploads the held layer alone: tests/gpu/test_measurer.cpp).
  ExperimentSpec cut = spec;
  cut.data.max_tokens = 1000;
  CHECK(streaming_obstacle(cut, points).find("data.max_tokens") != std::string::npos);
  ExperimentSpec seeds = spec;
  seeds.data.sequence_seeds = {1, 2};
  CHECK_FALSE(streaming_obstacle(seeds, points).empty());
  ExperimentSpec cuda = spec;
  cuda.backend = BackendRequest::Cuda;
  CHECK(streaming_obstacle(cuda, points).empty());
}
