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
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "experiments/backend.h"
#include "experiments/config.h"
#include "sim/metrics/metric_table.h"
#include "sim/model/model_eval.h"
#include "sim/recording.h"
#include "sim/strategies/strategy.h"
#include "sim/synthetic.h"

namespace kvb {

// [data] source = "model": a checkpoint run on a text; the recording strategies see is
// the exact model's, and every point also gets the model-level metrics.
struct ModelDataSpec {
  std::filesystem::path checkpoint;  // Hugging Face checkpoint directory
  TokenSource tokens;                // text or token ids, tokenizer, BOS, max_tokens
  ContinuationSpec continuations;    // greedy continuations for token match and BLEU
  WindowSpec windows;                // data.n_ctx, data.score: chunked evaluation of a long text
  // [task]: an answer task for answer_accuracy and the flips (sim/model/answer_task.h);
  // its tokenizer and BOS setting are [data]'s.
  std::optional<AnswerTaskSpec> task;
  std::string task_where;            // "file:line: task.file", for messages about the task
  // data.quantize_layers: the layers every point's plan quantizes (resolved against
  // config.json's layer types; empty = every layer), the others stored whole at
  // other_layers_format (sim/model/layer_selection.h).
  std::vector<int64_t> quantize_layers;
  std::string quantize_layers_where;  // "file:line: data.quantize_layers"
  FormatPtr other_layers_format;
};

struct DataSpec {
  enum class Source { File, Synthetic, Model } source = Source::File;
  RecordingSpec file;
  SyntheticSpec synthetic;
  ModelDataSpec model;
  int64_t max_tokens = 0;  // applied to synthetic and model data too
  std::string where;       // config location, for messages
  // Several sequences (methods.md §4 "Several sequences"): every point is measured on
  // each and results aggregate over them. data.recordings (source = "file"),
  // data.texts or data.token_files (source = "model"): the paths, resolved, in order
  // (a glob expanded in place, sorted), with the fields above holding the first;
  // data.synthetic.seeds: the seeds, synthetic.seed the first. Both empty: one
  // sequence, the fields above.
  std::vector<std::filesystem::path> sequence_paths;
  std::vector<uint64_t> sequence_seeds;
  std::string sequences_where;  // "file:line: data.recordings", for messages
  size_t sequence_count() const {
    return std::max<size_t>(1, std::max(sequence_paths.size(), sequence_seeds.size()));
  }
};

// One DataSpec per sequence of `data` (a copy of `data` with its path or seed set and
// the lists cleared); `data` itself when it names one sequence.
std::vector<DataSpec> expand_sequences(const DataSpec& data);
// How messages and per-sequence results name a sequence of expand_sequences(): its
// recording, text or token file path, or "synthetic seed N".
std::string sequence_source(const DataSpec& one);

// One sweep axis or fixed value of a strategy block.
struct Axis {
  std::string name;                 // parameter or variable name
  std::vector<ParamValue> values;   // one value = fixed
  bool is_var = false;              // declared under [strategy.vars]
  bool from_preset = false;         // set by the block's preset, not the block itself
  std::string where;                // config location
};

struct StrategyBlock {
  size_t index = 0;
  std::string type;
  std::string label;      // `name` in the config, default the preset or the type
  bool named = false;     // `name` given: results label its points by it (SweepPoint::display_label)
  std::string preset;     // `preset` in the config, "" = none
  std::map<std::string, ParamValue> preset_values;  // what the preset sets
  std::vector<Axis> axes; // params and vars, sorted by name; the last varies fastest
  std::string where;
};

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
  bool selects(size_t id) const;
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
// the recording's length (bpe, bytes) and at output.target_context (bpe_target,
// bytes_target). output.x picks one for the plots and frontiers.
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

struct BudgetQuery {
  std::string text;       // as written
  std::string lhs;        // metric name, "bpe" or "bytes"
  bool upper = true;      // "<=" (true) or ">=" (false)
  double bound = 0;
  bool memory = false;    // a memory budget (least error within it) vs an error budget
};

struct ExperimentSpec {
  std::string name;
  std::string description;
  uint64_t seed = 0;
  int threads = 0;  // 0 = OpenMP default
  BackendRequest backend = BackendRequest::Cpu;  // experiments/backend.h
  DataSpec data;
  std::vector<StrategyBlock> strategies;
  CalibrationSpec calibration;
  MetricsSpec metrics;
  AttributionSpec attribution;
  OutputSpec output;
  std::vector<BudgetQuery> budgets;
  std::filesystem::path config_path;
  std::string resolved_toml;  // the config after --set overrides (and run's options), as TOML text
};

// Loads, applies overrides, validates everything that can be checked without data
// (types, unknown keys, unknown metrics/strategies/formats in fixed values, empty
// sweeps). Throws ConfigError with file:line locations.
ExperimentSpec load_experiment(const std::filesystem::path& file, const std::vector<std::string>& overrides);
ExperimentSpec parse_experiment(std::shared_ptr<ConfigDoc> doc);

// Parses "attn_kl_mean <= 1e-3" / "bpe <= 4" / "topk_overlap >= 0.9". Strict '<' and
// '>' are rejected (budgets are inclusive).
BudgetQuery parse_budget_query(const std::string& text, const std::string& where);

// Parses a budget query and adds it to spec.budgets. An error budget's metric must be
// measurable on spec.data (a model-level metric needs source = "model") and is added
// to spec.metrics.report (in table order) so that every point measures it. Throws
// ConfigError naming `where`. Used for [budgets] queries and `--budget`.
void add_budget_query(ExperimentSpec& spec, const std::string& text, const std::string& where);

// `kvbudget run`'s options that stand for config keys, recorded in
// spec.resolved_toml so that the saved config.toml reruns the experiment as it ran
// (the values were applied to spec already).
struct RunOptionsInConfig {
  int threads = 0;                   // --threads; 0 = not given
  std::string out_dir;               // --out; empty = not given
  std::string backend;               // --backend; empty = not given
  bool no_plots = false;             // --no-plots
  std::vector<std::string> budgets;  // --budget queries, appended to [budgets] queries
};
void record_run_options(ExperimentSpec& spec, const RunOptionsInConfig& o);

// The most OpenMP threads a config (`threads`) or a command (--threads) may ask for.
inline constexpr int kMaxThreads = 1024;

// The most values one range may expand to.
inline constexpr int64_t kMaxRangeValues = 1000000;

// Numeric range "2..8" or "0.1..0.5:0.1" -> values (ints when all parts are ints);
// nullopt when `text` is not a range, an empty vector when the range is empty (b < a
// or step <= 0). Throws ConfigError (without a location) when a number overflows or
// the range has more than kMaxRangeValues values.
std::optional<std::vector<ParamValue>> parse_range(const std::string& text);

// Builds the recording the experiment describes (loads or generates, truncates; for
// a model, records the exact run).
Recording build_recording(const DataSpec& data);

// For source = "model": loads the checkpoint and the tokens and runs the exact model
// (ModelEvaluator), whose recording() is the experiment's recording. `backend` is where
// its forward passes run, the quantized points' included (experiments/model_backend.h;
// a task's problems run on the CPU).
std::shared_ptr<const ModelEvaluator> build_model_evaluator(const DataSpec& data,
                                                            BackendRequest backend = BackendRequest::Cpu);

// The calibration and evaluated query positions for a recording of T tokens.
// Evaluated positions: metrics.positions when given ("all": every position, the
// calibration ones included), else every position not used for calibration (every
// position with calibration.overlap). Throws ConfigError when
// explicit evaluated positions overlap calibration ones without calibration.overlap,
// or when no position lies below T.
struct QueryPositions {
  std::vector<int64_t> calibration;
  std::vector<int64_t> evaluation;  // never empty
  std::string evaluation_text;      // how they were chosen, for the manifest
};
QueryPositions resolve_positions(const ExperimentSpec& spec, int64_t T);
// Throws kvb::ConfigError at metrics.positions when a reported position-level model
// metric (ppl, next_token_kl_*, same_top_rate: each position t predicts token t + 1)
// has no evaluated position below T - 1 to average over.
void check_model_metric_positions(const ExperimentSpec& spec, const QueryPositions& positions, int64_t T);
// Throws kvb::ConfigError where a reported attention distribution metric could only
// say "exact" whatever the cache holds: at metrics.positions when position 0 alone is
// evaluated (its query sees one key: attn_kl_* 0, topk_overlap 1), at metrics.topk when
// topk_overlap is reported and topk reaches every key of every evaluated row (topk >=
// the last evaluated position + 1, at most T). Logit, output and tensor metrics still
// measure such rows and are not checked.
void check_attention_rows(const ExperimentSpec& spec, const QueryPositions& positions, int64_t T);

}  // namespace kvb
