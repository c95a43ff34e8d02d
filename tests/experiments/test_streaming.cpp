// Layer streaming (experiments/streaming.h, sim/layer_stream.h): a run that holds one
// layer of its synthetic recording at a time gives the held run's results bit for bit,
// and holds at most one layer at once (counted by the StreamedRecording, not measured as
// memory), in two passes or, when no point plans on the layers' statistics, in one
// (each layer loaded once; the identity in the manifest before any point finishes, a
// resumed run still refusing other data, a non-finite layer an error); which runs
// stream, and why not.
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "experiments/data_building.h"
#include "experiments/query_positions.h"
#include "experiments/runner.h"
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

// Points whose plans read neither the attention statistics nor key ρ (uniform, KIVI-2,
// sink tokens fixed at the start), on the shared config's data: a run streams them in
// one pass. `data` is the [data] table's body (after stream_layers).
std::string one_pass_config(const std::string& data, const std::filesystem::path& out, bool stream = true) {
  return R"(
name = "one_pass"
backend = "cpu"
threads = 1

[data]
stream_layers = )" + std::string(stream ? "true" : "false") + "\n" + data + R"(

[[strategy]]
type = "uniform"
key_format = "int{bits}-asym-ch32"
value_format = "int{bits}-asym-g32"
[strategy.vars]
bits = [2, 4]

[[strategy]]
preset = "kivi-2"

[[strategy]]
type = "uniform"
key_format = "int2-asym-g32"
value_format = "int2-asym-g32"
sink_tokens = 4

[calibration]
positions = "900..963:8"

[metrics]
positions = "964..1023:4"

[attribution]
points = [0]

[output]
plots = false
dir = ")" + out.string() + "\"\n";
}

// The shared config's [data.synthetic] table (its layers, heads, tokens, sinks).
const std::string& kOnePassSynthetic = kvb::test::kStreamingSynthetic;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string manifest_identity(const std::filesystem::path& dir) {
  return nlohmann::json::parse(read_text(dir / "manifest.json")).value("data_identity", std::string());
}

// A CSV line's fields (a quoted field may hold commas; its quotes are kept).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    if (c == ',' && !quoted) fields.emplace_back();
    else fields.back() += c;
  }
  return fields;
}

// points.csv without its `seconds` column (the only one that differs between runs).
std::string points_without_seconds(const std::filesystem::path& dir) {
  std::istringstream in(read_text(dir / "points.csv"));
  std::string line, out;
  size_t seconds_column = std::string::npos;
  while (std::getline(in, line)) {
    const std::vector<std::string> fields = csv_fields(line);
    if (seconds_column == std::string::npos)
      for (size_t i = 0; i < fields.size(); ++i)
        if (fields[i] == "seconds") seconds_column = i;
    for (size_t i = 0; i < fields.size(); ++i)
      if (i != seconds_column) out += fields[i] + ",";
    out += "\n";
  }
  return out;
}

RunRequest one_pass_request(const std::string& config) {
  RunRequest request;
  request.spec = parse(config);
  request.command_line = "test_streaming";
  request.quiet = true;
  return request;
}

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
  // The summary says what the layers will hold (the skeleton holds none of it).
  CHECK(rec.summary() == held.summary());
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

TEST_CASE("streaming: a skeleton's summary names the pre-RoPE keys its layers will hold") {
  const SyntheticSpec synthetic = parse(kPhaseConfig).data.synthetic;
  for (const bool pre_rope : {true, false}) {
    const SyntheticKeep keep{{}, pre_rope};
    const std::string streamed = SyntheticLayers(synthetic, keep).skeleton().summary();
    CHECK(streamed == generate_synthetic(synthetic, nullptr, keep).summary());
    CHECK((streamed.find(", pre-RoPE keys") != std::string::npos) == pre_rope);
  }
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
    CHECK(rec.summary() == held.summary());
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

TEST_CASE("streaming: in one pass, when no point reads statistics or rho, each layer is loaded once") {
  const ExperimentSpec spec = parse(one_pass_config(kOnePassSynthetic, "unused"));
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(streams_layers(spec, points));
  REQUIRE_FALSE(points_need_statistics(points));
  const SyntheticKeep keep = synthetic_keep(spec, points, spec.data);
  const Recording held = build_recording(spec.data, keep);
  REQUIRE(points_key_rho_ranges(points, held).empty());
  const int64_t L = held.num_layers();

  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    omp_set_num_threads(threads);
    const std::vector<PointResult> want = run_sweep(spec, held, points, nullptr, nullptr);
    StreamedData data = stream_recording(spec, spec.data, keep, points, FirstPass::WhenNeeded);
    REQUIRE(data.one_pass);
    StreamedRecording& streamed = *data.streamed;
    const Recording& rec = streamed.recording();
    CHECK(streamed.loads() == 0);  // no first pass
    CHECK(data.identity.empty());
    CHECK_FALSE(data.stats);
    CHECK_FALSE(data.one_pass->complete());
    PlanCheck check = check_plans(spec, rec, points, nullptr, data.stats.get());
    REQUIRE(check.errors.empty());
    CHECK(streamed.loads() == 0);
    // The identity and metadata come with the last layer's load, before any point finishes.
    size_t finished = 0, finished_at_identity = 99;
    int64_t checked_at_identity = -1, loads_at_identity = -1;
    std::string identity;
    data.one_pass->on_complete = [&](const std::string& id) {
      identity = id;
      finished_at_identity = finished;
      checked_at_identity = data.one_pass->layers_checked();
      loads_at_identity = streamed.loads();  // the loaded hook runs once the last layer is loaded
      CHECK(rec.metadata == held.metadata);
    };
    const PointCallback count = [&](const SweepPoint&, const PointResult&, size_t, size_t) { ++finished; };
    const std::vector<PointResult> got =
        run_sweep(spec, rec, points, count, nullptr, nullptr, nullptr, nullptr, &check, &streamed);
    check_same_results(want, got);
    CHECK(streamed.loads() == L);  // each layer generated once
    CHECK(streamed.max_layers_held() == 1);
    CHECK(streamed.layers_held() == 0);
    CHECK(data.one_pass->complete());
    CHECK(identity == recording_identity(held));
    CHECK(data.one_pass->identity() == identity);
    CHECK(finished_at_identity == 0);
    CHECK(checked_at_identity == L);
    CHECK(loads_at_identity == L);
    CHECK(rec.metadata == held.metadata);
    REQUIRE(got.size() == points.size());
    CHECK(got[0].attribution.has_value());
    finish_one_pass(data);  // complete: nothing more
    CHECK(streamed.loads() == L);
  }
  omp_set_num_threads(saved);

  // FirstPass::Always (a --resume run): the first pass, the identity known up front.
  StreamedData always = stream_recording(spec, spec.data, keep, points, FirstPass::Always);
  CHECK_FALSE(always.one_pass);
  CHECK(always.streamed->loads() == L);
  CHECK(always.identity == recording_identity(held));
  CHECK(always.streamed->recording().metadata == held.metadata);

  // A sweep that loaded no layer: finish_one_pass loads the rest, in order.
  StreamedData rest = stream_recording(spec, spec.data, keep, points, FirstPass::WhenNeeded);
  {
    const HeldLayer first(*rest.streamed, 0);
  }
  CHECK(rest.one_pass->layers_checked() == 1);
  CHECK_THROWS_WITH_AS(rest.streamed->hold(2), doctest::Contains("layer 2 loaded before layer 1"), Error);
  finish_one_pass(rest);
  CHECK(rest.streamed->loads() == L + 1);  // the refused hold of layer 2 had loaded it
  CHECK(rest.one_pass->identity() == recording_identity(held));
  CHECK(rest.streamed->recording().metadata == held.metadata);
}

TEST_CASE("streaming: a run in one pass gives the held run's files and identity; --resume still refuses other data") {
  const std::filesystem::path dir = test::scratch_dir("streaming_one_pass_run");
  // A recording file, so that the data can change under a resumed run.
  const std::filesystem::path file = dir / "rec.safetensors";
  SyntheticSpec synthetic = parse(kConfig).data.synthetic;
  const Recording first_data = generate_synthetic(synthetic);
  write_recording(file, first_data, DType::F32);
  const std::string data = "path = \"" + file.string() + "\"\n";
  const std::string identity = recording_identity(build_recording(parse(one_pass_config(data, dir)).data));

  // Streamed in one pass and held: the same points.csv (less seconds), attribution.csv
  // and identity; the identity is in the manifest before the first point finishes.
  const RunOutcome held = run_experiment(one_pass_request(one_pass_config(data, dir / "held", false)));
  RunRequest request = one_pass_request(one_pass_config(data, dir / "streamed"));
  std::vector<std::string> identity_at_point;
  request.on_point = [&](const SweepPoint&, const PointResult& r, size_t, size_t) {
    // results.jsonl holds the point: the manifest says what data it was measured on
    const std::filesystem::path run_dir = dir / "streamed" / "one_pass" / "latest";
    identity_at_point.push_back(manifest_identity(run_dir));
    CHECK(r.ok);
  };
  const RunOutcome streamed = run_experiment(request);
  REQUIRE(held.status == "complete");
  REQUIRE(streamed.status == "complete");
  CHECK(streamed.results.size() == 4);
  CHECK(points_without_seconds(streamed.dir) == points_without_seconds(held.dir));
  CHECK(read_text(streamed.dir / "attribution.csv") == read_text(held.dir / "attribution.csv"));
  CHECK(manifest_identity(held.dir) == identity);
  CHECK(manifest_identity(streamed.dir) == identity);
  CHECK(identity_at_point == std::vector<std::string>(4, identity));

  // Stopped after the first point, then resumed on other data at the same path: refused
  // (a --resume run streams in two passes, the identity checked before anything runs).
  std::atomic<bool> stop{false};
  RunRequest first = one_pass_request(one_pass_config(data, dir / "resumed"));
  first.stop = &stop;
  first.on_point = [&](const SweepPoint&, const PointResult&, size_t, size_t) { stop.store(true); };
  const RunOutcome interrupted = run_experiment(first);
  REQUIRE(interrupted.status == "interrupted");
  CHECK(interrupted.streamed);  // kvbudget run then says why --resume starts from the first layer
  CHECK(!held.streamed);
  REQUIRE(interrupted.results.size() >= 1);
  REQUIRE(interrupted.results.size() < 4);
  CHECK(manifest_identity(interrupted.dir) == identity);
  synthetic.seed += 1;
  write_recording(file, generate_synthetic(synthetic), DType::F32);
  RunRequest resume = one_pass_request(one_pass_config(data, dir / "resumed"));
  resume.resume_dir = interrupted.dir;
  CHECK_THROWS_WITH_AS(run_experiment(resume), doctest::Contains("the data differs from the data its points were"),
                       ConfigError);
  // The same data again: the resumed run finishes with the held run's points.
  write_recording(file, first_data, DType::F32);
  const RunOutcome resumed = run_experiment(resume);
  CHECK(resumed.status == "complete");
  CHECK(points_without_seconds(resumed.dir) == points_without_seconds(held.dir));
  CHECK(manifest_identity(resumed.dir) == identity);
}

TEST_CASE("streaming: a layer that is not finite in one pass: the layer and tensor named, the manifest failed") {
  const std::filesystem::path dir = test::scratch_dir("streaming_one_pass_nan");
  const std::filesystem::path file = dir / "rec.safetensors";
  Recording bad = generate_synthetic(parse(kConfig).data.synthetic);
  bad.layers[1].value.data[100] = std::numeric_limits<float>::quiet_NaN();
  write_recording(file, bad, DType::F32);
  const std::string config = one_pass_config("path = \"" + file.string() + "\"\n", dir);
  // The held run's message (build_recording validates every layer).
  std::string want;
  try {
    build_recording(parse(config).data);
    FAIL("a recording with a NaN was built");
  } catch (const Error& e) {
    want = e.what();
  }
  CHECK(want.find("layer 1 value[") != std::string::npos);
  CHECK(want.find("is NaN") != std::string::npos);
  size_t finished = 0;
  RunRequest request = one_pass_request(config);
  request.on_point = [&](const SweepPoint&, const PointResult&, size_t, size_t) { ++finished; };
  try {
    run_experiment(request);
    FAIL("a run on a recording with a NaN succeeded");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == want);
  }
  CHECK(finished == 0);
  const nlohmann::json manifest = nlohmann::json::parse(read_text(dir / "one_pass" / "latest" / "manifest.json"));
  CHECK(manifest.value("status", std::string()) == "failed");
  CHECK_FALSE(manifest.contains("data_identity"));
}

TEST_CASE("streaming: in one pass the synthetic data's warnings reach the manifest as in a held run") {
  const std::filesystem::path dir = test::scratch_dir("streaming_one_pass_warnings");
  // An entropy above log2 of the context: targets the generator cannot reach.
  std::string synthetic = kOnePassSynthetic;
  const std::string entropy = "entropy_mean = 5.0";
  synthetic.replace(synthetic.find(entropy), entropy.size(), "entropy_mean = 12.0");
  const RunOutcome held = run_experiment(one_pass_request(one_pass_config(synthetic, dir / "held", false)));
  const RunOutcome streamed = run_experiment(one_pass_request(one_pass_config(synthetic, dir / "streamed")));
  REQUIRE(held.status == "complete");
  REQUIRE(streamed.status == "complete");
  const nlohmann::json want = nlohmann::json::parse(read_text(held.dir / "manifest.json"));
  const nlohmann::json got = nlohmann::json::parse(read_text(streamed.dir / "manifest.json"));
  REQUIRE(want["warnings"].size() > 0);
  CHECK(got["warnings"] == want["warnings"]);
  CHECK(got["data_identity"] == want["data_identity"]);
  CHECK(points_without_seconds(streamed.dir) == points_without_seconds(held.dir));
}
