// run_experiment() in process (experiments/runner.*): the results layout, the same
// numbers at another thread count, failing points beside good ones, a stop during the
// sweep and before the results folder, errors before anything is written. (The
// signal handling and the console of `kvbudget run` stay in tests/cli/test_run.sh.)
#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>

#include "experiments/config.h"
#include "experiments/runner.h"
#include "sim/core/error.h"
#include "test_util.h"

using namespace kvb;

namespace {

namespace fs = std::filesystem;

// The quickstart config on a 64-token prefix, 2 bits x 2 modes x 2 groups = 8 points.
RunRequest quickstart_request(const fs::path& out, const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> sets = {"data.max_tokens=64", "strategy.0.vars.bits=[3, 4]", "output.dir=" + out.string()};
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  RunRequest request;
  request.spec = load_experiment(test::source_dir() / "configs/quickstart.toml", sets);
  request.command_line = "test_runner";
  request.quiet = true;
  return request;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// points.csv without its `seconds` column (the only one that differs between runs).
std::string points_without_seconds(const fs::path& dir) {
  std::istringstream in(read_text(dir / "points.csv"));
  std::string line, out;
  size_t seconds_column = std::string::npos;
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    std::stringstream fs_line(line);
    for (std::string f; std::getline(fs_line, f, ',');) fields.push_back(f);
    if (seconds_column == std::string::npos)
      for (size_t i = 0; i < fields.size(); ++i)
        if (fields[i] == "seconds") seconds_column = i;
    for (size_t i = 0; i < fields.size(); ++i)
      if (i != seconds_column) out += fields[i] + ",";
    out += "\n";
  }
  return out;
}

size_t lines_of(const fs::path& p) {
  const std::string text = read_text(p);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

}  // namespace

TEST_CASE("run_experiment: the results layout, and the same numbers on one thread") {
  const fs::path out = test::scratch_dir("runner_layout");
  RunRequest request = quickstart_request(out / "a", {"output.plots=false"});
  std::vector<size_t> seen;
  request.on_point = [&](const SweepPoint&, const PointResult&, size_t done, size_t) { seen.push_back(done); };
  const RunOutcome run = run_experiment(request);
  CHECK(run.status == "complete");
  CHECK(run.points == 8);
  CHECK(run.results.size() == 8);
  CHECK(run.failed == 0);
  CHECK_FALSE(run.interrupted);
  CHECK(run.run_errors.empty());
  CHECK(seen.size() == 8);
  CHECK(run.dir.parent_path() == out / "a" / "quickstart");
  for (const char* f : {"config.toml", "manifest.json", "points.csv", "pareto.csv", "budgets.json", "results.jsonl",
                        "attribution.csv"})
    CHECK_MESSAGE(fs::file_size(run.dir / f) > 0, f);
  CHECK(lines_of(run.dir / "points.csv") == 9);
  CHECK(read_text(run.dir / "manifest.json").find("\"status\": \"complete\"") != std::string::npos);
  CHECK(read_text(run.dir / "manifest.json").find("\"command\": \"test_runner\"") != std::string::npos);
  CHECK(run.frontier.find("Pareto frontier: attn_kl_mean") != std::string::npos);
  CHECK_FALSE(run.plots_written);
  CHECK_FALSE(fs::exists(run.dir / "plots"));

  RunRequest one_thread = quickstart_request(out / "b", {"output.plots=false", "threads=1"});
  const RunOutcome again = run_experiment(one_thread);
  CHECK(points_without_seconds(again.dir) == points_without_seconds(run.dir));
  CHECK(read_text(again.dir / "pareto.csv") == read_text(run.dir / "pareto.csv"));
}

TEST_CASE("run_experiment: a point that cannot run is reported, the good ones are written") {
  const fs::path out = test::scratch_dir("runner_failing");
  // Group 48 does not divide head_dim 64: 4 of the 8 points fail.
  const RunOutcome run = run_experiment(quickstart_request(out, {"strategy.0.vars.group=[32, 48]", "output.plots=false"}));
  CHECK(run.failed == 4);
  CHECK(run.status == "failed");
  CHECK(lines_of(run.dir / "points.csv") == 5);
  CHECK(read_text(run.dir / "errors.csv").find("does not divide head_dim 64") != std::string::npos);
  CHECK(read_text(run.dir / "manifest.json").find("\"status\": \"failed\"") != std::string::npos);
}

TEST_CASE("run_experiment: a stop during the sweep writes the finished points, interrupted") {
  const fs::path out = test::scratch_dir("runner_stop");
  std::atomic<bool> stop{false};
  RunRequest request = quickstart_request(out, {"output.plots=false", "threads=1"});
  request.stop = &stop;
  request.on_point = [&](const SweepPoint&, const PointResult&, size_t done, size_t) {
    if (done == 2) stop.store(true);
  };
  const RunOutcome run = run_experiment(request);
  CHECK(run.interrupted);
  CHECK(run.status == "interrupted");
  CHECK(run.results.size() >= 2);
  CHECK(run.results.size() < 8);
  CHECK(lines_of(run.dir / "points.csv") == run.results.size() + 1);
  CHECK(read_text(run.dir / "manifest.json").find("\"status\": \"interrupted\"") != std::string::npos);
}

TEST_CASE("run_experiment: a stop while the data loads, and errors before the results folder, write nothing") {
  const fs::path out = test::scratch_dir("runner_nothing");
  std::atomic<bool> stop{false};
  RunRequest request = quickstart_request(out);
  request.stop = &stop;
  std::vector<RunPhase> phases;
  request.on_phase = [&](RunPhase phase) {
    phases.push_back(phase);
    if (phase == RunPhase::Loading) stop.store(true);
  };
  CHECK_THROWS_AS(run_experiment(request), RunInterrupted);
  CHECK(phases == std::vector<RunPhase>{RunPhase::Loading});
  CHECK_FALSE(fs::exists(out / "quickstart"));

  // Data that cannot be loaded: an error naming the file, no results folder.
  const fs::path truncated = out / "truncated.safetensors";
  {
    const std::string rec = read_text(test::data_dir() / "records/gpt2-bytes-record.safetensors");
    std::ofstream(truncated, std::ios::binary) << rec.substr(0, 5000);
  }
  try {
    run_experiment(quickstart_request(out, {"data.path=" + truncated.string()}));
    FAIL("a truncated recording ran");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("truncated.safetensors") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(out / "quickstart"));

  // An output directory under a file: a ConfigError naming output.dir, before the data loads.
  std::ofstream(out / "a-file") << "x";
  RunRequest unwritable = quickstart_request(out / "a-file");
  bool loaded = false;
  unwritable.on_phase = [&](RunPhase) { loaded = true; };
  try {
    run_experiment(unwritable);
    FAIL("an unwritable output directory ran");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("output.dir") != std::string::npos);
    CHECK(std::string(e.what()).find("is not a directory") != std::string::npos);
  }
  CHECK_FALSE(loaded);
}
