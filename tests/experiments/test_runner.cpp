// run_experiment() in process (experiments/runner.*): the results layout, the same
// numbers at another thread count, points that cannot run refused before the sweep, a stop during the
// sweep and before the results folder, errors before anything is written. (The
// signal handling and the console of `kvbudget run` stay in tests/cli/test_run.sh.)
#include <algorithm>
#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "experiments/config.h"
#include "experiments/data_building.h"
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

TEST_CASE("run_experiment: the manifest's phase_seconds, within wall_seconds") {
  const fs::path out = test::scratch_dir("runner_phases");
  // 8 points, so the exact pass is shared (computed once, before the tasks).
  const RunOutcome run = run_experiment(quickstart_request(out, {"output.plots=false"}));
  REQUIRE(run.status == "complete");
  const nlohmann::json manifest = nlohmann::json::parse(read_text(run.dir / "manifest.json"));
  REQUIRE(manifest.contains("phase_seconds"));
  const nlohmann::json& phases = manifest["phase_seconds"];
  const double wall = manifest["wall_seconds"].get<double>();
  CHECK(wall > 0);
  double sum = 0;
  for (const char* phase : {"data", "identity", "plans", "exact_pass", "points", "reports"}) {
    REQUIRE_MESSAGE(phases.contains(phase), phase);
    const double s = phases[phase].get<double>();
    CHECK_MESSAGE(s >= 0, phase);
    sum += s;
  }
  // One after another within the run's wall time (what is left: the results folder's setup).
  CHECK(sum <= wall + 1e-6);
  CHECK(phases["exact_pass"].get<double>() > 0);
  CHECK(phases["points"].get<double>() > 0);
  // The points' finalize, summed, is spent inside "points" (on up to `threads` threads at once).
  REQUIRE(phases.contains("finalize"));
  CHECK(phases["finalize"].get<double>() > 0);
  CHECK(phases["finalize"].get<double>() <=
        manifest["threads"].get<double>() * phases["points"].get<double>() + 1e-6);
  CHECK(phases.size() == 7);
}

TEST_CASE("run_experiment: attribution.metrics chooses the errors attribution.csv splits") {
  const fs::path out = test::scratch_dir("runner_attribution_metrics");
  const RunOutcome run = run_experiment(quickstart_request(
      out, {"output.plots=false", "strategy.0.vars.bits=[4]", "attribution.metrics=[\"logit_rmse\", \"attn_out_rel_err\"]"}));
  REQUIRE(run.status == "complete");
  // Every row of both files names one of the chosen errors, and both appear.
  for (const char* file : {"attribution.csv", "concentration.csv"}) {
    std::istringstream in(read_text(run.dir / file));
    std::string line;
    std::getline(in, line);  // the header
    std::set<std::string> metrics;
    while (std::getline(in, line)) {
      std::vector<std::string> fields;
      std::stringstream fields_in(line);
      for (std::string f; std::getline(fields_in, f, ',');) fields.push_back(f);
      REQUIRE(fields.size() > 2);
      metrics.insert(fields[2]);  // id,key,metric,...: the keys hold no comma (quickstart's formats)
    }
    CHECK_MESSAGE((metrics == std::set<std::string>{"logit_err2", "out_rel"}), file);
  }
  CHECK(read_text(run.dir / "config.toml").find("logit_rmse") != std::string::npos);  // the saved config reruns it
}

TEST_CASE("run_experiment: points that cannot run on the data refuse the run before anything is written") {
  const fs::path out = test::scratch_dir("runner_failing");
  // Group 48 does not divide head_dim 64: 4 of the 8 points cannot run; the check
  // needs the data (head_dim), so it runs after the load, before the sweep.
  std::string message;
  try {
    run_experiment(quickstart_request(out, {"strategy.0.vars.group=[32, 48]", "output.plots=false"}));
  } catch (const ConfigError& e) {
    message = e.what();
  }
  CHECK(message.find("4 of 8 points cannot run on this data") != std::string::npos);
  CHECK(message.find("nothing was measured or written") != std::string::npos);
  CHECK(message.find("does not divide head_dim 64") != std::string::npos);
  CHECK(message.find("-g48)") != std::string::npos);  // the key names the point: uniform(format=int3-sym-g48)
  bool any_results_folder = false;
  if (fs::exists(out / "quickstart"))
    for (const fs::directory_entry& e : fs::directory_iterator(out / "quickstart")) any_results_folder |= e.is_directory();
  CHECK_FALSE(any_results_folder);
}

// An entropy sweep over budget_bpe on the first 64 tokens of gpt2-bytes, as a config file.
fs::path entropy_config(const fs::path& dir, const std::string& budgets) {
  fs::create_directories(dir);
  const fs::path file = dir / "entropy.toml";
  std::ofstream(file) << "name = \"entropy\"\n[data]\npath = \""
                      << (test::source_dir() / "data/records/gpt2-bytes-record.safetensors").string()
                      << "\"\nmax_tokens = 64\n[[strategy]]\ntype = \"entropy\"\nbudget_bpe = " << budgets
                      << "\nfamily = \"int{b}-asym-g32\"\n[output]\nplots = false\ndir = \"" << (dir / "out").string()
                      << "\"\n";
  return file;
}

TEST_CASE("run_experiment: a budget below the cheapest allocation refuses the run up front") {
  const fs::path dir = test::scratch_dir("runner_infeasible");
  RunRequest request;
  request.spec = load_experiment(entropy_config(dir, "[1.5, 4.5]"), {});
  request.quiet = true;
  std::string message;
  try {
    run_experiment(request);
  } catch (const ConfigError& e) {
    message = e.what();
  }
  CHECK(message.find("1 of 2 points cannot run on this data") != std::string::npos);
  CHECK(message.find("budget_bpe 1.5 is below the cheapest allocation") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "out" / "entropy" / "latest"));
}

TEST_CASE("check_plans: an allocation that gives every unit one width is a warning, a spread one is not") {
  const fs::path dir = test::scratch_dir("runner_uniform_allocation");
  // The default widths 2..8 with g32 metadata (1 bpe): 3 bpe buys int2 everywhere.
  const ExperimentSpec spec = load_experiment(entropy_config(dir, "[3.0, 4.5]"), {});
  const std::vector<SweepPoint> points = expand_sweep(spec);
  const Recording rec = build_recording(spec.data);
  const PlanCheck check = check_plans(spec, rec, points);
  CHECK(check.errors.empty());
  REQUIRE(check.warnings.size() == 1);
  CHECK(check.warnings[0].find("budget_bpe=3") != std::string::npos);
  CHECK(check.warnings[0].find("K:int2-asym-g32 V:int2-asym-g32") != std::string::npos);
}

// A config on gpt2-bytes' first 64 tokens with `blocks` (TOML text of [[strategy]] blocks).
fs::path gpt2_config(const fs::path& dir, const std::string& blocks) {
  fs::create_directories(dir);
  const fs::path file = dir / "gpt2.toml";
  std::ofstream(file) << "name = \"gpt2\"\n[data]\npath = \""
                      << (test::source_dir() / "data/records/gpt2-bytes-record.safetensors").string()
                      << "\"\nmax_tokens = 64\n" << blocks << "[output]\nplots = false\ndir = \""
                      << (dir / "out").string() << "\"\n";
  return file;
}

TEST_CASE("check_plans: an error found on the data names the block's file, line and name, as config errors do") {
  const fs::path dir = test::scratch_dir("runner_plan_error_location");
  const fs::path file = gpt2_config(dir,
                                    "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n\n"  // lines 5-8
                                    "[[strategy]]\nname = \"b\"\ntype = \"entropy\"\nbudget_bpe = 4.0\n"
                                    "family = \"int{b}-asym-g32\"\nsink_tokens = 80\n");
  const ExperimentSpec spec = load_experiment(file, {});
  const std::vector<SweepPoint> points = expand_sweep(spec);
  const PlanCheck check = check_plans(spec, build_recording(spec.data), points);
  REQUIRE(check.errors.size() == 1);
  CHECK(check.errors[0].rfind(file.string() + ":9: [strategy[1]] (name \"b\"): point entropy(", 0) == 0);
  CHECK(check.errors[0].find("sink_tokens 80 exceeds the recording's 64 tokens") != std::string::npos);
}

TEST_CASE("check_plans: one width per kind, an unspent optimal budget and a window over every token are warnings") {
  const fs::path dir = test::scratch_dir("runner_plan_warnings");
  const fs::path file = gpt2_config(
      dir,
      "[[strategy]]\ntype = \"optimal\"\nbudget_bpe = 8.0\nfamily = \"int{b}-asym-g32\"\n"
      "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\nwindow = [32, 64, 100]\n"
      "[[strategy]]\npreset = \"kivi-2\"\n");
  const ExperimentSpec spec = load_experiment(file, {});
  const std::vector<SweepPoint> points = expand_sweep(spec);
  const PlanCheck check = check_plans(spec, build_recording(spec.data), points);
  CHECK(check.errors.empty());
  for (const std::string& w : check.warnings) MESSAGE(w);
  REQUIRE(check.warnings.size() == 5);
  // Each names its block as the errors do: "FILE:LINE: [strategy[i]]: point KEY: why".
  const std::string config = file.string();
  CHECK(check.warnings[0].rfind(config + ":", 0) == 0);
  CHECK(check.warnings[0].find(": [strategy[0]]: point optimal(") != std::string::npos);
  CHECK(check.warnings[2].find(": [strategy[1]]: point uniform(") != std::string::npos);
  CHECK(check.warnings[4].find(": [strategy[2]]: point kivi-2(): ") != std::string::npos);
  // After the location, the warning itself.
  auto after_point = [&](size_t k) { return check.warnings[k].substr(check.warnings[k].find(": point ") + 8); };
  // Optimal under attn_kl_mean: int8 keys, int2 values (value widths do not change the
  // attention weights), 6 of the 8 bpe: said first by the strategy, then the one width per kind.
  CHECK(after_point(0).rfind("optimal(budget_bpe=8,family=int{b}-asym-g32): budget_bpe 8 is not spent: the "
                                "allocation reaches 6 bpe (2 bpe unspent)",
                                0) == 0);
  CHECK(after_point(1) ==
        "optimal(budget_bpe=8,family=int{b}-asym-g32): the allocation gives one width per kind, K:int8-asym-g32 "
        "V:int2-asym-g32 in every unit: the point is uniform quantization of keys and of values (the allocator spread "
        "no widths across units at this budget; give other widths or budgets)");
  // Windows of 64 and 100 tokens hold all 64: the quantizer is never measured; 32 is fine.
  CHECK(after_point(2).rfind("uniform(format=int4-asym-g32,window=64): a window covers all of the recording's 64 "
                                "tokens (K:window=64 at keep-fp16 in 36 of 36 units, V:window=64 at keep-fp16 in 36 "
                                "of 36 units): those units are stored entirely at the window's precision",
                                0) == 0);
  CHECK(after_point(3).find("uniform(format=int4-asym-g32,window=100): a window covers") == 0);
  CHECK(after_point(4).find("kivi-2(): a window covers all of the recording's 64 tokens (K:window=128") == 0);
}

TEST_CASE("check_plans: a prerope: format on a recording without pre-RoPE keys refuses the run up front") {
  const fs::path out = test::scratch_dir("runner_prerope");
  const std::vector<std::string> prerope = {"strategy.0.format=prerope:int{bits}-{mode}-g{group}",
                                            "output.plots=false"};
  // gpt2-bytes has no RoPE: every point fails the check, as a group that does not divide.
  RunRequest request = quickstart_request(out, prerope);
  const std::vector<SweepPoint> points = expand_sweep(request.spec);
  PlanCheck check = check_plans(request.spec, build_recording(request.spec.data), points);
  REQUIRE(check.errors.size() == points.size());
  CHECK(check.errors[0].find("format prerope:int3-") != std::string::npos);
  CHECK(check.errors[0].find("recording 'gpt2-bytes-record' has no RoPE") != std::string::npos);
  CHECK(check.errors[0].find("nothing to quantize before RoPE; use 'int3-") != std::string::npos);
  // Marked post-RoPE ([data] rope_theta) it has RoPE but still no pre-RoPE keys.
  std::vector<std::string> with_theta = prerope;
  with_theta.push_back("data.rope_theta=10000");
  request = quickstart_request(out, with_theta);
  check = check_plans(request.spec, build_recording(request.spec.data), points);
  REQUIRE(check.errors.size() == points.size());
  CHECK(check.errors[0].find("has no pre-RoPE keys (key_pre_rope)") != std::string::npos);
  // The run is refused up front: no results folder.
  std::string message;
  try {
    run_experiment(quickstart_request(out, prerope));
  } catch (const ConfigError& e) {
    message = e.what();
  }
  CHECK(message.find("8 of 8 points cannot run on this data") != std::string::npos);
  CHECK(message.find("quantizes keys before RoPE") != std::string::npos);
  CHECK_FALSE(fs::exists(out / "quickstart"));
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
