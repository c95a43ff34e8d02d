// Report: everything a run writes under results/<name>/<timestamp>/.
//
//   config.toml     the resolved config (after --set, with run's --out, --threads, --backend,
//                   --no-plots and --budget folded in)
//   manifest.json   git commit, build type, CPU, threads, seed, wall time, status, backend,
//                   calibration and evaluated positions; the shard, the config hash and
//                   the data's identity (what merge and --resume compare); process id,
//                   host and heartbeat (experiments/run_state.h)
//   results.jsonl   every finished point's result, read back by merge and --resume
//                   (experiments/point_log.h)
//   points.csv      one row per point: strategy name, key, label, coordinates, bpe, bytes,
//                   extrapolated, every metric, then the strategies' annotations
//                   (rho_first, budget_bpe, ...); with several sequences, the aggregate
//                   over them (experiments/sequences.h)
//   errors.csv      points that failed, with the reason (only when some failed)
//   points_by_sequence.csv   with several sequences (data.recordings, ...): points.csv's
//                   rows on each sequence, with `sequence` and `source` columns first;
//                   rebuilt from results.jsonl (each point's per-sequence results), so a
//                   resumed or merged folder has the rows of every point
//   attribution.csv, concentration.csv   error-budget attribution of the selected
//                   points (experiments/attribution.h)
//   pareto.csv      the non-dominated points for each Pareto metric (strategy, label),
//                   memory on output.x, with whether each point is extrapolated there
//   budgets.json    answers to the budget queries (also printed), each pick with its
//                   strategy and label, whether it is extrapolated (methods.md §1) and why
//   comparisons.csv every point against metrics.baseline: paired differences with
//                   intervals and verdicts (experiments/comparisons.h)
//   plots/<metric>.png|svg|pdf, .caption.txt   memory (output.x) against each Pareto
//                   metric: a curve per strategy, the frontier, extrapolated points
//                   hollow; the caption lists what is not drawn (experiments/plot_pareto.py)
//   plots/attribution_*, plots/concentration*   attribution plots, 12 points a page
//                   (experiments/plot_attribution.py)
//
// Every file is written atomically (sim/io/atomic_file.h).
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/frontier.h"
#include "experiments/query_positions.h"
#include "experiments/shard.h"
#include "experiments/sweep.h"
#include "sim/recording.h"

namespace kvb {

// Every column points.csv can hold for this sweep, in file order: id, strategy, type,
// key, the sweep coordinates, plan, bpe, bpe_target, bytes, bytes_target,
// compression, extrapolated, the reported metrics, the columns the sweep's strategy types may add
// (StrategyType::columns), seconds.
std::vector<std::string> points_csv_columns(const ExperimentSpec& spec, const std::vector<SweepPoint>& points);

// Throws kvb::ConfigError at output.series / output.marker when it names none of
// points_csv_columns (a typo would otherwise surface only at the plot step).
void check_plot_columns(const ExperimentSpec& spec, const std::vector<SweepPoint>& points);

// The run's warnings when its intervals and paired verdicts have too few units to
// resample (fewer than kMinIntervalUnits, sim/metrics/bootstrap.h), for stderr and
// manifest.json's warnings: "1 block of evaluated positions (fewer than 5): no bootstrap
// intervals or paired verdicts; evaluate more positions (metrics.positions)", and
// likewise for the model metrics' blocks of next-token positions and an answer task's
// problems (read from the finished points' block sums; on several sequences, per
// sequence), one warning per kind of unit. `evaluated_positions`: how many query
// positions were evaluated. Empty when every reported metric with a bootstrap interval or
// a paired comparison has enough.
std::vector<std::string> too_few_interval_units_warnings(const ExperimentSpec& spec, int64_t evaluated_positions,
                                                         const std::vector<PointResult>& results);

// Creates results/<name>/<timestamp><suffix>/ (then -2, -3, ... if it exists: runs
// started in the same second, shards of a job array, each get their own) and points
// results/<name>/latest at it.
std::filesystem::path make_run_dir(const std::filesystem::path& base, const std::string& name,
                                   const std::string& suffix = "");

struct RunInfo {
  std::string command_line;
  std::string status;  // "running", "complete", "interrupted", "failed", "crashed"
  std::string signal;  // the fatal signal of a "crashed" run (experiments/crash_marker.h)
  // A "failed" run's errors outside any point (the sweep's exception, files not written,
  // plots), joined by "; "; `kvbudget status` prints it. Empty otherwise.
  std::string error;
  std::string started_iso;
  double wall_seconds = 0;
  // Wall seconds of the run's phases, in order (manifest.json's `phase_seconds`; README.md):
  // "data", "identity", "plans", "exact_pass", "points", "reports" follow one another
  // within wall_seconds; "finalize" is the points' finalize summed, spent inside "points".
  // Empty until the run ends.
  std::vector<std::pair<std::string, double>> phase_seconds;
  size_t points_total = 0;
  std::string recording_summary;
  std::vector<std::string> warnings;  // about the data (targets the synthetic generator clamped)
  // A resumed folder's earlier warnings (carried_warnings): those of the points it keeps;
  // the manifest holds them after `warnings`, each text once.
  std::vector<std::string> earlier_warnings;
  BackendChoice backend;  // requested, used and why (used/reason empty until the sweep decided)
  bool backend_decided = false;  // `backend` is this run's choice (made before its first point finished)
  // The backends that measured the folder's points: a resumed folder's earlier ones
  // (manifest_point_backends), then this run's once its first point finishes.
  std::vector<std::string> point_backends;
  QueryPositions positions;  // calibration and evaluated query positions
  // Sharded and resumed runs (experiments/shard.h, run_state.h); points_total above
  // counts the shard's points.
  Shard shard;
  size_t sweep_points_total = 0;
  size_t points_resumed = 0;  // finished points kept from the run --resume continued
  std::string config_hash;    // sweep_config_hash
  std::string data_identity;  // recording_identity (several sequences: each, joined by " + ")
  // Several sequences (methods.md §4 "Several sequences"): each one's source, in order;
  // empty for one sequence.
  std::vector<std::string> sequences;
  double heartbeat_interval_s = 0;
  bool plots_in_config = false;  // RunRequest::plots_in_config
};

class Report {
 public:
  Report(const ExperimentSpec& spec, std::vector<SweepPoint> points, std::filesystem::path dir);

  const std::filesystem::path& dir() const { return dir_; }

  void write_config() const;
  void write_manifest(const RunInfo& info) const;
  std::filesystem::path manifest_path() const { return dir_ / "manifest.json"; }
  // Stamped with this process's id and the current time as its heartbeat.
  std::string manifest_text(const RunInfo& info) const;
  // points.csv (and errors.csv) for the results so far; safe to call repeatedly.
  void write_points(const std::vector<PointResult>& results) const;
  // points_by_sequence.csv (several sequences, `sources` naming each): points.csv's rows
  // on each sequence, from each aggregate's PointResult::sequences, rebuilt whole from
  // `results` (a run's, with a resumed folder's kept points; a merge's), with the
  // annotation columns of all of them. Returns the ids of measured points whose
  // per-sequence results are unknown (read from a results.jsonl of an older build):
  // they have no rows, and the caller says so.
  std::vector<size_t> write_points_by_sequence(const std::vector<std::string>& sources,
                                               const std::vector<PointResult>& results) const;
  // results.jsonl in id order (experiments/point_log.h), replacing what was appended.
  void write_point_log(const std::vector<PointResult>& results) const;
  // attribution.csv and concentration.csv (when any point has an attribution).
  void write_attribution(const std::vector<PointResult>& results) const;
  // The Pareto frontiers and the budget answers of `results`: pareto.csv's text,
  // budgets.json's text (an array, one object per spec.budgets query, in order) and the
  // console text of both. Writes nothing.
  struct Frontier {
    std::string pareto_csv;
    std::string budgets_json;
    std::string console;
  };
  Frontier frontier(const std::vector<PointResult>& results) const;
  // pareto.csv and budgets.json (frontier()); returns the console text of the frontier
  // table and the budget answers, also when a file cannot be written (then
  // *write_error says why, so that the answers still reach the console).
  std::string write_frontier(const std::vector<PointResult>& results, std::string* write_error) const;
  // comparisons.csv (experiments/comparisons.h) when metrics.baseline is set; returns
  // its console summary ("" without a baseline), also when the file cannot be written.
  std::string write_comparisons(const std::vector<PointResult>& results, std::string* write_error) const;
  // Runs experiments/plot_pareto.py (and plot_attribution.py when attribution.csv
  // exists) through plot_python(), with each Pareto metric's axis label from the
  // metric table. Returns an empty string on success, else why no plot was written.
  std::string write_plots() const;

  // CSV text (exposed for tests).
  std::string points_csv(const std::vector<PointResult>& results) const;
  std::string attribution_csv(const std::vector<PointResult>& results) const;
  std::string concentration_csv(const std::vector<PointResult>& results) const;

 private:
  std::vector<std::string> coord_columns() const;
  // Annotation columns: every name any measured point reported, in order of first
  // appearance, except those a sweep coordinate already names (budget_bpe as a sweep
  // axis): one column, the coordinate's value where the point has it, else the annotation's.
  std::vector<std::string> annotation_columns(const std::vector<PointResult>& results) const;
  std::string points_csv(const std::vector<PointResult>& results, const std::vector<std::string>& notes) const;
  FrontierInput frontier_input(const std::vector<const PointResult*>& ok) const;

  const ExperimentSpec& spec_;
  std::vector<SweepPoint> points_;
  std::filesystem::path dir_;
};

// Quotes a CSV field when needed (RFC 4180).
std::string csv_field(const std::string& s);

// The interpreter that runs the plot scripts, resolved to its path: $KVB_PYTHON when
// set (and only it), else Debian's /usr/bin/python3, else the python3 first on PATH;
// the first that imports matplotlib and numpy. Empty when none does, and then *why
// (when given) names each one tried and what to install.
std::string plot_python(std::string* why = nullptr);

}  // namespace kvb
