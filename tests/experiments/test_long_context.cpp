// Long contexts with sampled query positions (experiments/data_building.h synthetic_keep,
// LayerTensors::query_positions): a run keeps the queries it reads and the pre-RoPE keys
// only when a point needs them, and every result equals the run on the recording that
// keeps everything, bit for bit, on any thread count. (Peak memory at 128K tokens is
// checked by tests/cli/test_long_context.sh; the cost per token is measured by
// experiments/bench/bench_long_context.sh, not asserted.)
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "experiments/data_building.h"
#include "experiments/query_positions.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "point_results_test_util.h"
#include "test_util.h"

using namespace kvb;
using kvb::test::check_same_results;

namespace {

ExperimentSpec parse(const std::string& text) { return parse_experiment(ConfigDoc::parse(text, "test.toml")); }

// A RoPE recording with sink heads and recency; uniform, KIVI-2 (a window, groups along
// tokens), entropy (reads calibration statistics) and a pre-RoPE format, with attribution.
const std::string kConfig = R"(
[data.synthetic]
layers = 2
q_heads = 4
kv_heads = 2
head_dim = 32
tokens = 1536
entropy_mean = 6.0
recency = 1.0
sink_heads = 1
outlier_channels = 2
rope = true
rho_first = 0.05
calibration_queries = 32

[[strategy]]
type = "uniform"
key_format = "int4-asym-ch32"
value_format = "int4-asym-g32"

[[strategy]]
preset = "kivi-2"

[[strategy]]
type = "entropy"
budget_bpe = 4.0
family = "int{b}-asym-g32"
alpha = 0.25

[calibration]
positions = "1400..1463:8"

[metrics]
positions = "1472..1535:4"
)";

}  // namespace

TEST_CASE("long context: a run keeps the queries it reads, and its results equal the full recording's on any thread count") {
  const ExperimentSpec spec = parse(kConfig);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  const SyntheticKeep keep = synthetic_keep(spec, points, spec.data);
  // The calibration and evaluated positions, nothing else; no point quantizes pre-RoPE keys.
  const QueryPositions positions = resolve_positions(spec, 1536);
  std::vector<int64_t> read = positions.calibration;
  read.insert(read.end(), positions.evaluation.begin(), positions.evaluation.end());
  CHECK(keep.query_positions == read);  // disjoint and ordered here
  CHECK_FALSE(keep.key_pre_rope);

  const Recording full = build_recording(spec.data);
  const Recording kept = build_recording(spec.data, keep);
  CHECK(kept.has_sparse_queries());
  CHECK_FALSE(kept.has_pre_rope_keys());
  CHECK(full.has_pre_rope_keys());
  CHECK(kept.layers[0].query.data.size() * 1536 == full.layers[0].query.data.size() * read.size());

  const int saved = omp_get_max_threads();
  std::vector<std::vector<PointResult>> runs;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    runs.push_back(run_sweep(spec, full, points, nullptr, nullptr));
    runs.push_back(run_sweep(spec, kept, points, nullptr, nullptr));
  }
  omp_set_num_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r) check_same_results(runs[0], runs[r]);
  CHECK(runs[0][0].attribution.has_value());  // attribution's regions ran on the kept recording too
}

TEST_CASE("long context: what a run keeps follows its positions, backend and formats") {
  ExperimentSpec spec = parse(kConfig);
  std::vector<SweepPoint> points = expand_sweep(spec);
  // A point quantizing pre-RoPE keys keeps them.
  ExperimentSpec prerope = parse(kConfig + "\n[[strategy]]\ntype = \"uniform\"\nkey_format = \"prerope:int4-asym-g32\"\n"
                                           "value_format = \"int4-asym-g32\"\n");
  const SyntheticKeep with_pre = synthetic_keep(prerope, expand_sweep(prerope), prerope.data);
  CHECK(with_pre.key_pre_rope);
  const Recording rec = build_recording(prerope.data, with_pre);
  CHECK(rec.has_pre_rope_keys());
  CHECK(rec.has_sparse_queries());
  // Every position read (the default evaluation rule): every query is kept.
  ExperimentSpec every = parse(kConfig);
  every.metrics.positions.clear();
  CHECK(synthetic_keep(every, points, every.data).query_positions.empty());
  // Either backend reads the sampled queries only (the CUDA simulator maps positions to rows).
  for (BackendRequest b : {BackendRequest::Auto, BackendRequest::Cuda}) {
    spec.backend = b;
    CHECK(synthetic_keep(spec, points, spec.data).query_positions == synthetic_keep(parse(kConfig), points, spec.data).query_positions);
  }
  // data.max_tokens: the positions of the truncated recording.
  spec = parse(kConfig);
  spec.data.max_tokens = 1480;
  const SyntheticKeep truncated = synthetic_keep(spec, points, spec.data);
  REQUIRE_FALSE(truncated.query_positions.empty());
  CHECK(truncated.query_positions.back() < 1480);
  const Recording short_rec = build_recording(spec.data, truncated);
  CHECK(short_rec.tokens == 1480);
  CHECK(short_rec.layers[0].query_positions == truncated.query_positions);
}

TEST_CASE("long context: a recording that keeps sampled queries refuses what needs the others") {
  const ExperimentSpec spec = parse(kConfig);
  SyntheticKeep keep = synthetic_keep(spec, expand_sweep(spec), spec.data);
  Recording rec = build_recording(spec.data, keep);
  CHECK_THROWS_WITH_AS(rec.layers[1].query_row(0, 10), doctest::Contains("the query at position 10 was not kept"),
                       Error);
  CHECK_THROWS_WITH_AS(rec.keep_queries_at({1400, 1401}), doctest::Contains("position 1401 was not kept"), Error);
  CHECK_THROWS_WITH_AS(rec.truncate_tokens(1000), doctest::Contains("leaves none of its kept query positions"), Error);
  rec.truncate_tokens(1500);  // keeps the positions below 1500
  CHECK(rec.layers[0].query_positions.back() < 1500);
  CHECK(rec.layers[0].query.dim(1) == static_cast<int64_t>(rec.layers[0].query_positions.size()));
  rec.validate();
  rec.layers[1].query_positions.pop_back();
  CHECK_THROWS_WITH_AS(rec.validate(), doctest::Contains("keeps queries at other positions"), Error);
}
