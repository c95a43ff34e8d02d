// `kvbudget merge DIR... [--out BASE | --merged-dir DIR]`: shard folders of one sweep (kvbudget run --shard)
// into one results folder equal to a single run's (experiments/merge.h), and
// `kvbudget status DIR...`: whether a run is going, finished or stale, and how far it got.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sim/io/atomic_file.h"
#include "experiments/cli/commands.h"
#include "experiments/run_state.h"
#include "experiments/sweep.h"
#include "experiments/machine_info.h"
#include "experiments/merge.h"
#include "experiments/report.h"
#include "experiments/run_state.h"
#include "experiments/sequences.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace po = boost::program_options;

namespace kvb::cli {

int cmd_merge(const Args& args) {
  po::options_description opts("kvbudget merge DIR... [--out BASE | --merged-dir DIR] [options]");
  std::vector<std::string> dirs;
  std::string out_dir, merged_dir;
  opts.add_options()("help,h", "show this help")(
      "out", po::value(&out_dir),
      "results base directory, as for run: writes BASE/<name>/<timestamp>-merged/ (default: the shards' "
      "output.dir, else results/)")(
      "merged-dir", po::value(&merged_dir),
      "write the merged results into this folder itself instead (created; must not hold files)")(
      "json", "print the summary and budget answers as one JSON object, as run --json (README \"Command line conventions\")")(
      "no-plots", "skip the matplotlib plots")("quiet,q", "print only errors");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "dirs", po::value(&dirs)->composing(), -1, "merge", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout
        << opts
        << "\nDIR...: the results folders of `kvbudget run --shard I/N` (every shard of one sweep). Writes what a "
           "single run writes\n(points.csv, pareto.csv, budgets.json, attribution, plots) from their "
           "results.jsonl. Refuses folders of different\nconfigs, seeds, data or program versions, and lists "
           "missing or duplicated points.\n";
    return kExitOk;
  }
  if (dirs.empty()) {
    std::cerr << "kvbudget merge: no shard folders given\n\n" << opts;
    return kExitUsage;
  }
  if (!out_dir.empty() && !merged_dir.empty()) {
    std::cerr << "kvbudget merge: give --out BASE or --merged-dir DIR, not both\n";
    return kExitUsage;
  }
  const auto t_start = std::chrono::steady_clock::now();
  const std::string started = time_now("%Y-%m-%dT%H:%M:%S%z");
  std::vector<std::filesystem::path> paths(dirs.begin(), dirs.end());
  const MergeInput in = read_shards(paths);
  const ShardFolder& first = in.shards.front();
  // The shards' config, as they ran it (after --set and run's options); relative data
  // paths from the folder of the config they were started from, not from the shard's.
  ExperimentSpec spec = load_results_config(first.dir, {});
  // Shards run with --no-plots (scripts/slurm/sweep.sbatch) leave the plots to the merge
  // when their config asks for them.
  if (vm.count("no-plots")) spec.output.plots = false;
  else if (first.manifest.value("plots_in_config", false)) spec.output.plots = true;
  const std::vector<SweepPoint> points = expand_sweep(spec);
  check_point_keys(in, points);

  // --out is a base directory, as in run and bounds; --merged-dir the folder itself.
  std::filesystem::path out;
  if (!merged_dir.empty()) {
    out = merged_dir;
    if (std::filesystem::exists(out) && !std::filesystem::is_empty(out))
      throw ConfigError("--merged-dir " + merged_dir + ": exists and is not empty (the merged folder must be a new one)");
    require_writable_dir(out, "--merged-dir");
    std::filesystem::create_directories(out);
  } else {
    const std::filesystem::path base = out_dir.empty() ? spec.output.dir : std::filesystem::path(out_dir);
    require_writable_dir(base, out_dir.empty() ? "output.dir" : "--out");
    out = make_run_dir(base, spec.name, "-merged");
  }
  Report report(spec, points, out);

  // The merged manifest: the shards' (identical in what kMergeKeys compares), as one run.
  nlohmann::json manifest = first.manifest;
  // A shard's own timing and process keys say nothing of the merged folder: each shard's
  // phase_seconds and backend are under merged_from.
  for (const char* key :
       {"pid", "heartbeat", "heartbeat_unix", "heartbeat_interval_s", "points_resumed", "signal", "phase_seconds"})
    manifest.erase(key);
  manifest["command"] = "kvbudget merge " + join(args, " ");
  manifest["started"] = started;
  manifest["shard"] = {{"index", 0}, {"count", 1}};
  manifest["points_total"] = in.sweep_points;
  nlohmann::json shards = nlohmann::json::array();
  double shard_seconds = 0;
  std::vector<std::string> point_backends;  // every shard's, in shard order
  for (const ShardFolder& s : in.shards) {
    shards.push_back({{"dir", std::filesystem::absolute(s.dir).string()},
                      {"shard", s.manifest.value("shard", nlohmann::json())},
                      {"status", s.manifest.value("status", std::string())},
                      {"host", s.manifest.value("host", std::string())},
                      {"backend", s.manifest.value("backend", std::string())},
                      {"wall_seconds", s.manifest.value("wall_seconds", 0.0)},
                      {"phase_seconds", s.manifest.value("phase_seconds", nlohmann::json::object())}});
    shard_seconds += s.manifest.value("wall_seconds", 0.0);
    for (const std::string& b : manifest_point_backends(s.manifest)) add_point_backend(point_backends, b);
  }
  manifest["merged_from"] = shards;
  manifest["shards_wall_seconds"] = shard_seconds;
  if (!point_backends.empty()) manifest["point_backends"] = point_backends;
  // Every shard's warnings (the data's, and the plans' of its points), in shard order,
  // each once: what the single run would have warned of.
  std::vector<std::string> warnings;
  for (const ShardFolder& s : in.shards) add_warnings(warnings, carried_warnings(s.manifest));
  if (point_backends.size() > 1) {
    const std::string note = mixed_backends_note(point_backends);
    std::fprintf(stderr, "kvbudget merge: warning: %s\n", note.c_str());
    warnings.push_back(note);
  }
  if (const std::string note = memory_read_note(in.results, points); !note.empty()) {
    std::fprintf(stderr, "kvbudget merge: warning: %s\n", note.c_str());
    warnings.push_back(note);
  }
  manifest["warnings"] = warnings;

  std::vector<std::string> errors;
  auto attempt = [&](const std::string& what, const std::function<void()>& write) {
    try {
      write();
    } catch (const std::exception& e) {
      errors.push_back(what + ": " + e.what());
    }
  };
  attempt("config.toml", [&] { report.write_config(); });
  attempt("points.csv / errors.csv", [&] { report.write_points(in.results); });
  attempt("results.jsonl", [&] { report.write_point_log(in.results); });
  attempt("attribution.csv / concentration.csv", [&] { report.write_attribution(in.results); });
  // Several sequences: every point's per-sequence rows, rebuilt from the shards'
  // results.jsonl (experiments/sequences.h), with the columns of all of them.
  if (first.manifest.contains("sequences"))
    attempt("points_by_sequence.csv", [&] {
      const std::vector<std::string> sources = first.manifest.at("sequences").get<std::vector<std::string>>();
      if (const std::vector<size_t> unknown = report.write_points_by_sequence(sources, in.results); !unknown.empty()) {
        const std::string note = unknown_sequence_rows_note(unknown);
        std::fprintf(stderr, "kvbudget merge: warning: %s\n", note.c_str());
        manifest["warnings"].push_back(note);
      }
    });
  std::string frontier;
  attempt("pareto.csv / budgets.json", [&] {
    std::string write_error;
    frontier = report.write_frontier(in.results, &write_error);
    if (!write_error.empty()) throw Error(write_error);
  });
  attempt("comparisons.csv", [&] {
    std::string write_error;
    frontier += report.write_comparisons(in.results, &write_error);
    if (!write_error.empty()) throw Error(write_error);
  });
  size_t failed = 0;
  for (const PointResult& r : in.results) failed += r.ok ? 0 : 1;
  std::string plot_error;
  if (spec.output.plots && in.results.size() > failed) plot_error = report.write_plots();
  if (!plot_error.empty()) errors.push_back("plots not written: " + plot_error);
  manifest["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  manifest["status"] = (failed || !errors.empty()) ? "failed" : "complete";
  manifest.erase("error");  // a shard's; the merge's own, when any, below
  if (!errors.empty()) manifest["error"] = join(errors, "; ");
  attempt("manifest.json", [&] { write_file_atomic(report.manifest_path(), manifest.dump(2) + "\n"); });

  if (vm.count("json")) {
    ResultsSummary summary{"merge", out, manifest["status"].get<std::string>(), in.sweep_points,
                           in.results.size() - failed, failed, manifest["wall_seconds"].get<double>(),
                           spec.output.plots && plot_error.empty() && in.results.size() > failed, errors};
    nlohmann::ordered_json j = results_summary_json(summary);
    j["shards"] = in.shards.size();
    std::printf("%s\n", j.dump(2).c_str());
    std::fflush(stdout);
  } else if (!vm.count("quiet")) {
    std::printf("%s", frontier.c_str());
    std::printf("\nmerged %zu shard folder(s): %zu of %zu points measured; results in %s\n", in.shards.size(),
                in.results.size() - failed, in.sweep_points, out.string().c_str());
    std::fflush(stdout);
  }
  if (failed) {
    std::fprintf(stderr, "kvbudget merge: error: %zu point(s) failed in the shards (see %s):\n", failed,
                 (out / "errors.csv").string().c_str());
    size_t shown = 0;
    for (const PointResult& r : in.results)
      if (!r.ok && shown++ < 5) std::fprintf(stderr, "  %s\n", r.error.c_str());
  }
  for (const std::string& e : errors) std::fprintf(stderr, "kvbudget merge: error: %s\n", e.c_str());
  return (failed || !errors.empty()) ? kExitError : kExitOk;
}

int cmd_status(const Args& args) {
  po::options_description opts("kvbudget status DIR... [options]");
  std::vector<std::string> dirs;
  opts.add_options()("help,h", "show this help")(
      "json", "print a JSON array, one object per folder (README \"Command line conventions\")");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "dirs", po::value(&dirs)->composing(), -1, "status", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nFor each results folder: its status (running, complete, interrupted, failed, crashed), the points "
                 "done of its\ntotal, and for a running one whether its process is alive or stale (died without a "
                 "chance to write:\nkill -9, the out-of-memory killer), from manifest.json's process id, host and "
                 "heartbeat.\n";
    return kExitOk;
  }
  if (dirs.empty()) {
    std::cerr << "kvbudget status: no results folder given\n\n" << opts;
    return kExitUsage;
  }
  int rc = kExitOk;
  const bool json = vm.count("json") != 0;
  nlohmann::ordered_json folders = nlohmann::ordered_json::array();
  for (const std::string& dir : dirs) {
    try {
      const RunStatus s = read_run_status(dir);
      if (json)
        folders.push_back({{"dir", dir},
                           {"status", s.status},
                           {"running", s.running},
                           {"stale", s.stale},
                           {"liveness", s.liveness},
                           {"points_done", s.done},
                           {"points_total", s.total},
                           {"points_failed", s.failed},
                           {"shard", {{"index", s.shard.index}, {"count", s.shard.count}}},
                           {"sweep_points", s.sweep_total},
                           {"run_error", s.error.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(s.error)},
                           {"error", nullptr}});
      else
        std::printf("%s", describe_run_status(dir, s).c_str());
    } catch (const std::exception& e) {
      if (json) folders.push_back({{"dir", dir}, {"error", e.what()}});  // also on stderr, below
      std::fflush(stdout);
      std::fprintf(stderr, "kvbudget status: error: %s\n", e.what());
      rc = kExitError;
    }
  }
  if (json) std::printf("%s\n", folders.dump(2).c_str());
  return rc;
}

}  // namespace kvb::cli
