// One experiment run, from a validated config to its results folder: what
// `kvbudget run` does (experiments/cli/cmd_run.cpp parses the options and prints the
// summary) and what the Python package's kvbudget.run() calls.
//
// The run: the sweep's points (a shard's, or with resume_dir those of the folder's
// shard not yet finished), the data (a file, a synthetic generation or an exact model
// run), then results/<name>/<timestamp>[-shardIofN]/ (or resume_dir): config.toml,
// manifest.json ("running" with a heartbeat, then complete / interrupted / failed, or
// "crashed" on a fatal signal), results.jsonl appended point by point, points.csv
// rewritten at most once a second while the sweep runs, and at the end points.csv,
// errors.csv, results.jsonl, attribution.csv, concentration.csv, pareto.csv,
// budgets.json and plots/. A failed write is an error of the run, never a lost run:
// the rest is still written.
#pragma once
#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/shard.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"

namespace kvb {

// The two phases the caller's signal handling tells apart: while the data loads
// nothing has been written (a stop may end the process at once); from the results
// folder on, a stop is graceful (what finished is written).
enum class RunPhase { Loading, Writing };

struct RunRequest {
  ExperimentSpec spec;               // overrides, budgets and run options applied
  std::string command_line;          // the manifest's "command": "kvbudget run configs/x.toml ..."
  std::optional<Shard> shard;        // one part of the points (--shard); nullopt = all or the resumed folder's
  std::filesystem::path resume_dir;  // continue this results folder (--resume); empty = a new folder
  bool quiet = false;                // no progress or status lines on stderr
  // The config's own output.plots, before --no-plots (manifest.json's `plots_in_config`:
  // merge draws the plots of shards run with --no-plots when their config asks for
  // them); nullopt = spec.output.plots.
  std::optional<bool> plots_in_config;
  // Becomes true (a signal handler, KeyboardInterrupt) to stop the sweep: points not
  // yet started are skipped and everything finished is written.
  const std::atomic<bool>* stop = nullptr;
  // Called as the run enters each phase (before the data loads; once the results
  // folder is about to be made). Optional.
  std::function<void(RunPhase)> on_phase;
  // Called (serialized) after each point of the sweep, after the run's own bookkeeping.
  PointCallback on_point;
};

struct RunOutcome {
  std::filesystem::path dir;         // the results folder
  std::vector<PointResult> results;  // every finished point (with resume_dir: the kept ones too), by id
  size_t points = 0;                 // the run's points (a shard's; with resume_dir, kept ones included)
  size_t failed = 0;                 // points whose measurement failed (errors.csv)
  bool interrupted = false;          // *stop became true
  // The recording's layers were streamed: every point finishes with the last layer, so a
  // run interrupted before then finished none of the points it was measuring.
  bool streamed = false;
  // Failures outside any point (writing a file, a callback): "points.csv / errors.csv: ...".
  std::vector<std::string> run_errors;
  bool points_lost = false;      // the final points.csv / errors.csv write failed
  std::string lost_points_csv;   // then: the rows points.csv should have held
  std::string plot_error;        // the plots could not be written
  bool plots_written = false;
  std::string frontier;          // the console summary of the Pareto frontiers and budgets
  double wall_seconds = 0;
  std::string status;            // the final manifest's: complete, interrupted or failed
};

// Runs the experiment. Throws kvb::ConfigError / kvb::Error for what fails before the
// results folder exists (a bad shard or resume folder, an unwritable output
// directory, data that cannot be loaded, a CUDA backend without a device) and
// kvb::RunInterrupted when *stop became true before the results folder was made.
// From the results folder on, failures are collected in the outcome instead.
RunOutcome run_experiment(const RunRequest& request);

// Thrown by run_experiment when the run was stopped before anything was written.
class RunInterrupted : public Error {
 public:
  using Error::Error;
};

}  // namespace kvb
