// ExperimentSpec: a TOML experiment config, validated. See configs/README.md for the
// full reference and configs/quickstart.toml for an example.
//
//   name, description, seed, threads, backend
//   [data]          a recording file (path + tensor name patterns + layout), or
//   [data.synthetic] a seeded synthetic recording, or
//   [data] source = "model": a checkpoint run on a text (model-level metrics too)
//   [task]          with a model: prompts and expected answers (answer_accuracy)
//   [[strategy]]    type + parameters; any parameter may be a sweep axis: an array
//                   ([32, 64]) or a numeric range string ("2..8", "0.1..0.5:0.1").
//                   [strategy.vars] declares template variables used as {name}
//                   inside string parameters ("int{bits}-{mode}-g{group}").
//   [calibration]   query positions strategies measure statistics on (entropies,
//                   distortion tables); disjoint from the evaluated ones by default
//   [metrics]       which metrics to report, which get a Pareto front, top-k, positions
//   [attribution]   which points get an error-budget attribution
//   [output]        results directory, plots, target context
//   [budgets]       queries = ["attn_kl_mean <= 1e-3", "bpe <= 4"]
// This file holds the spec and reads [calibration], [metrics], [attribution] and
// [output]; the other pieces have a file each: data_spec.h ([data], [task]),
// strategy_blocks.h ([[strategy]]), range_grammar.h, budget_queries.h ([budgets]),
// query_positions.h (a run's calibration and evaluated positions), data_building.h
// (the recording and the model evaluator a [data] spec describes).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "experiments/backend.h"
#include "experiments/budget_queries.h"
#include "experiments/config.h"
#include "experiments/data_spec.h"
#include "experiments/strategy_blocks.h"

namespace kvb {

// Query positions that strategies calibrate on (methods.md §3: the calibration tokens
// must be separable from the evaluated ones). One set per run, shared by every
// strategy, so every point is evaluated on the same rows.
struct CalibrationSpec {
  std::vector<int64_t> positions;  // explicit positions (sorted); empty = the stride rule
  bool explicit_positions = false;
  int64_t stride = 8;              // every stride-th position ...
  int64_t offset = 7;              // ... starting here
  bool overlap = false;            // true: evaluated positions may include calibration ones
  std::string text = "stride 8 from 7";  // for the manifest
};

struct AttributionSpec {
  enum class Select { All, None, Ids } select = Select::All;
  std::vector<int64_t> ids;  // Select::Ids: point ids
  std::string ids_where = "attribution.points";  // "file:line: attribution.points" for errors
  bool regions = true;       // token-region shares (costs one extra simulation per region)
  // attribution.metrics: the additive errors attributed (AdditiveError, by their
  // metrics' names), in the order given; empty = default_attributed_errors()
  // (experiments/attribution.h): attn_kl_mean's and attn_out_rel_fro's.
  std::vector<const AdditiveError*> errors;
  bool selects(size_t id) const;
  // `errors`, or the default when empty.
  const std::vector<const AdditiveError*>& attributed_errors() const;
};

struct MetricsSpec {
  std::vector<std::string> report;  // metric names, table order
  std::vector<std::string> pareto;  // metrics that get a frontier and a plot
  int64_t topk = 8;
  std::string topk_where = "metrics.topk";  // "file:line: metrics.topk" when given
  std::vector<int64_t> positions;   // evaluated query positions; empty = every_position or the default
  bool every_position = false;      // positions = "all": every position, calibration ones included
  std::string positions_text = "all";
  std::string positions_where = "metrics.positions";  // "file:line: metrics.positions" when given
  std::string report_where = "metrics.report";        // likewise for report
  // A strategy name ([[strategy]] name) every other point is compared with, pairwise,
  // in comparisons.csv (experiments/comparisons.h); "" = no comparisons.
  std::string baseline;
  std::string baseline_where = "metrics.baseline";
  // The metric a verdict is decided on (methods.md §4); every reported metric is still
  // shown beside it. Default: the first Pareto metric.
  std::string primary;
};

// The points.csv columns that hold a point's memory: bits per element and bytes at
// the recording's length (bpe, bytes), at output.target_context (bpe_target,
// bytes_target), and the mean bits per element of the caches the evaluated queries read
// (bpe_read, PointResult::bpe_read). output.x picks one for the plots and frontiers.
const std::vector<std::string>& memory_columns();

struct OutputSpec {
  std::filesystem::path dir = "results";
  bool plots = true;
  int64_t target_context = 32768;
  // The memory axis (one of memory_columns()): the plots' x axis, the cost of every
  // Pareto frontier (pareto.csv, the console) and the memory an error budget's answer
  // minimizes.
  std::string x = "bpe";
  std::string series;  // points.csv column that colours plot points; "" = strategy label
  std::string marker;  // points.csv column that shapes plot points; "" = none
  std::string dir_where = "output.dir";        // "file:line: output.dir" when given
  std::string series_where = "output.series";  // "file:line: output.series" when given
  std::string marker_where = "output.marker";  // likewise for marker
  std::string x_where = "output.x";            // likewise for x
};

struct ExperimentSpec {
  std::string name;
  std::string description;
  uint64_t seed = 0;
  int threads = 0;  // 0 = OpenMP default
  BackendRequest backend = BackendRequest::Cpu;  // experiments/backend.h
  MatmulPrecision precision = MatmulPrecision::Fp32;  // `precision`: the CUDA simulator's products
  DataSpec data;
  std::vector<StrategyBlock> strategies;
  CalibrationSpec calibration;
  MetricsSpec metrics;
  AttributionSpec attribution;
  OutputSpec output;
  std::vector<BudgetQuery> budgets;
  // The config file the experiment was started from: relative data paths are looked up
  // in its folder (experiments/data_spec.h resolve_data_path), and manifest.json's
  // `config` names it. For a results folder's config.toml read back (--resume, merge:
  // load_results_config), the config its run was started from, not the copy.
  std::filesystem::path config_path;
  std::string resolved_toml;  // the config after --set overrides (and run's options), as TOML text
};

// Loads, applies overrides, validates everything that can be checked without data
// (types, unknown keys, unknown metrics/strategies/formats in fixed values, empty
// sweeps). Throws ConfigError with file:line locations.
ExperimentSpec load_experiment(const std::filesystem::path& file, const std::vector<std::string>& overrides);
// `data_config`: the config file whose folder relative data paths are looked up in
// (spec.config_path); empty: doc's own file.
ExperimentSpec parse_experiment(std::shared_ptr<ConfigDoc> doc, const std::filesystem::path& data_config = {});

// `kvbudget run`'s options that stand for config keys, recorded in
// spec.resolved_toml so that the saved config.toml reruns the experiment as it ran
// (the values were applied to spec already).
struct RunOptionsInConfig {
  int threads = 0;                   // --threads; 0 = not given
  std::string out_dir;               // --out; empty = not given
  std::string backend;               // --backend; empty = not given
  bool no_plots = false;             // --no-plots
  std::vector<std::string> budgets;  // --budget queries, appended to [budgets] queries
  std::string precision;             // --precision; empty = not given
};
void record_run_options(ExperimentSpec& spec, const RunOptionsInConfig& o);

// The most OpenMP threads a config (`threads`) or a command (--threads) may ask for.
inline constexpr int kMaxThreads = 1024;

}  // namespace kvb
