// Sweep: expands a config's strategy blocks into points (the cartesian product of
// their axes) and runs them in parallel. Work is split into (point, variant, layer)
// tasks (variant 0: the point itself; 1..: its attribution regions) and, with a model,
// one (point, model) task; each point's results are merged in a fixed order, so results
// are identical for any number of threads. Strategies share one RecordingStats
// (calibration statistics).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "experiments/attribution.h"
#include "experiments/experiment.h"
#include "sim/metrics/bootstrap.h"
#include "sim/metrics/paired.h"
#include "sim/model/model_eval.h"
#include "sim/recording.h"

namespace kvb {

class RecordingStats;     // sim/strategies/statistics.h
class StreamedRecording;  // sim/layer_stream.h

struct SweepPoint {
  size_t id = 0;
  size_t block = 0;    // index of its [[strategy]] block
  std::string label;   // the block's name
  std::string type;    // strategy type
  std::string preset;  // preset name, "" = none
  Params params;       // templates substituted, preset and defaults filled
  // Values of the block's axes and variables at this point, for CSV columns/plots.
  std::vector<std::pair<std::string, std::string>> coords;
  std::string key;  // canonical: "uniform(format=int4-asym-g32)", "kivi-2(window=64)"
  // How results name the point (points.csv and pareto.csv `label`, the console,
  // budgets.json, plots): the block's `name` with the values of its axes and variables
  // ("int-sym(bits=4)", or "int-sym" without any), or `key` when the block has no name.
  std::string display_label;
};

// The most points one sweep may have (each holds its parameters until it is written).
inline constexpr int64_t kMaxSweepPoints = 200000;

// Expands every block. Validates each point's parameters by constructing its
// strategy (formats parsed, cross-parameter rules), so a bad value fails before any
// work with the config location and the point key. An empty sweep is an error, and so
// is one of more than kMaxSweepPoints points (sized before expanding).
std::vector<SweepPoint> expand_sweep(const ExperimentSpec& spec);

// A plan's annotations become points.csv columns; each type declares the ones it may
// add (StrategyType::columns), which output.series / output.marker are checked
// against before the sweep runs. Throws kvb::Error naming a column not declared.
void require_declared_columns(const Plan& plan, const std::string& type_name);

struct PointResult {
  size_t id = 0;
  bool ok = false;
  std::string error;  // when !ok: what failed, naming the point
  double bpe = 0, bpe_target = 0;
  double bytes = 0, bytes_target = 0;
  // Plan::mean_bpe_read of the evaluated positions: the memory of the caches the error
  // is averaged over, where bpe is the cache's at T (NaN from older results files).
  double bpe_read = std::numeric_limits<double>::quiet_NaN();
  // The contexts behind those figures (methods.md §1, "extrapolated"): the error is
  // measured on the recording's measured_tokens; the plan was sized for
  // sized_for_tokens (budget_context; = measured_tokens when sized there); and
  // target_extrapolated says that bpe_target/bytes_target describe a cache at a longer
  // context whose make-up differs from the measured one (windows, sink tokens, phases).
  int64_t measured_tokens = 0;
  int64_t sized_for_tokens = 0;
  bool target_extrapolated = false;
  // Plan::stores_tokens_alike: the same make-up at every context, so a plan sized for
  // budget_context > measured_tokens is still the cache measured (not extrapolated).
  bool stores_tokens_alike = false;
  std::string plan;                        // Plan::describe()
  std::vector<Annotation> annotations;     // the strategy's extra results
  std::vector<double> metrics;             // aligned with spec.metrics.report
  // Aligned with metrics: MetricDef::standard_error's value, NaN for a metric without one.
  std::vector<double> standard_errors;
  // Aligned with metrics: the bootstrap interval (sim/metrics/bootstrap.h) of an
  // attention metric, the closed-form one of a metric with MetricDef::interval
  // (answer_accuracy's Wilson interval), {NaN, NaN} for the others.
  std::vector<Interval> intervals;
  // Aligned with metrics: the per-block sums behind a pairable metric (sim/metrics/
  // paired.h), which paired comparisons against metrics.baseline resample; empty for
  // a metric that is not pairable.
  std::vector<BlockSums> block_sums;
  // Aligned with metrics, only while a run over several sequences aggregates them
  // (experiments/sequences.h): the block bootstrap's resampled values of each metric
  // with a bootstrap interval (bootstrap_intervals' `resamples`). Never written.
  std::vector<std::vector<double>> resamples;
  std::optional<Attribution> attribution;  // when [attribution] selects the point
  double seconds = 0;                      // CPU seconds spent on the point (cuda: wall seconds on the device)
  // An aggregate over several sequences (experiments/sequences.h): the point's result on
  // each sequence, in sequence order, without block sums, resamples, attribution or
  // sequences of their own (what points_by_sequence.csv shows; results.jsonl carries
  // them). Empty with one sequence, and for a point read from a results.jsonl written
  // before they were logged (its per-sequence rows are then unavailable).
  std::vector<PointResult> sequences;
};

// Whether a point's memory on `memory` (one of memory_columns()) is taken at a longer
// context than its error was measured on: a plan sized for more tokens than the
// recording (any column), or bpe_target/bytes_target with target_extrapolated.
bool extrapolated_on(const PointResult& r, const std::string& memory);
// A point's memory on `column`, one of memory_columns() (throws kvb::Error for another
// name): the one place that maps the columns to PointResult's fields.
double memory_value(const PointResult& r, const std::string& column);
// points.csv's `extrapolated` column: "no", or which memory figures are extrapolated,
// "budget_context" (the allocation: every column), "target_context" (bpe_target and
// bytes_target), or both joined by '+'.
std::string extrapolated_label(const PointResult& r);
// Why, for a console line or budgets.json: "memory at target_context 32768 tokens,
// error measured on 512", "allocated for budget_context 32768 tokens, ..." (empty when
// not extrapolated on `memory`); target_context is output.target_context.
std::string extrapolation_note(const PointResult& r, const std::string& memory, int64_t target_context);
// How the console marks a point whose memory is extrapolated, after its label, and the
// line (without indentation) that says why, once per note under a table.
inline constexpr const char* kExtrapolatedMark = " (extrapolated)";
std::string extrapolation_line(const std::string& note);

// How far a point's bpe_read may differ from its bpe (a share of bpe) before the run
// warns that its error was measured on caches of another memory (memory_read_note).
inline constexpr double kMemoryReadTolerance = 0.05;
// The run's warning (empty when none) for the measured points whose bpe_read differs
// from their bpe by more than kMemoryReadTolerance: their error is averaged over caches
// shorter than T, whose memory is not the bpe they are compared at (methods.md §1).
// Names how many, and the one that differs most; `points` indexed by id.
std::string memory_read_note(const std::vector<PointResult>& results, const std::vector<SweepPoint>& points);
// Whether a manifest warning is a memory_read_note: derived from a folder's points as a
// whole, so merge and --resume derive it again instead of carrying an earlier one.
bool is_memory_read_note(const std::string& warning);

// The bootstrap behind PointResult::intervals: BootstrapSettings' defaults (200
// resamples, 95 %) with the experiment's seed. manifest.json records them.
BootstrapSettings bootstrap_settings(const ExperimentSpec& spec);

// Called (serialized) as each point finishes, with how many are done.
using PointCallback = std::function<void(const SweepPoint&, const PointResult&, size_t done, size_t total)>;

// What check_plans() finds before a sweep starts.
struct PlanCheck {
  // "FILE:LINE: [strategy[i]] (name \"N\"): point KEY: why" (point_location) for each
  // point whose plan cannot be built on this data: a format whose group size does not
  // divide head_dim, a budget below the cheapest or above the dearest allocation, ...
  // (after the location, the message run_sweep would put in errors.csv).
  std::vector<std::string> errors;
  // "FILE:LINE: [strategy[i]] (name \"N\"): point KEY: why" (point_location, as the
  // errors) for what a point's plan says that its user must hear though it can run,
  // in point order: the strategy's own (StrategyInput::warnings: the optimal allocator leaving
  // its budget unspent), an allocating strategy's (a budget_bpe over a family) that gave
  // every unit one width per kind (uniform_allocation_warning: entropy at budget_bpe 3
  // with the default widths is uniform int2), and a window covering the whole recording
  // (whole_recording_windows).
  std::vector<std::string> warnings;
  // Aligned with the points: the plans built (none where the plan failed or a stop came
  // first), and the seconds each took; run_sweep takes them instead of building again.
  std::vector<std::optional<Plan>> plans;
  std::vector<double> plan_seconds;
};

// Builds every point's plan on `rec` as run_sweep's first phase does (no measurement
// of the points; the optimal allocator's tables on planning_backend()),
// to refuse a sweep whose points cannot run before anything is measured or written.
// Stops early (returning what it found) when *stop becomes true.
// `stats`: the statistics on `rec` computed already (a streamed recording's first pass,
// experiments/streaming.h, whose layers' tensors are not held now); nullptr = its own.
PlanCheck check_plans(const ExperimentSpec& spec, const Recording& rec, const std::vector<SweepPoint>& points,
                      const std::atomic<bool>* stop = nullptr, RecordingStats* stats = nullptr);

// When every allocated segment of the plan's keys has one format and likewise for its
// values, over more than one unit: that allocation, "K:int2-asym-g32 V:int2-asym-g32";
// else "" (the allocator spread its widths, or nothing was allocated).
std::string uniform_allocation(const Plan& plan);

// The warning for such a plan ("" for none): "the allocation is uniform, K:int2-asym-g32
// V:int2-asym-g32 in every unit: ..." when keys and values share one format, "the
// allocation gives one width per kind, K:int4-asym-g32 V:int2-asym-g32 ..." when not.
std::string uniform_allocation_warning(const Plan& plan);

// The warning for a plan with a recent window of at least the recording's tokens after
// its prefill ("" for none): the units holding one are stored entirely at the window's
// format, so their quantizer is never measured. Names each kind's window size, format
// and how many of the layers × KV heads units hold it.
std::string whole_recording_windows(const Plan& plan);

// Where a point comes from, as config errors name it, ending in ": ":
// "bad.toml:10: [strategy[1]] (name \"b\"): point KEY: " (the name only where the block
// has one); "KEY: " for a point of no block of `spec`.
std::string point_location(const ExperimentSpec& spec, const SweepPoint& point);

// Wall seconds of run_sweep's phases (manifest.json's `phase_seconds`, experiments/
// runner.cpp), added to, so that a run's sweeps (one per sequence) sum up.
struct SweepSeconds {
  double plans = 0;       // the plans check_plans did not build, and the backend's choice
  double exact_pass = 0;  // the exact attention pass the layer tasks share (0 when each computes it inline)
  double tasks = 0;       // the task loop from the task list on, the points' finalize inside it
  double finalize = 0;    // the points' finalize (merge, metrics, intervals), summed over points: part of `tasks`
};

// Runs the points on spec.backend (experiments/backend.h) and the positions
// resolve_positions() gives: plans are built on the CPU (the optimal allocator's
// distortion tables measured on planning_backend()), then the chosen backend's
// Measurer (sim/measurer.h) runs the (point, variant, layer) tasks, as many at once as
// it runs measurements: in parallel on the CPU, one after another on CUDA (in task
// order, so points one after another on the device; a finished point's results, its
// merged rows, metrics and intervals, are computed on a host thread of their own while
// the device runs the next point, and reported in point order). When *stop becomes true (Ctrl-C), points
// not yet started are skipped and only finished points are returned. Returned results
// are sorted by id. `chosen` receives the backend that ran and why. Throws kvb::Error
// when backend = "cuda" finds no usable device.
// Model-level metrics need `model` (source = "model"; its recording() is `rec`): each
// point then also runs one model task on the CPU, a forward pass and the
// continuations with its plan, whose position-level metrics cover the evaluated
// positions. Layer tasks are skipped for points that need neither tensor/attention
// metrics nor attribution; a point with no task at all is finished (and reported)
// right after its plan.
// An exception thrown by on_point (an I/O error writing results, say) does not stop
// the sweep: every message goes to `callback_errors` when given; without it the first
// is thrown as kvb::Error once the sweep has finished.
// `prepared`: check_plans() on these same points; its plans are moved into the sweep
// (no plan is built twice).
// `streamed`: `rec` is streamed->recording(), whose layers are held one at a time
// (sim/layer_stream.h, experiments/streaming.h): the layer tasks then run layer by
// layer, every point's tasks of a layer while it alone is held (with its exact pass,
// when it is measured more than once), and the results are the held recording's bit
// for bit. Needs `prepared` with every point's plan (plans are not built on a recording
// whose layers are not held) and no model. What the recording's loads throw (in one
// pass, experiments/streaming.h, a layer that fails validation as it is first loaded)
// leaves run_sweep.
// `seconds`: the phases' wall seconds are added to it (a streamed sweep's exact passes,
// one per layer, count in `tasks`).
std::vector<PointResult> run_sweep(const ExperimentSpec& spec, const Recording& rec,
                                   const std::vector<SweepPoint>& points, const PointCallback& on_point,
                                   const std::atomic<bool>* stop, BackendChoice* chosen = nullptr,
                                   const ModelEvaluator* model = nullptr,
                                   std::vector<std::string>* callback_errors = nullptr,
                                   PlanCheck* prepared = nullptr, StreamedRecording* streamed = nullptr,
                                   SweepSeconds* seconds = nullptr);

}  // namespace kvb
