// The metric table (methods.md §4): every metric a result row can carry, in one list
// that configs, CSV columns, Pareto fronts, budget queries and `kvbudget metrics`
// iterate over. Adding a metric means adding one entry in metric_table.cpp (and, for
// a new per-row quantity, one field of AttentionRow, filled by both simulators:
// sim/simulator.cpp and the CUDA kernels in kernels/attention_rows.cu).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "sim/metrics/error_stats.h"

namespace kvb {

enum class Better { Lower, Higher };
enum class MetricLevel { Tensor, Attention, Model };

// How an attention metric reduces the evaluated rows (ErrorStats::rows), for the
// bootstrap over blocks of query positions (bootstrap.h, methods.md §4 "Uncertainty"):
//  - RatioOfSums: finish(Σ numerator(row) / Σ denominator(row)) (0 when Σ denominator
//    is 0): a mean (denominator 1), an RMS over pairs, a Frobenius ratio;
//  - Quantile: quantile(numerator(row) over rows, q); q = 1 is the maximum.
// Applied to all rows it gives the metric's value (up to summation order).
struct RowReduction {
  enum class Kind { None, RatioOfSums, Quantile };
  Kind kind = Kind::None;
  double (*numerator)(const AttentionRow&) = nullptr;
  double (*denominator)(const AttentionRow&) = nullptr;
  double (*finish)(double) = nullptr;  // nullptr: the ratio itself
  double q = 0;
  // Set when Σ numerator(row) is an additive per-row error (AdditiveError, below): a
  // lower-is-better RatioOfSums whose denominator does not depend on the quantization,
  // so the metric is an increasing function of that sum alone. Names the row error.
  const char* additive_error = nullptr;
};

// How a model metric reduces independent samples, for paired comparisons (paired.h):
// finish(mean over samples i < count(model) of value(model, i)); the samples are the
// next-token positions (compared in blocks of consecutive positions) or, for an answer
// task, the problems (each its own block). value == nullptr: the metric has none.
struct SampleReduction {
  enum class Unit { Positions, Problems };
  Unit unit = Unit::Positions;
  double (*value)(const ModelStats&, size_t i) = nullptr;
  double (*finish)(double) = nullptr;  // nullptr: the mean itself
};

struct MetricDef {
  std::string name;
  std::string unit;      // "nats", "dB", "problems"; "" for a ratio or a fraction
  std::string quantity;  // what it measures, in a few words, for axes and legends: "attention KL, mean"
  std::string description;
  Better better = Better::Lower;
  MetricLevel level = MetricLevel::Attention;
  double (*compute)(const ErrorStats&) = nullptr;
  // Standard error of the metric, as llama.cpp's perplexity tool reports it (methods.md
  // §4, "Uncertainty"); nullptr when the metric has none. Written to points.csv as
  // `<name>_se` right after the metric.
  double (*standard_error)(const ErrorStats&) = nullptr;
  // Attention level: the reduction the bootstrap repeats on resampled blocks of
  // positions; its interval is written as `<name>_lo` and `<name>_hi` (Kind::None: none).
  RowReduction rows = {};
  // Model level only: the metric reduces greedy continuations, so the data source
  // must generate some ([data] continuations > 0).
  bool needs_continuations = false;
  // Shortest continuation (tokens) the metric is defined on: corpus BLEU-4 needs
  // 4-grams, so continuations of fewer than 4 tokens give it nothing to count.
  int64_t min_continuation_tokens = 0;
  // Model level only: the metric scores an answer task's generated answers, so the
  // experiment must name one ([task], `kvbudget eval --task`).
  bool needs_task = false;
  // A closed-form confidence interval (answer_accuracy: Wilson score over problems),
  // written as `<name>_lo` and `<name>_hi` like the bootstrap's; nullptr: none.
  Interval (*interval)(const ErrorStats&) = nullptr;
  // Model level: the metric as a mean over samples, for paired comparisons.
  SampleReduction samples = {};
  // Whether a config without metrics.report reports the metric. false for the detailed
  // statistics of llama.cpp's report (more percentiles, Δp), which a config names.
  bool in_default_report = true;
  // Whether points.csv has `<name>_lo` and `<name>_hi` (bootstrap or closed form).
  bool has_interval() const { return rows.kind != RowReduction::Kind::None || interval != nullptr; }
  // Whether the metric is defined for continuations of `tokens` tokens.
  bool defined_for(int64_t continuations, int64_t tokens) const {
    return !needs_continuations || (continuations > 0 && tokens >= min_continuation_tokens);
  }
};

const std::vector<MetricDef>& metric_table();

// An additive per-row error: Σ over the evaluated rows of error(row), the numerator of
// an attention metric that is an increasing function of that sum alone (its
// RowReduction names it). Being a sum over rows, it splits exactly over layers, query
// heads and token regions (error attribution, experiments/attribution.h), and it is
// what the optimal allocator minimizes as a sum of per-unit distortions
// (sim/strategies/optimal.h). One per metric that names one, in table order:
//   attn_kl_mean: kl, attn_out_rel_fro: out_err2, logit_rmse: logit_err2,
//   attn_out_rel_err: out_rel (‖o − ô‖ / ‖o‖ per row).
struct AdditiveError {
  const char* name = "";              // the row error: "kl", "out_err2" (attribution.csv's `metric`)
  const MetricDef* metric = nullptr;  // the metric it is the numerator of
  double (*of_row)(const AttentionRow&) = nullptr;
  // Σ of_row over the rows, in fp64, in row order.
  double sum(const std::vector<AttentionRow>& rows) const;
};
const std::vector<AdditiveError>& additive_errors();
// By its metric's name ("attn_kl_mean"); nullptr when that metric has none.
const AdditiveError* find_additive_error(std::string_view metric);
// The same; throws kvb::ConfigError naming `where` and the metrics that have one.
const AdditiveError& require_additive_error(std::string_view metric, const std::string& where);
// nullptr if unknown.
const MetricDef* find_metric(std::string_view name);
// Throws kvb::ConfigError naming the closest metric when unknown.
const MetricDef& require_metric(std::string_view name, const std::string& where);

const char* level_name(MetricLevel l);

// How plots and tables name a metric: its quantity, unit and direction,
// "attention KL, mean (nats, lower is better)".
std::string metric_axis_label(const MetricDef& m);

// Standard error of the mean of `values` as llama.cpp's perplexity tool computes it:
// sqrt((mean(x²) − mean(x)²) / (n − 1)), i.e. the sample standard deviation over √n
// (computed in two passes). NaN for fewer than 2 values.
double standard_error_of_mean(const std::vector<double>& values);

// Quantile with linear interpolation between order statistics (NumPy's default); NaN
// when any value is NaN.
double quantile(std::vector<double> values, double q);
// The same, reordering `values` in place (no copy).
double quantile_in_place(std::vector<double>& values, double q);

}  // namespace kvb
