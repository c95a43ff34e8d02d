// Several sequences (experiments/sequences.h, methods.md §4 "Several sequences"): the
// config lists (data.recordings, data.texts, data.synthetic.seeds) and their errors,
// the aggregate of a point over sequences, a run over one listed sequence that
// reproduces the single form bit for bit, and a run over two.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "experiments/config.h"
#include "experiments/point_log.h"
#include "experiments/runner.h"
#include "experiments/sequences.h"
#include "sim/core/error.h"
#include "test_util.h"

using namespace kvb;

namespace {

namespace fs = std::filesystem;

const std::string kUniform = "[[strategy]]\ntype = \"uniform\"\nformat = \"int3-asym-g32\"\n";

ExperimentSpec parse(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto doc = ConfigDoc::parse(text, "test.toml");
  for (const std::string& s : sets) doc->apply_override(s);
  return parse_experiment(doc);
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  INFO(text);
  return text.find(part) != std::string::npos;
}

std::string record(const std::string& name) {
  return "\"" + (test::data_dir() / "records" / (name + "-record.safetensors")).string() + "\"";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A CSV's lines without the column named `drop` (the seconds, which differ run to run).
std::vector<std::string> lines_without(const std::string& csv, const std::string& drop) {
  std::istringstream in(csv);
  std::vector<std::string> out;
  size_t column = std::string::npos;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
    if (column == std::string::npos)
      for (size_t i = 0; i < fields.size(); ++i)
        if (fields[i] == drop) column = i;
    std::string kept;
    for (size_t i = 0; i < fields.size(); ++i)
      if (i != column) kept += fields[i] + ",";
    out.push_back(kept);
  }
  return out;
}

// A small synthetic experiment (1 layer, 2 heads, 96 tokens): uniform int2 and int4,
// int4 the baseline.
std::string synthetic_config(const std::string& seed_line, const fs::path& out) {
  return "name = \"seq\"\n[data.synthetic]\nlayers = 1\nq_heads = 2\nkv_heads = 2\nhead_dim = 32\ntokens = 96\nentropy_mean = 3.0\n" +
         seed_line + "\n[[strategy]]\nname = \"uniform\"\ntype = \"uniform\"\nformat = \"int{bits}-asym-g32\"\n" +
         "[strategy.vars]\nbits = [2, 4]\n[[strategy]]\nname = \"int4\"\ntype = \"uniform\"\nformat = "
         "\"int4-asym-g32\"\n[metrics]\nreport = [\"attn_kl_mean\", \"attn_kl_p99\", \"attn_out_rel_err\"]\n"
         "baseline = \"int4\"\n[output]\nplots = false\ndir = \"" +
         out.string() + "\"\n";
}

RunOutcome run(const std::string& config_text) {
  RunRequest request;
  auto doc = ConfigDoc::parse(config_text, "test.toml");
  request.spec = parse_experiment(doc);
  request.command_line = "test_sequences";
  request.quiet = true;
  return run_experiment(request);
}

PointResult result_with(double kl, double se, std::vector<double> block_num) {
  PointResult r;
  r.id = 3;
  r.ok = true;
  r.bpe = 4.5;
  r.bytes = 1024;
  r.plan = "int4";
  r.metrics = {kl};
  r.standard_errors = {se};
  r.intervals = {{kl / 2, kl * 2}};
  BlockSums sums;
  sums.num = std::move(block_num);
  sums.den.assign(sums.num.size(), 1.0);
  r.block_sums = {sums};
  r.resamples = {std::vector<double>(200, kl)};
  r.seconds = 1;
  return r;
}

}  // namespace

TEST_CASE("data.recordings lists recordings; errors name the entry") {
  const ExperimentSpec e = parse("[data]\nrecordings = [" + record("gpt2-bytes") + ", " + record("llama-bytes") + "]\n" +
                                 kUniform);
  REQUIRE(e.data.sequence_count() == 2);
  CHECK(e.data.file.path == e.data.sequence_paths[0]);
  const std::vector<DataSpec> each = expand_sequences(e.data);
  REQUIRE(each.size() == 2);
  CHECK(has(sequence_source(each[1]), "llama-bytes-record.safetensors"));
  CHECK(each[1].file.path == e.data.sequence_paths[1]);
  CHECK(each[1].sequence_count() == 1);
  // The single form is one sequence, as before.
  CHECK(parse("[data]\npath = " + record("gpt2-bytes") + "\n" + kUniform).data.sequence_count() == 1);

  const std::string missing =
      error_of("[data]\nrecordings = [" + record("gpt2-bytes") + ", \"no/such/file.safetensors\"]\n" + kUniform);
  CHECK(has(missing, "test.toml:2: data.recordings[1]: data path 'no/such/file.safetensors' not found"));
  CHECK(has(error_of("[data]\npath = " + record("gpt2-bytes") + "\nrecordings = [" + record("gpt2-bytes") + "]\n" +
                     kUniform),
            "give `path` (one recording) or `recordings` (several), not both"));
  CHECK(has(error_of("[data]\nrecordings = []\n" + kUniform), "an empty list names no sequence"));
  CHECK(has(error_of("[data]\nrecordings = [" + record("gpt2-bytes") + ", 3]\n" + kUniform),
            "data.recordings[1]: expected a path"));
  CHECK(has(error_of("[data]\nrecordings = [" + record("gpt2-bytes") + ", " + record("gpt2-bytes") + "]\n" + kUniform),
            "data.recordings[1]: "));
  CHECK(has(error_of("[data]\nrecordings = [" + record("gpt2-bytes") + ", " + record("gpt2-bytes") + "]\n" + kUniform),
            "is listed already (entry 0)"));
}

TEST_CASE("a glob in data.recordings stands for the matching files, sorted") {
  const std::string glob = "\"" + (test::data_dir() / "records" / "*-bytes-record.safetensors").string() + "\"";
  const ExperimentSpec e = parse("[data]\nrecordings = [" + glob + "]\n" + kUniform);
  REQUIRE(e.data.sequence_count() == 3);  // gpt2-bytes, llama-bytes, reasoning-bytes
  CHECK(e.data.sequence_paths[0].filename() == "gpt2-bytes-record.safetensors");
  CHECK(e.data.sequence_paths[2].filename() == "reasoning-bytes-record.safetensors");
  const std::string none = "\"" + (test::data_dir() / "records" / "*.nothing").string() + "\"";
  CHECK(has(error_of("[data]\nrecordings = [" + none + "]\n" + kUniform), "data.recordings[0]: "));
  CHECK(has(error_of("[data]\nrecordings = [" + none + "]\n" + kUniform), "matches no file in"));
}

TEST_CASE("data.texts and data.synthetic.seeds list texts and seeds") {
  const std::string model = "[data]\nsource = \"model\"\nmodel = \"data/models/gpt2-bytes\"\nmax_tokens = 128\n";
  const ExperimentSpec e = parse(model + "texts = [\"data/text/eval_kjv_revelation.txt\", "
                                         "\"data/text/eval_fortunes_science_work.txt\"]\n" + kUniform);
  REQUIRE(e.data.sequence_count() == 2);
  const std::vector<DataSpec> each = expand_sequences(e.data);
  CHECK(each[1].model.tokens.text.filename() == "eval_fortunes_science_work.txt");
  CHECK(each[1].model.tokens.token_file.empty());
  CHECK(has(error_of(model + "text = \"data/text/eval_kjv_revelation.txt\"\ntexts = [\"data/text/eval_kjv_revelation.txt\"]\n" +
                     kUniform),
            "give exactly one of `text`, `token_file`, `texts` and `token_files`"));
  CHECK(has(error_of(model + "texts = [\"data/text/eval_kjv_revelation.txt\", \"data/text/missing.txt\"]\n" + kUniform),
            "data.texts[1]: data path 'data/text/missing.txt' not found"));

  const std::string synth = "[data.synthetic]\nlayers = 1\nq_heads = 2\nhead_dim = 32\ntokens = 48\n";
  const ExperimentSpec s = parse(synth + "seeds = [5, 9]\n" + kUniform);
  REQUIRE(s.data.sequence_count() == 2);
  CHECK(expand_sequences(s.data)[1].synthetic.seed == 9);
  CHECK(sequence_source(expand_sequences(s.data)[0]) == "synthetic seed 5");
  CHECK(has(error_of(synth + "seed = 1\nseeds = [5, 9]\n" + kUniform), "give `seed` (one sequence) or `seeds`"));
  CHECK(has(error_of(synth + "seeds = [5, 5]\n" + kUniform), "seeds[1] = 5 is listed already"));
  CHECK(has(error_of(synth + "seeds = []\n" + kUniform), "expected a non-empty array of seeds"));
}

TEST_CASE("the aggregate of one sequence is that sequence's result, bit for bit") {
  ExperimentSpec spec = parse("[data]\npath = " + record("gpt2-bytes") + "\n" + kUniform +
                              "[metrics]\nreport = [\"attn_kl_mean\"]\npareto = [\"attn_kl_mean\"]\n");
  const PointResult one = result_with(1.0 / 3.0, 0.1 / 7.0, {0.1, 0.2, 0.3});
  const PointResult agg = aggregate_sequences(spec, {&one}, {"a"});
  CHECK(agg.metrics == one.metrics);
  CHECK(agg.standard_errors == one.standard_errors);
  CHECK(agg.intervals[0].lo == one.intervals[0].lo);
  CHECK(agg.intervals[0].hi == one.intervals[0].hi);
  CHECK(agg.block_sums[0].num == one.block_sums[0].num);
  CHECK(agg.block_sums[0].sequence_blocks.empty());
  CHECK(agg.resamples.empty());  // never written
}

TEST_CASE("the aggregate of two sequences: means, summed variances, joined blocks") {
  ExperimentSpec spec = parse("[data]\npath = " + record("gpt2-bytes") + "\n" + kUniform +
                              "[metrics]\nreport = [\"attn_kl_mean\"]\npareto = [\"attn_kl_mean\"]\n");
  const PointResult a = result_with(0.1, 0.03, {0.1, 0.1}), b = result_with(0.3, 0.04, {0.3, 0.3, 0.3});
  const PointResult agg = aggregate_sequences(spec, {&a, &b}, {"a", "b"});
  REQUIRE(agg.ok);
  CHECK(agg.metrics[0] == doctest::Approx(0.2));
  CHECK(agg.standard_errors[0] == doctest::Approx(0.05 / 2));  // sqrt(0.03² + 0.04²) / 2
  CHECK(agg.block_sums[0].sequence_blocks == std::vector<uint32_t>{2, 3});
  // Each sequence's resamples are constant (its value): the interval is the spread of
  // the mean over drawn sequences, from 0.1 (a twice) to 0.3 (b twice).
  CHECK(agg.intervals[0].lo >= 0.1 - 1e-12);
  CHECK(agg.intervals[0].lo <= 0.2);
  CHECK(agg.intervals[0].hi >= 0.2);
  CHECK(agg.intervals[0].hi <= 0.3 + 1e-12);
  CHECK(agg.seconds == 2);
  CHECK(agg.bpe == 4.5);
  // A point that failed on one sequence fails, naming it.
  PointResult broken = b;
  broken.ok = false;
  broken.error = "layer 0: boom";
  const PointResult failed = aggregate_sequences(spec, {&a, &broken}, {"a.safetensors", "b.safetensors"});
  CHECK_FALSE(failed.ok);
  CHECK(failed.error == "sequence 1 (b.safetensors): layer 0: boom");
}

TEST_CASE("sequences must be alike in shape and tokens") {
  Recording a, b;
  a.tokens = b.tokens = 128;
  a.q_heads = b.q_heads = a.kv_heads = b.kv_heads = 2;
  a.head_dim = b.head_dim = 32;
  a.layers.resize(1);
  b.layers.resize(1);
  CHECK_NOTHROW(check_sequences_alike({&a, &b}, {"a", "b"}, "test.toml:2: data.recordings"));
  b.tokens = 100;
  try {
    check_sequences_alike({&a, &b}, {"a", "b"}, "test.toml:2: data.recordings");
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(has(e.what(), "test.toml:2: data.recordings: sequence 1 (b) has"));
    CHECK(has(e.what(), "100 tokens"));
    CHECK(has(e.what(), "data.max_tokens"));
  }
}

TEST_CASE("block sums of several sequences survive results.jsonl") {
  PointResult r = result_with(0.2, 0.01, {0.1, 0.2, 0.3});
  r.block_sums[0].sequence_blocks = {1, 2};
  const PointResult back = point_result_from_json(point_result_json(r, "k"), "t");
  REQUIRE(back.block_sums.size() == 1);
  CHECK(back.block_sums[0].num == r.block_sums[0].num);
  CHECK(back.block_sums[0].sequence_blocks == std::vector<uint32_t>{1, 2});
}

TEST_CASE("a run over one listed seed reproduces the single form; two seeds aggregate") {
  const fs::path tmp = test::scratch_dir("sequences_run");
  const RunOutcome single = run(synthetic_config("seed = 5", tmp / "single"));
  const RunOutcome listed = run(synthetic_config("seeds = [5]", tmp / "listed"));
  REQUIRE(single.status == "complete");
  REQUIRE(listed.status == "complete");
  CHECK(lines_without(read_text(single.dir / "points.csv"), "seconds") ==
        lines_without(read_text(listed.dir / "points.csv"), "seconds"));
  CHECK(read_text(single.dir / "comparisons.csv") == read_text(listed.dir / "comparisons.csv"));
  CHECK_FALSE(fs::exists(listed.dir / "points_by_sequence.csv"));

  const RunOutcome two = run(synthetic_config("seeds = [5, 6]", tmp / "two"));
  const RunOutcome other = run(synthetic_config("seed = 6", tmp / "other"));
  REQUIRE(two.status == "complete");
  REQUIRE(two.results.size() == single.results.size());
  for (size_t i = 0; i < two.results.size(); ++i) {
    const PointResult& agg = two.results[i];
    REQUIRE(agg.ok);
    for (size_t k = 0; k < agg.metrics.size(); ++k)  // the mean over the two seeds' own runs
      CHECK(agg.metrics[k] ==
            doctest::Approx((single.results[i].metrics[k] + other.results[i].metrics[k]) / 2).epsilon(1e-12));
    CHECK(agg.bpe == single.results[i].bpe);
    CHECK(agg.block_sums[0].sequence_blocks.size() == 2);
  }
  const std::string by_sequence = read_text(two.dir / "points_by_sequence.csv");
  CHECK(has(by_sequence, "sequence,source,id,"));
  CHECK(has(by_sequence, "\n1,synthetic seed 6,"));
  const std::string manifest = read_text(two.dir / "manifest.json");
  CHECK(has(manifest, "\"sequences\""));
  CHECK(has(manifest, "two-level (hierarchical) percentile bootstrap"));
  CHECK(has(read_text(two.dir / "comparisons.csv"), "id,strategy,"));
}

TEST_CASE("an aggregate's per-sequence results survive results.jsonl") {
  PointResult a = result_with(0.2, 0.01, {0.1}), b = result_with(0.4, 0.02, {0.3});
  a.annotations = {{"budget_bpe", 4.0}};
  b.annotations = {{"budget_bpe", 4.0}};
  const ExperimentSpec spec = parse("[data]\npath = " + record("gpt2-bytes") + "\n" + kUniform +
                                    "[metrics]\nreport = [\"attn_kl_mean\"]\npareto = [\"attn_kl_mean\"]\n");
  const PointResult agg = aggregate_sequences(spec, {&a, &b}, {"a", "b"});
  REQUIRE(agg.sequences.size() == 2);
  CHECK(agg.sequences[1].metrics == b.metrics);
  CHECK(agg.sequences[1].block_sums.empty());  // the aggregate holds them, joined
  const PointResult back = point_result_from_json(point_result_json(agg, "k"), "t");
  REQUIRE(back.sequences.size() == 2);
  CHECK(back.sequences[0].metrics == a.metrics);
  CHECK(back.sequences[1].intervals[0].hi == b.intervals[0].hi);
  CHECK(back.sequences[1].annotations.size() == 1);
  // A line of an older build (no "sequences"): read, with the per-sequence results unknown.
  nlohmann::json old = nlohmann::json::parse(point_result_json(agg, "k"));
  old.erase("sequences");
  CHECK(point_result_from_json(old.dump(), "t").sequences.empty());
}

TEST_CASE("a resumed run rebuilds every point's per-sequence rows from results.jsonl") {
  const fs::path tmp = test::scratch_dir("sequences_resume");
  const std::string config = synthetic_config("seeds = [5, 6]", tmp);
  const RunOutcome whole = run(config);
  REQUIRE(whole.status == "complete");
  const std::vector<std::string> expected = lines_without(read_text(whole.dir / "points_by_sequence.csv"), "seconds");
  REQUIRE(expected.size() == 1 + 2 * whole.results.size());

  // What a kill -9 after two points leaves: their results.jsonl lines, no
  // points_by_sequence.csv (it was written only at the end).
  auto killed_after_two = [&](bool old_lines) {
    std::istringstream log(read_text(whole.dir / kPointLogFile));
    std::string kept;
    std::string line;
    for (int i = 0; i < 2 && std::getline(log, line); ++i) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (old_lines) j.erase("sequences");
      kept += j.dump() + "\n";
    }
    std::ofstream(whole.dir / kPointLogFile) << kept;
    fs::remove(whole.dir / "points_by_sequence.csv");
    nlohmann::json manifest = nlohmann::json::parse(read_text(whole.dir / "manifest.json"));
    manifest["status"] = "interrupted";
    std::ofstream(whole.dir / "manifest.json") << manifest.dump(2);
  };
  auto resume = [&] {
    RunRequest request;
    auto doc = ConfigDoc::parse(config, "test.toml");
    request.spec = parse_experiment(doc);
    request.resume_dir = whole.dir;
    request.quiet = true;
    return run_experiment(request);
  };
  killed_after_two(false);
  const RunOutcome resumed = resume();
  REQUIRE(resumed.status == "complete");
  CHECK(lines_without(read_text(whole.dir / "points_by_sequence.csv"), "seconds") == expected);

  // Kept lines of an older build: their rows are said to be unavailable, not dropped silently.
  killed_after_two(true);
  const RunOutcome from_old = resume();
  const std::string by_sequence = read_text(whole.dir / "points_by_sequence.csv");
  CHECK(lines_without(by_sequence, "seconds").size() == 1 + 2 * (whole.results.size() - 2));
  CHECK(has(read_text(whole.dir / "manifest.json"),
            "points_by_sequence.csv has no rows for 2 measured point(s) (ids 0-1)"));
  CHECK(from_old.results.size() == whole.results.size());
}
