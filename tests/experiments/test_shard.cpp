// Shards, results.jsonl and merge checks (experiments/shard.*, point_log.*, merge.*,
// run_state.*): every point in exactly one shard, balanced by cost; --shard parsing
// with Slurm's variables; point results read back bit for bit; merge refusals.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "experiments/config.h"
#include "experiments/merge.h"
#include "experiments/point_log.h"
#include "experiments/run_state.h"
#include "experiments/shard.h"
#include "sim/core/error.h"
#include "test_util.h"

using namespace kvb;

namespace {

const std::string kData =
    "[data]\npath = \"" + (test::data_dir() / "records/gpt2-bytes-record.safetensors").string() + "\"\n";

ExperimentSpec parse(const std::string& text) { return parse_experiment(ConfigDoc::parse(text, "test.toml")); }

// 7 bits x 2 modes x 2 groups = 28 uniform points, attribution for ids 0..4 only.
const std::string kSweep = kData +
                           "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-{mode}-g{group}\"\n"
                           "[strategy.vars]\nbits = \"2..8\"\nmode = [\"sym\", \"asym\"]\ngroup = [32, 64]\n"
                           "[attribution]\npoints = [0, 1, 2, 3, 4]\n";

std::function<const char*(const char*)> env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("shards: every point in exactly one shard, ids kept, balanced by estimated cost") {
  const ExperimentSpec spec = parse(kSweep);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(points.size() == 28);
  for (size_t n : {1u, 2u, 3u, 4u, 28u, 40u}) {
    std::vector<int> seen(points.size(), 0);
    double lightest = 1e300, heaviest = 0, largest_point = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<SweepPoint> mine = shard_points(spec, points, Shard{i, n});
      CHECK(std::is_sorted(mine.begin(), mine.end(),
                           [](const SweepPoint& a, const SweepPoint& b) { return a.id < b.id; }));
      double load = 0;
      for (const SweepPoint& p : mine) {
        ++seen[p.id];
        CHECK(p.key == points[p.id].key);  // global ids
        load += point_cost(spec, p);
        largest_point = std::max(largest_point, point_cost(spec, p));
      }
      lightest = std::min(lightest, load);
      heaviest = std::max(heaviest, load);
      // Deterministic: the same shard twice is the same points.
      const std::vector<SweepPoint> again = shard_points(spec, points, Shard{i, n});
      CHECK(again.size() == mine.size());
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    // Greedy by cost: no shard carries more than one point's cost above the lightest.
    CHECK(heaviest - lightest <= largest_point + 1e-9);
  }
  // The attributed points cost more (token regions) and are spread out first.
  CHECK(point_cost(spec, points[0]) > point_cost(spec, points[5]));
  std::set<size_t> holders;
  for (size_t i = 0; i < 4; ++i)
    for (const SweepPoint& p : shard_points(spec, points, Shard{i, 4}))
      if (p.id < 4) holders.insert(i);
  CHECK(holders.size() == 4);
}

TEST_CASE("--shard: I/N, and auto from the Slurm job array's variables") {
  const Shard s = parse_shard("2/4", "--shard");
  CHECK(s.index == 2);
  CHECK(s.count == 4);
  CHECK(parse_shard("0/1", "--shard").whole());
  CHECK(error_of([] { parse_shard("4/4", "--shard"); }).find("below the count") != std::string::npos);
  CHECK(error_of([] { parse_shard("1/0", "--shard"); }).find("at least 1") != std::string::npos);
  CHECK(error_of([] { parse_shard("x/4", "--shard"); }).find("not a non-negative integer") != std::string::npos);
  CHECK(error_of([] { parse_shard("3", "--shard"); }).find("expected I/N") != std::string::npos);
  // sbatch --array=1-4: ids 1..4, MIN 1, COUNT 4.
  const Shard a = parse_shard("auto", "--shard",
                              env_of({{"SLURM_ARRAY_TASK_ID", "3"},
                                      {"SLURM_ARRAY_TASK_COUNT", "4"},
                                      {"SLURM_ARRAY_TASK_MIN", "1"},
                                      {"SLURM_ARRAY_TASK_MAX", "4"}}));
  CHECK(a.index == 2);
  CHECK(a.count == 4);
  CHECK(error_of([] { parse_shard("auto", "--shard", env_of({})); }).find("not inside a Slurm job array") !=
        std::string::npos);
  // --array=0-6:2 (ids 0, 2, 4, 6): ID - MIN is no shard index.
  CHECK(error_of([] {
          parse_shard("auto", "--shard",
                      env_of({{"SLURM_ARRAY_TASK_ID", "2"},
                              {"SLURM_ARRAY_TASK_COUNT", "4"},
                              {"SLURM_ARRAY_TASK_MIN", "0"},
                              {"SLURM_ARRAY_TASK_MAX", "6"}}));
        }).find("not consecutive") != std::string::npos);
}

TEST_CASE("config hash: --out, --threads, plots and stream_layers aside, any change of the sweep changes it") {
  // As kvbudget run records them: record_run_options always runs.
  auto run_spec = [](const std::string& text, const RunOptionsInConfig& o) {
    ExperimentSpec e = parse(text);
    record_run_options(e, o);
    return e;
  };
  const ExperimentSpec a = run_spec(kSweep, {});
  const ExperimentSpec b = run_spec(kSweep, RunOptionsInConfig{3, "/elsewhere", "", true, {}, ""});
  CHECK(sweep_config_hash(a) == sweep_config_hash(b));
  // The saved config.toml, loaded again (run --resume without CONFIG): the same hash.
  CHECK(sweep_config_hash(run_spec(b.resolved_toml, {})) == sweep_config_hash(a));
  // Streamed layers give the held run's results bit for bit: a held run resumes streamed.
  const std::string streamed = "[data]\nstream_layers = true\n" + kSweep.substr(std::string("[data]\n").size());
  REQUIRE(parse(streamed).data.stream_layers == true);
  CHECK(sweep_config_hash(run_spec(streamed, {})) == sweep_config_hash(a));
  CHECK(sweep_config_hash(a) != sweep_config_hash(run_spec("seed = 1\n" + kSweep, {})));
  CHECK(sweep_config_hash(a) !=
        sweep_config_hash(run_spec(kSweep, RunOptionsInConfig{0, "", "", false, {"bpe <= 4"}, ""})));
  CHECK(sweep_config_hash(a) != sweep_config_hash(run_spec(kSweep, RunOptionsInConfig{0, "", "cuda", false, {}, ""})));
}

TEST_CASE("config differences: the keys the hash reads that differ, named with both values") {
  auto run_spec = [](const std::string& text, const RunOptionsInConfig& o) {
    ExperimentSpec e = parse(text);
    record_run_options(e, o);
    return e;
  };
  const ExperimentSpec a = run_spec(kSweep, {});
  // --out, --threads, --no-plots: not differences (the hash does not read them).
  CHECK(config_differences(a.resolved_toml, run_spec(kSweep, RunOptionsInConfig{3, "/x", "", true, {}, ""}).resolved_toml)
            .empty());
  const std::vector<std::string> seed = config_differences(a.resolved_toml, run_spec("seed = 1\n" + kSweep, {}).resolved_toml);
  REQUIRE(seed.size() == 1);
  CHECK(seed[0] == "seed (absent there, 1 now)");
  const std::vector<std::string> backend =
      config_differences(a.resolved_toml, run_spec(kSweep, RunOptionsInConfig{0, "", "cuda", false, {}, ""}).resolved_toml);
  REQUIRE(backend.size() == 1);
  CHECK(backend[0].rfind("backend (", 0) == 0);
  // Inside arrays of tables: the element and key.
  std::string other = kSweep;
  const size_t at = other.find("bits = \"2..8\"");
  REQUIRE(at != std::string::npos);
  const std::vector<std::string> in_strategy =
      config_differences(a.resolved_toml, run_spec(other.replace(at, 13, "bits = [2, 3]"), {}).resolved_toml);
  REQUIRE(in_strategy.size() == 1);
  CHECK(in_strategy[0] == "strategy[0].vars.bits (\"2..8\" there, [ 2, 3 ] now)");
  CHECK(config_differences("not = [toml", a.resolved_toml).empty());
  CHECK(config_differences_text(a.resolved_toml, a.resolved_toml).empty());
}

TEST_CASE("results.jsonl: a point result reads back bit for bit, non-finite numbers and text included") {
  PointResult r;
  r.id = 17;
  r.ok = true;
  r.bpe = 4.0 + 1.0 / 3.0;
  r.bpe_target = 0.1 + 0.2;
  r.bytes = 123456789.0;
  r.bytes_target = 1e300;
  r.measured_tokens = 512;
  r.sized_for_tokens = 32768;
  r.target_extrapolated = true;
  r.plan = "keys int4, \"values\" int2";
  r.annotations = {{"bits_mean", 3.25}, {"mode", std::string("nan")}, {"rho_first", std::nan("")}};
  r.metrics = {1e-7 / 3.0, HUGE_VAL, -HUGE_VAL, 0.0};
  r.standard_errors = {0.1 / 3.0, std::nan(""), std::nan(""), 0.0};
  r.intervals = {{1e-8, 2e-7 / 3.0}, {std::nan(""), std::nan("")}, {-1.0, 1.0}, {0.0, 0.0}};
  Attribution a;
  a.layers = 1;
  a.q_heads = 2;
  a.total = {0.5 / 7.0, 2.0 / 3.0};
  a.head = {{0.1, 0.2}, {0.3 / 9.0, 0.4}};
  a.regions = {{"protection", "window", {0.25, 0.5}}, {"protection", "interaction", {-1e-17, 0.0}}};
  r.attribution = a;
  r.seconds = 0.125;
  std::string key;
  const PointResult back = point_result_from_json(point_result_json(r, "uniform(format=int4)"), "t", &key);
  CHECK(key == "uniform(format=int4)");
  CHECK(back.id == r.id);
  CHECK(back.ok);
  CHECK(back.bpe == r.bpe);
  CHECK(back.bpe_target == r.bpe_target);
  CHECK(back.bytes_target == r.bytes_target);
  REQUIRE(back.standard_errors.size() == 4);  // uncertainty survives a merge
  CHECK(back.standard_errors[0] == r.standard_errors[0]);
  CHECK(std::isnan(back.standard_errors[1]));
  REQUIRE(back.intervals.size() == 4);
  CHECK(back.intervals[0].hi == r.intervals[0].hi);
  CHECK(std::isnan(back.intervals[1].lo));
  CHECK(back.intervals[2].lo == -1.0);
  CHECK(back.measured_tokens == 512);  // the extrapolated marks survive a merge
  CHECK(back.sized_for_tokens == 32768);
  CHECK(back.target_extrapolated);
  CHECK(back.plan == r.plan);
  REQUIRE(back.annotations.size() == 3);
  CHECK(std::get<double>(back.annotations[0].value) == 3.25);
  CHECK(std::get<std::string>(back.annotations[1].value) == "nan");  // text stays text
  CHECK(std::isnan(std::get<double>(back.annotations[2].value)));
  REQUIRE(back.metrics.size() == 4);
  CHECK(back.metrics[0] == r.metrics[0]);
  CHECK(back.metrics[1] == HUGE_VAL);
  CHECK(back.metrics[2] == -HUGE_VAL);
  REQUIRE(back.attribution);
  CHECK(back.attribution->errors == a.errors);
  CHECK(back.attribution->total == a.total);
  CHECK(back.attribution->head == a.head);
  CHECK(back.attribution->regions[1].name == "interaction");
  CHECK(back.attribution->regions[1].error[0] == -1e-17);
  // Other additive errors travel by name; lines without names hold the default two.
  Attribution other = a;
  other.errors = {&require_additive_error("logit_rmse", "test")};
  other.total = {0.1 / 3.0};
  other.head = {{0.25}, {1.0 / 7.0}};
  other.regions = {{"protection", "rest", {0.5}}};
  r.attribution = other;
  const PointResult back_other = point_result_from_json(point_result_json(r, "k"), "t");
  REQUIRE(back_other.attribution);
  CHECK(back_other.attribution->errors == other.errors);
  CHECK(back_other.attribution->head == other.head);
  CHECK(back_other.attribution->regions[0].error == other.regions[0].error);
  nlohmann::json old_line = nlohmann::json::parse(point_result_json(back, "k"));
  old_line["attribution"].erase("errors");
  const PointResult back_old = point_result_from_json(old_line.dump(), "t");
  REQUIRE(back_old.attribution);
  CHECK(back_old.attribution->errors == default_attributed_errors());
  CHECK(back_old.attribution->total == a.total);
  CHECK(error_of([] { point_result_from_json("{\"id\": 1}", "f.jsonl:3"); }).find("f.jsonl:3") != std::string::npos);
}

TEST_CASE("results.jsonl: appended lines, a line cut by a kill skipped, the last line of an id wins") {
  const std::filesystem::path dir = test::scratch_dir("point_log");
  PointResult failed, ok;
  failed.id = ok.id = 2;
  failed.error = "boom";
  ok.ok = true;
  ok.bpe = 3;
  {
    PointLog log(dir / kPointLogFile);
    log.append(failed, "k2");
  }
  {
    std::ofstream cut(dir / kPointLogFile, std::ios::app);
    cut << "{\"id\": 5, \"key\": \"k5\", \"ok\": tr";  // a writer killed mid-line
  }
  {
    PointLog log(dir / kPointLogFile);  // starts on a fresh line
    log.append(ok, "k2");
  }
  const std::vector<PointLogEntry> entries = read_point_log(dir / kPointLogFile);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].result.ok);
  CHECK(entries[0].line == 3);
}

TEST_CASE("merge: refuses shards of different sweeps, lists missing and duplicated points") {
  const std::filesystem::path root = test::scratch_dir("merge_checks");
  auto shard = [&](const std::string& name, size_t index, const std::string& config_hash,
                   const std::vector<size_t>& ids, const nlohmann::json& identity = "d1") {
    const std::filesystem::path dir = root / name;
    std::filesystem::create_directories(dir);
    nlohmann::json m = {{"status", "complete"},
                        {"config_hash", config_hash},
                        {"seed", 0},
                        {"data_identity", identity},
                        {"git_commit", "c1"},
                        {"kvbudget_version", "v"},
                        {"backend", "cpu"},
                        {"sweep_points_total", 6},
                        {"points_total", ids.size()},
                        {"shard", {{"index", index}, {"count", 2}}}};
    std::ofstream(dir / "manifest.json") << m.dump(2);
    PointLog log(dir / kPointLogFile);
    for (size_t id : ids) {
      PointResult r;
      r.id = id;
      r.ok = true;
      log.append(r, "k" + std::to_string(id));
    }
    return dir;
  };
  const auto a = shard("a", 0, "h1", {0, 2, 4});
  const auto b = shard("b", 1, "h1", {1, 3, 5});
  const MergeInput in = read_shards({a, b});
  REQUIRE(in.results.size() == 6);
  for (size_t i = 0; i < 6; ++i) CHECK(in.results[i].id == i);
  const std::string other_config = error_of([&] { read_shards({a, shard("c", 1, "h2", {1, 3, 5})}); });
  CHECK(other_config.find("config_hash differs") != std::string::npos);
  CHECK(other_config.find("\"h2\"") != std::string::npos);
  const std::string gaps = error_of([&] { read_shards({a, shard("d", 1, "h1", {1, 2})}); });
  CHECK(gaps.find("point 2 in") != std::string::npos);  // duplicated, with both folders
  CHECK(gaps.find("ids 3, 5") != std::string::npos);    // missing
  CHECK(error_of([&] { read_shards({a}); }).find("ids 1, 3, 5") != std::string::npos);
  // A shard stopped before its data was identified: unknown, not different data.
  const std::string unknown = error_of([&] { read_shards({a, shard("e", 1, "h1", {1, 3, 5}, nullptr)}); });
  CHECK(unknown.find("data_identity unknown in " + (root / "e").string()) != std::string::npos);
  CHECK(unknown.find("--resume") != std::string::npos);
  CHECK(unknown.find("different data") == std::string::npos);
  CHECK(error_of([&] { read_shards({a, shard("f", 1, "h1", {1, 3, 5}, "d2")}); }).find("data_identity differs") !=
        std::string::npos);
  CHECK(id_ranges({0, 1, 2, 5, 7, 8}) == "0-2, 5, 7-8");
}

TEST_CASE("heartbeat: beats while it lives, not after") {
  std::mutex mu;
  std::condition_variable beat_seen;
  int beats = 0;
  {
    Heartbeat heartbeat(0.02, [&] {
      std::lock_guard<std::mutex> lock(mu);
      ++beats;
      beat_seen.notify_all();
    });
    // Waits for the event (two beats), not for a time; the deadline only stops a hang.
    std::unique_lock<std::mutex> lock(mu);
    CHECK(beat_seen.wait_for(lock, std::chrono::seconds(60), [&] { return beats >= 2; }));
  }
  // The destructor has joined the beating thread: nothing can beat any more.
  std::lock_guard<std::mutex> lock(mu);
  const int seen = beats;
  CHECK(seen >= 2);
  std::this_thread::yield();
  CHECK(beats == seen);
}

TEST_CASE("status: a running manifest whose process is gone is stale; one on another host by its heartbeat") {
  const std::filesystem::path dir = test::scratch_dir("run_status");
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  auto write = [&](const std::string& on, int64_t pid, int64_t heartbeat_age) {
    const nlohmann::json m = {{"status", "running"},
                              {"points_total", 3},
                              {"pid", pid},
                              {"host", on},
                              {"heartbeat_unix", static_cast<int64_t>(std::time(nullptr)) - heartbeat_age},
                              {"heartbeat_interval_s", 10}};
    std::ofstream(dir / "manifest.json") << m.dump(2);
  };
  // A pid no process has (above the kernel's pid_max of 4194304).
  write(host, 99999999, 0);
  RunStatus s = read_run_status(dir);
  CHECK(s.stale);
  CHECK(s.liveness.find("is gone") != std::string::npos);
  CHECK(describe_run_status(dir, s).find("kvbudget run --resume") != std::string::npos);
  write("another-host.invalid", 1234, 5);
  CHECK_FALSE(read_run_status(dir).stale);
  write("another-host.invalid", 1234, 3600);
  s = read_run_status(dir);
  CHECK(s.stale);
  CHECK(s.done == 0);
  CHECK(s.total == 3);
}

TEST_CASE("manifest.json: a key of the wrong type is an error naming the file and the key") {
  const std::filesystem::path dir = test::scratch_dir("manifest_types");
  const std::string file = (dir / "manifest.json").string();
  auto error_with = [&](const nlohmann::json& m) -> std::string {
    std::ofstream(dir / "manifest.json") << m.dump(2);
    try {
      read_run_status(dir);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_with({{"status", "complete"}, {"points_total", "2"}}) ==
        file + ": key 'points_total': expected a number, not \"2\"");
  CHECK(error_with({{"status", "complete"}, {"points_total", -1}}) ==
        file + ": key 'points_total': expected a whole number, at least 0, not -1");
  CHECK(error_with({{"status", 3}}) == file + ": key 'status': expected a text, not 3");
  CHECK(error_with({{"shard", {{"index", "1"}, {"count", 4}}}}) ==
        file + ": key 'shard.index': expected a number, not \"1\"");
  CHECK(error_with({{"shard", 2}}) == file + ": key 'shard': expected an object, not 2");
  CHECK(error_with(nlohmann::json::array()) == file + ": expected a JSON object, not array");
  CHECK(error_with({{"status", "complete"}, {"points_total", 2}}).empty());
}

TEST_CASE("status: a run that failed outside any point shows its error, not a resume hint") {
  const std::filesystem::path dir = test::scratch_dir("failed_status");
  std::ofstream(dir / "manifest.json")
      << nlohmann::json{{"status", "failed"}, {"points_total", 3}, {"error", "points.csv: cannot be written"}}.dump();
  const RunStatus s = read_run_status(dir);
  CHECK(s.error == "points.csv: cannot be written");
  const std::string text = describe_run_status(dir, s);
  CHECK(text.find("  error: points.csv: cannot be written\n") != std::string::npos);
  CHECK(text.find("--resume") == std::string::npos);
  // Interrupted (no error): the resume hint stays.
  std::ofstream(dir / "manifest.json") << nlohmann::json{{"status", "interrupted"}, {"points_total", 3}}.dump();
  CHECK(describe_run_status(dir, read_run_status(dir)).find("kvbudget run --resume") != std::string::npos);
}
