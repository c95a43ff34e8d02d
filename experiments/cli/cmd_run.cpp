// `kvbudget run CONFIG`: the whole experiment, config to plots. The options become a
// RunRequest; run_experiment() (experiments/runner.h) does the run; this prints the
// summary and turns the outcome into the exit code.
#include <unistd.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>

#include "experiments/cli/commands.h"
#include "experiments/crash_marker.h"
#include "experiments/experiment.h"
#include "experiments/run_state.h"
#include "experiments/runner.h"
#include "experiments/shard.h"
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

}  // namespace

int cmd_run(const Args& args) {
  po::options_description opts("kvbudget run CONFIG [options]");
  std::string config;
  std::vector<std::string> sets, budgets;
  int threads = 0;
  std::string out_dir, backend, precision, shard_text, resume_dir;
  opts.add_options()("help,h", "show this help")(
      "set", po::value(&sets)->composing(), "override a config key: --set data.max_tokens=256 (repeatable)")(
      "budget", po::value(&budgets)->composing(),
      "add a budget query: --budget 'attn_kl_mean <= 1e-3' or --budget 'bpe <= 4' (repeatable)")(
      "threads", po::value(&threads), "OpenMP threads (default: config `threads`, else all cores)")(
      "out", po::value(&out_dir),
      "results base directory: writes OUT/<name>/<timestamp>/ (default: config output.dir, else results/)")(
      "backend", po::value(&backend),
      "cpu, cuda or auto: what measures the points (default: config `backend`, else cpu)")(
      "precision", po::value(&precision),
      "fp32 or tf32: the CUDA simulator's plan-dependent products; tf32 is the declared fast mode (default: "
      "config `precision`, else fp32)")(
      "shard", po::value(&shard_text),
      "run one part of the points: I/N (shard I of N, 0 <= I < N), or auto inside a Slurm job array; "
      "`kvbudget merge` combines the shards' folders")(
      "resume", po::value(&resume_dir),
      "continue the interrupted or killed run (or shard) in results folder DIR: its finished points are kept "
      "(CONFIG defaults to DIR/config.toml, its relative data paths found from the original config's folder)")(
      "no-plots", "skip the matplotlib plots")("quiet,q", "no progress output")(
      "json", "print the final summary and budget answers as one JSON object (README \"Command line conventions\")");
  po::variables_map vm;
  try {
    check_assignments(args, "--set", "data.max_tokens=256");
  } catch (const std::exception& e) {  // check_assignments' ConfigError
    return option_error("run", e);
  }
  if (!parse_command_line(args, opts, "config", po::value(&config), 1, "run", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts << "\nWrites results/<name>/<timestamp>/: config.toml, manifest.json, points.csv, pareto.csv,\n"
                         "budgets.json, attribution.csv, concentration.csv and plots/. See configs/README.md for the config reference.\n";
    return kExitOk;
  }
  if (config.empty() && resume_dir.empty()) {
    std::cerr << "kvbudget run: missing CONFIG (e.g. kvbudget run configs/quickstart.toml)\n\n" << opts;
    return kExitUsage;
  }
  const bool quiet = vm.count("quiet") != 0;

  check_threads(threads, "--threads");
  std::optional<Shard> shard_option;
  if (!shard_text.empty()) shard_option = parse_shard(shard_text, "--shard");
  // --resume DIR without CONFIG: DIR's config.toml, its relative data paths from the
  // folder of the config the run was started from (manifest.json's `config`).
  ExperimentSpec spec = config.empty() ? load_results_config(resume_dir, sets) : load_experiment(config, sets);
  for (const std::string& b : budgets) add_budget_query(spec, b, "--budget");
  if (threads > 0) spec.threads = threads;
  if (!out_dir.empty()) {
    spec.output.dir = out_dir;
    spec.output.dir_where = "--out";
  }
  if (!backend.empty()) spec.backend = parse_backend_request(backend, "--backend");
  if (!precision.empty()) spec.precision = parse_matmul_precision(precision, "--precision");
  if (!backend.empty() || !precision.empty())
    check_precision_backend(spec.precision, spec.backend, precision.empty() ? "--backend" : "--precision");
  const bool plots_in_config = spec.output.plots;
  if (vm.count("no-plots")) spec.output.plots = false;
  record_run_options(spec, RunOptionsInConfig{threads, out_dir, backend, vm.count("no-plots") != 0, budgets, precision});

  RunRequest request;
  request.spec = std::move(spec);
  request.plots_in_config = plots_in_config;
  request.command_line = "kvbudget run " + join(args, " ");
  request.shard = shard_option;
  request.resume_dir = resume_dir;
  request.quiet = quiet;
  request.stop = &g_stop;
  // Installed before the data loads, and kept until the end (the final writes too).
  // SIGINT and SIGTERM always stop the run (a shell script starts background jobs with
  // SIGINT ignored); a SIGHUP that nohup set to be ignored stays ignored.
  std::unique_ptr<ScopedSignalHandlers> stop_handlers, hangup_handler;
  request.on_phase = [&](RunPhase phase) {
    if (phase == RunPhase::Loading) {
      g_loading.store(true);
      stop_handlers = std::make_unique<ScopedSignalHandlers>(std::vector<int>{SIGINT, SIGTERM}, on_signal, false);
      hangup_handler = std::make_unique<ScopedSignalHandlers>(std::vector<int>{SIGHUP}, on_signal, true);
    } else {
      g_loading.store(false);  // from the results directory on, a stop is graceful
    }
  };
  const RunOutcome run = run_experiment(request);

  const bool json = vm.count("json") != 0;
  if (json) {
    ResultsSummary summary{"run", run.dir, run.status, run.points, run.results.size() - run.failed, run.failed,
                           run.wall_seconds, run.plots_written, run.run_errors};
    if (!run.plot_error.empty()) summary.errors.push_back("plots not written: " + run.plot_error);
    std::printf("%s\n", results_summary_json(summary).dump(2).c_str());
    if (run.points_lost)  // the measurements must not be lost with the disk: print them (stdout holds the JSON)
      std::fprintf(stderr, "points.csv or errors.csv could not be written (see the error below); the rows of "
                   "points.csv:\n%s", run.lost_points_csv.c_str());
  } else {
    std::printf("%s", run.frontier.c_str());
    if (run.points_lost)  // the measurements must not be lost with the disk: print them
      std::printf("\npoints.csv or errors.csv could not be written (see the error below); the rows of points.csv:\n%s",
                  run.lost_points_csv.c_str());
  }
  if (!json) std::printf("\n%zu of %zu points measured in %.1f s; results in %s%s\n", run.results.size() - run.failed, run.points,
              run.wall_seconds, run.dir.string().c_str(),
              run.run_errors.empty() ? "" : " (not every file could be written: see the errors below)");
  if (run.plots_written && !json) std::printf("plots: %s\n", (run.dir / "plots").string().c_str());
  std::fflush(stdout);  // the summary above, before the errors below (one terminal or file for both)
  if (!run.plot_error.empty())
    std::fprintf(stderr, "kvbudget run: error: plots not written: %s\n", run.plot_error.c_str());
  if (run.failed) {
    std::fprintf(stderr, "kvbudget run: error: %zu point(s) failed (see %s):\n", run.failed,
                 (run.dir / "errors.csv").string().c_str());
    size_t shown = 0;
    for (const PointResult& r : run.results)
      if (!r.ok && shown++ < 5) std::fprintf(stderr, "  %s\n", r.error.c_str());
  }
  for (const std::string& e : run.run_errors) std::fprintf(stderr, "kvbudget run: error: %s\n", e.c_str());
  if (run.interrupted) {
    std::fprintf(stderr, "kvbudget run: interrupted: %zu of %zu points were finished and written%s\n",
                 run.results.size(), run.points,
                 run.streamed && run.results.size() < run.points
                     ? " (the layers were streamed: a point finishes with the last layer, so --resume measures the "
                       "unfinished points from the first layer again)"
                     : "");
    const int sig = g_stop_signal.load();
    return sig > 0 ? 128 + sig : kExitInterrupted;
  }
  return (run.failed || !run.plot_error.empty() || !run.run_errors.empty()) ? kExitError : kExitOk;
}

}  // namespace kvb::cli
