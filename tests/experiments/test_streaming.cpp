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
#include "test_util.h"

using namespace kvb;
using kvb::test::check_same_results;

namespace {

ExperimentSpec parse(const std::string& text) { return parse_experiment(ConfigDoc::parse(text, "test.toml")); }

// Three layers of a RoPE recording with sink heads and GQA; uniform, KIVI-2 and two
// strategies that read the calibration statistics (entropy; uniform with sink tokens
// chosen by the attention they receive), with attribution of point 0.
const std::string kConfig = R"(
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
sink_heads = 1
outlier_channels = 2
rope = true
rho_first = 0.05
calibration_queries = 32

[[strategy]]
type = "uniform"
key_format = "int{bits}-asym-ch32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4]

[[strategy]]
preset = "kivi-2"

[[strategy]]
type = "entropy"
budget_bpe = 4.0
family = "int{b}-asym-g32"
alpha = 0.25

[[strategy]]
type = "uniform"
key_format = "int2-asym-g32"
value_format = "int2-asym-g32"
sink_tokens = 2
sink_token_select = "attention"

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
    StreamedData data = stream_recording(spec, spec.data, keep, true);
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
  StreamedData data = stream_recording(spec, spec.data, {}, true);
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

  // A strategy that reads the keys while planning.
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
