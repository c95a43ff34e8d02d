// `kvbudget run CONFIG`: the whole experiment, config to plots.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <memory>

#include "experiments/cli/commands.h"
#include "experiments/crash_marker.h"
#include "experiments/experiment.h"
#include "experiments/machine_info.h"
#include "experiments/point_log.h"
#include "experiments/progress.h"
#include "experiments/report.h"
#include "experiments/run_state.h"
#include "experiments/shard.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// SIGINT, SIGTERM and SIGHUP stop the sweep; what finished is written and the run
// exits 128 + the signal's number (130 for Ctrl-C). While the data loads (a file, a
// synthetic generation, a model run) nothing has been written yet: a signal then ends
// the process at once, with a message and the same exit code.
std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_loading{false};
extern "C" void on_signal(int sig) {
  if (g_loading.load()) {  // only async-signal-safe calls here
    static const char kMessage[] = "\nkvbudget run: interrupted while loading the data; nothing was written\n";
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
    ::_exit(128 + sig);
  }
  g_stop_signal.store(sig);
  g_stop.store(true);
}

// Targets the synthetic generator could not reach (an entropy above log2 of the
// context, say): the data is not what the config asked for. Prints the first few on
// stderr and returns all of them (for the manifest).
std::vector<std::string> data_warnings(const Recording& rec) {
  const auto it = rec.metadata.find("synthetic.warnings");
  if (it == rec.metadata.end() || it->second.empty()) return {};
  const std::vector<std::string> warnings = split(it->second, '\n');
  constexpr size_t kShown = 3;
  std::fprintf(stderr, "kvbudget run: warning: the synthetic data misses %zu of its targets (all in manifest.json):\n",
               warnings.size());
  for (size_t i = 0; i < warnings.size() && i < kShown; ++i) std::fprintf(stderr, "  %s\n", warnings[i].c_str());
  if (warnings.size() > kShown) std::fprintf(stderr, "  ... and %zu more\n", warnings.size() - kShown);
  return warnings;
}

}  // namespace

int cmd_run(const Args& args) {
  po::options_description opts("kvbudget run CONFIG [options]");
  std::string config;
  std::vector<std::string> sets, budgets;
  int threads = 0;
  std::string out_dir, backend, shard_text, resume_dir;
  opts.add_options()("help,h", "show this help")(
      "set", po::value(&sets)->composing(), "override a config key: --set data.max_tokens=256 (repeatable)")(
      "budget", po::value(&budgets)->composing(),
      "add a budget query: --budget 'attn_kl_mean <= 1e-3' or --budget 'bpe <= 4' (repeatable)")(
      "threads", po::value(&threads), "OpenMP threads (default: config `threads`, else all cores)")(
      "out", po::value(&out_dir), "results base directory (default: config output.dir, else results/)")(
      "backend", po::value(&backend),
      "cpu, cuda or auto: what measures the points (default: config `backend`, else cpu)")(
      "shard", po::value(&shard_text),
      "run one part of the points: I/N (shard I of N, 0 <= I < N), or auto inside a Slurm job array; "
      "`kvbudget merge` combines the shards' folders")(
      "resume", po::value(&resume_dir),
      "continue the interrupted or killed run (or shard) in results folder DIR: its finished points are kept "
      "(CONFIG defaults to DIR/config.toml)")(
      "no-plots", "skip the matplotlib plots")("quiet,q", "no progress output");
  po::options_description hidden;
  hidden.add_options()("config", po::value(&config));
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("config", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return option_error("run", e);
  }
  if (vm.count("help")) {
    std::cout << opts << "\nWrites results/<name>/<timestamp>/: config.toml, manifest.json, points.csv, pareto.csv,\n"
                         "budgets.json, attribution.csv, concentration.csv and plots/. See configs/README.md for the config reference.\n";
    return kExitOk;
  }
  if (config.empty() && !resume_dir.empty()) config = (std::filesystem::path(resume_dir) / "config.toml").string();
  if (config.empty()) {
    std::cerr << "kvbudget run: missing CONFIG (e.g. kvbudget run configs/quickstart.toml)\n\n" << opts;
    return kExitUsage;
  }
  const bool quiet = vm.count("quiet") != 0;

  check_threads(threads, "--threads");
  std::optional<Shard> shard_option;
  if (!shard_text.empty()) shard_option = parse_shard(shard_text, "--shard");
  ExperimentSpec spec = load_experiment(config, sets);
  for (const std::string& b : budgets) add_budget_query(spec, b, "--budget");
  if (threads > 0) spec.threads = threads;
  if (!out_dir.empty()) {
    spec.output.dir = out_dir;
    spec.output.dir_where = "--out";
  }
  if (!backend.empty()) spec.backend = parse_backend_request(backend, "--backend");
  if (vm.count("no-plots")) spec.output.plots = false;
  record_run_options(spec, RunOptionsInConfig{threads, out_dir, backend, vm.count("no-plots") != 0, budgets});
  if (spec.threads > 0) omp_set_num_threads(spec.threads);

  const std::vector<SweepPoint> all_points = expand_sweep(spec);
  check_plot_columns(spec, all_points);
  // This run's points: a shard's (experiments/shard.h); with --resume, those of the
  // folder's shard, less the finished ones kept (experiments/run_state.h).
  const std::string config_hash = sweep_config_hash(spec);
  std::optional<ResumeState> resumed;
  if (!resume_dir.empty()) resumed = prepare_resume(resume_dir, spec, config_hash, shard_option, all_points);
  const Shard shard = resumed ? resumed->shard : shard_option.value_or(Shard{});
  const std::vector<SweepPoint> points = resumed ? resumed->points : shard_points(spec, all_points, shard);
  const std::vector<SweepPoint> to_run = resumed ? points_not_in(points, resumed->kept) : points;
  // Before the data is loaded (or a model run): a results directory that cannot be
  // written is a config error, not a lost run.
  if (resumed) require_writable_dir(resume_dir, "--resume");
  else require_writable_dir(spec.output.dir / spec.name, spec.output.dir_where);
  if (spec.backend == BackendRequest::Cuda) {  // fail before any data is loaded or written
    std::string why;
    if (cuda_device(&why).empty()) throw Error("backend = \"cuda\": " + why);
  }
  // Installed before the data loads, and kept until the end (the final writes too).
  // SIGINT and SIGTERM always stop the run (a shell script starts background jobs with
  // SIGINT ignored); a SIGHUP that nohup set to be ignored stays ignored.
  g_loading.store(true);
  const ScopedSignalHandlers stop_handlers({SIGINT, SIGTERM}, on_signal, false);
  const ScopedSignalHandlers hangup_handler({SIGHUP}, on_signal, true);
  const auto t_start = std::chrono::steady_clock::now();
  if (!quiet) {
    std::string which;  // "(shard 1/4 of 96), 10 kept from DIR (2 failed there: run again)"
    if (!shard.whole()) which += " (shard " + shard.text() + " of " + std::to_string(all_points.size()) + ")";
    if (resumed) which += ", " + std::to_string(resumed->kept.size()) + " kept from " + resume_dir;
    if (resumed && resumed->failed_before)
      which += " (" + std::to_string(resumed->failed_before) + " failed there: run again)";
    std::fprintf(stderr, "kvbudget: %s: %zu points%s; loading data\n", spec.name.c_str(), points.size(), which.c_str());
  }
  // A model source runs the exact model once: its recording is what strategies see,
  // and the evaluator compares every point's quantized forward pass against it.
  std::shared_ptr<const ModelEvaluator> model;
  Recording loaded;
  if (spec.data.source == DataSpec::Source::Model) model = build_model_evaluator(spec.data);
  else loaded = build_recording(spec.data);
  const Recording& rec = model ? model->recording() : loaded;
  if (!quiet) std::fprintf(stderr, "kvbudget: recording %s: %s\n", rec.name.c_str(), rec.summary().c_str());

  const QueryPositions positions = resolve_positions(spec, rec.tokens);
  check_model_metric_positions(spec, positions, rec.tokens);
  check_attention_rows(spec, positions, rec.tokens);
  const std::string data_identity = recording_identity(rec);
  if (resumed) check_resume_data(resume_dir, *resumed, data_identity);
  const std::string shard_suffix =
      shard.whole() ? "" : "-shard" + std::to_string(shard.index) + "of" + std::to_string(shard.count);
  // From the results directory on, a stop is graceful: what finished is written.
  g_loading.store(false);
  Report report(spec, all_points,
                resumed ? std::filesystem::path(resume_dir) : make_run_dir(spec.output.dir, spec.name, shard_suffix));
  RunInfo info;
  info.command_line = "kvbudget run " + join(args, " ");
  info.status = "running";
  info.started_iso = time_now("%Y-%m-%dT%H:%M:%S%z");
  info.points_total = points.size();
  info.recording_summary = rec.name + ": " + rec.summary();
  info.warnings = data_warnings(rec);
  info.backend.requested = spec.backend;
  info.positions = positions;
  info.shard = shard;
  info.sweep_points_total = all_points.size();
  info.points_resumed = resumed ? resumed->kept.size() : 0;
  info.config_hash = config_hash;
  info.data_identity = data_identity;
  info.heartbeat_interval_s = heartbeat_interval_seconds();
  // A fatal signal from here on leaves the manifest "crashed" rather than "running".
  auto crash_marker = std::make_unique<CrashMarker>(report.manifest_path(), [&](const char* signal) {
    RunInfo crashed = info;
    crashed.status = "crashed";
    crashed.signal = signal;
    return report.manifest_text(crashed);
  });
  report.write_config();
  // Each finished point is appended to results.jsonl at once (what merge and --resume read).
  PointLog point_log(report.dir() / kPointLogFile);
  report.write_manifest(info);
  // While the sweep runs, the manifest's heartbeat is refreshed (kvbudget status tells
  // a live run from one killed without a chance to write).
  auto heartbeat = std::make_unique<Heartbeat>(info.heartbeat_interval_s, [&report, running = info] {
    try {
      report.write_manifest(running);
    } catch (...) {  // the next beat tries again
    }
  });

  // Completed results are rewritten atomically at most once a second while the
  // sweep runs, so a crash loses at most the last second of points.
  std::vector<PointResult> done_results = resumed ? resumed->kept : std::vector<PointResult>{};
  auto last_write = std::chrono::steady_clock::now();
  Progress progress(to_run.size(), quiet);
  // Failures outside any point (writing a file, a callback): each is reported, the
  // rest is still written, and the run exits non-zero.
  std::vector<std::string> run_errors;
  auto attempt = [&](const std::string& what, const std::function<void()>& write) {
    try {
      write();
    } catch (const std::exception& e) {
      run_errors.push_back(what + ": " + e.what());
    }
  };
  // An intermediate write that fails is retried by the next one and by the final
  // write; it is an error of the run only if the final write fails too.
  size_t failed_intermediate_writes = 0;
  std::string first_intermediate_error;
  auto on_point = [&](const SweepPoint& p, const PointResult& r, size_t done, size_t) {
    done_results.push_back(r);
    progress.update(done, r.ok ? p.key : r.error, r.ok, r.seconds);
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_write).count() >= 1.0) {
      last_write = now;
      try {
        report.write_points(done_results);
      } catch (const std::exception& e) {
        if (failed_intermediate_writes++ == 0) first_intermediate_error = e.what();
      }
    }
    point_log.append(r, p.key);  // a failure is a run error; the final results.jsonl retries
  };
  std::vector<std::string> sweep_errors;
  std::vector<PointResult> results =
      run_sweep(spec, rec, to_run, on_point, &g_stop, &info.backend, model.get(), &sweep_errors);
  if (resumed) {
    results.insert(results.end(), resumed->kept.begin(), resumed->kept.end());
    std::sort(results.begin(), results.end(), [](const PointResult& a, const PointResult& b) { return a.id < b.id; });
  }
  for (const std::string& e : sweep_errors) run_errors.push_back("while the sweep ran, " + e);
  info.backend_decided = true;
  progress.finish();
  if (!quiet)
    std::fprintf(stderr, "kvbudget: backend %s (%s)%s%s\n", backend_name(info.backend.used), info.backend.reason.c_str(),
                 info.backend.device.empty() ? "" : ": ", info.backend.device.c_str());

  const size_t errors_before_final_write = run_errors.size();
  attempt("points.csv / errors.csv", [&] { report.write_points(results); });
  const bool points_lost = run_errors.size() > errors_before_final_write;
  attempt("results.jsonl", [&] { report.write_point_log(results); });
  if (failed_intermediate_writes > 0) {
    const std::string what = std::to_string(failed_intermediate_writes) +
                             " intermediate write(s) of points.csv failed while the sweep ran (first: " +
                             first_intermediate_error + ")";
    if (run_errors.size() > errors_before_final_write)
      run_errors.push_back(what);
    else
      std::fprintf(stderr, "kvbudget run: warning: %s; the final write succeeded\n", what.c_str());
  }
  attempt("attribution.csv / concentration.csv", [&] { report.write_attribution(results); });
  size_t failed = 0;
  for (const PointResult& r : results) failed += r.ok ? 0 : 1;
  const bool interrupted = g_stop.load();
  std::string frontier;
  attempt("pareto.csv / budgets.json", [&] {
    std::string write_error;
    frontier = report.write_frontier(results, &write_error);
    if (!write_error.empty()) throw Error(write_error);
  });
  std::string plot_error;
  if (spec.output.plots && results.size() > failed) plot_error = report.write_plots();

  info.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  heartbeat.reset();
  crash_marker.reset();  // the final manifest below says how the run ended
  // "complete" only for a run that exits 0: every point measured and every file written.
  info.status =
      interrupted ? "interrupted" : ((failed || !run_errors.empty() || !plot_error.empty()) ? "failed" : "complete");
  attempt("manifest.json", [&] { report.write_manifest(info); });

  std::printf("%s", frontier.c_str());
  if (points_lost) {  // the measurements must not be lost with the disk: print them
    std::vector<PointResult> by_id = results;
    std::sort(by_id.begin(), by_id.end(), [](const PointResult& a, const PointResult& b) { return a.id < b.id; });
    std::printf("\npoints.csv or errors.csv could not be written (see the error below); the rows of points.csv:\n%s",
                report.points_csv(by_id).c_str());
  }
  std::printf("\n%zu of %zu points measured in %.1f s; results in %s%s\n", results.size() - failed, points.size(),
              info.wall_seconds, report.dir().string().c_str(),
              run_errors.empty() ? "" : " (not every file could be written: see the errors below)");
  if (spec.output.plots && plot_error.empty() && results.size() > failed)
    std::printf("plots: %s\n", (report.dir() / "plots").string().c_str());
  std::fflush(stdout);  // the summary above, before the errors below (one terminal or file for both)
  if (!plot_error.empty()) std::fprintf(stderr, "kvbudget run: error: plots not written: %s\n", plot_error.c_str());
  if (failed) {
    std::fprintf(stderr, "kvbudget run: error: %zu point(s) failed (see %s):\n", failed,
                 (report.dir() / "errors.csv").string().c_str());
    size_t shown = 0;
    for (const PointResult& r : results)
      if (!r.ok && shown++ < 5) std::fprintf(stderr, "  %s\n", r.error.c_str());
  }
  for (const std::string& e : run_errors) std::fprintf(stderr, "kvbudget run: error: %s\n", e.c_str());
  if (interrupted) {
    std::fprintf(stderr, "kvbudget run: interrupted: %zu of %zu points were finished and written\n", results.size(),
                 points.size());
    const int sig = g_stop_signal.load();
    return sig > 0 ? 128 + sig : kExitInterrupted;
  }
  return (failed || !plot_error.empty() || !run_errors.empty()) ? kExitError : kExitOk;
}

}  // namespace kvb::cli
