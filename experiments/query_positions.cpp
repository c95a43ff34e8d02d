#include "experiments/query_positions.h"

#include <algorithm>
#include <numeric>

#include "experiments/sliding_window.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/metric_table.h"
#include "sim/strategies/statistics.h"

namespace kvb {

void check_model_metric_positions(const ExperimentSpec& spec, const QueryPositions& positions, int64_t T) {
  if (std::any_of(positions.evaluation.begin(), positions.evaluation.end(), [&](int64_t t) { return t + 1 < T; }))
    return;
  for (const std::string& name : spec.metrics.report) {
    const MetricDef& m = require_metric(name, "metrics.report");
    if (m.level == MetricLevel::Model && !m.needs_continuations)
      throw ConfigError(spec.metrics.positions_where + ": '" + name + "' predicts token t + 1 at each evaluated " +
                        "position t, but no evaluated position lies below " + std::to_string(T - 1) +
                        " (the last token has nothing to predict)");
  }
}

void check_attention_rows(const ExperimentSpec& spec, const QueryPositions& positions, int64_t T) {
  const auto& report = spec.metrics.report;
  auto reported = [&](const std::string& name) { return std::find(report.begin(), report.end(), name) != report.end(); };
  const int64_t keys = positions.evaluation.back() + 1;  // of the longest evaluated row
  if (keys == 1) {  // position 0 alone: softmax over one key is 1 with any cache
    for (const char* name : {"attn_kl_mean", "attn_kl_p99", "attn_kl_max", "topk_overlap"}) {
      if (!reported(name)) continue;
      throw ConfigError(spec.metrics.positions_where + ": the evaluated positions (" + positions.evaluation_text +
                        ") of the " + std::to_string(T) + "-token context are position 0 alone, whose query sees one "
                        "key: " + name + " would be " + (std::string(name) == "topk_overlap" ? "1" : "0") +
                        " whatever the cache holds; evaluate a later position (more tokens with data.max_tokens, "
                        "other metrics.positions or calibration positions)");
    }
    return;
  }
  if (!reported("topk_overlap") || spec.metrics.topk < keys) return;
  const std::string longest = keys == T ? "the context has " + std::to_string(T) + " tokens"
                                        : "the last evaluated position " + std::to_string(keys - 1) + " of the " +
                                              std::to_string(T) + "-token context sees " + std::to_string(keys) + " keys";
  throw ConfigError(spec.metrics.topk_where + " = " + std::to_string(spec.metrics.topk) + ", but " + longest +
                    ": the top " + std::to_string(spec.metrics.topk) +
                    " keys of every evaluated query are all its keys, so topk_overlap would be 1 whatever the cache "
                    "holds; set metrics.topk below " + std::to_string(keys) + " (or leave topk_overlap out of "
                    "metrics.report)");
}

void check_full_causal_metrics(const ExperimentSpec& spec, const Recording& rec) {
  const std::string why = beyond_window_reason(rec);
  if (why.empty()) return;
  const int64_t W = rec.full_causal_queries();
  for (const std::string& name : spec.metrics.report)
    if (require_metric(name, "metrics.report").level != MetricLevel::Model)
      throw ConfigError(spec.metrics.report_where + ": '" + name + "' is an attention-level metric, but " + why +
                        "; report model-level metrics only (ppl, next_token_kl_*, same_top_rate, ...), or evaluate at "
                        "most " + std::to_string(W) + " tokens (data.max_tokens, or data.n_ctx)");
  if (spec.attribution.select != AttributionSpec::Select::None)
    throw ConfigError(spec.attribution.ids_where + ": attribution splits attention-level errors, but " + why +
                      "; set [attribution] points = \"none\", or evaluate at most " + std::to_string(W) +
                      " tokens (data.max_tokens, or data.n_ctx)");
}

std::vector<int64_t> calibration_positions(const CalibrationSpec& c, int64_t T) {
  std::vector<int64_t> out;
  if (c.explicit_positions) {
    // Positions past the recording are dropped; none left fails only the points that
    // need statistics (RecordingStats::require_calibration), as an offset past T does.
    for (int64_t p : c.positions)
      if (p < T) out.push_back(p);
  } else {
    for (int64_t p = c.offset; p < T; p += c.stride) out.push_back(p);
  }
  return out;
}

QueryPositions resolve_positions(const ExperimentSpec& spec, int64_t T) {
  QueryPositions q;
  const CalibrationSpec& c = spec.calibration;
  q.calibration = calibration_positions(c, T);
  auto is_calibration = [&](int64_t p) { return std::binary_search(q.calibration.begin(), q.calibration.end(), p); };
  if (!spec.metrics.positions.empty()) {
    std::vector<int64_t> overlap;
    for (int64_t p : spec.metrics.positions) {
      if (p >= T) continue;
      q.evaluation.push_back(p);
      if (is_calibration(p)) overlap.push_back(p);
    }
    if (q.evaluation.empty())
      throw ConfigError(spec.metrics.positions_where + ": no position is below the recording's " + std::to_string(T) +
                        " tokens");
    if (!overlap.empty() && !c.overlap) {
      std::vector<std::string> shown;
      for (size_t i = 0; i < std::min<size_t>(5, overlap.size()); ++i) shown.push_back(std::to_string(overlap[i]));
      throw ConfigError(spec.metrics.positions_where + ": overlaps the calibration positions (" + c.text + ") at " +
                        join(shown, ", ") +
                        (overlap.size() > 5 ? ", ..." : "") +
                        ": calibration queries must not be evaluated; set calibration.overlap = true to allow it "
                        "(as the research did)");
    }
    q.evaluation_text = spec.metrics.positions_text;
    return q;
  }
  if (spec.metrics.every_position) {  // "all" says every position: the calibration ones too
    q.evaluation.resize(static_cast<size_t>(T));
    std::iota(q.evaluation.begin(), q.evaluation.end(), int64_t{0});
    q.evaluation_text = q.calibration.empty() ? "all" : "all, calibration positions included";
    return q;
  }
  for (int64_t p = 0; p < T; ++p)
    if (c.overlap || !is_calibration(p)) q.evaluation.push_back(p);
  if (q.evaluation.empty())
    throw ConfigError("calibration: every position of the recording's " + std::to_string(T) +
                      " tokens is a calibration position, none is left to evaluate");
  q.evaluation_text = c.overlap ? "all" : "all not used for calibration";
  return q;
}

CalibratedPlan build_calibrated_plan(const Strategy& strategy, const Recording& recording, uint64_t seed,
                                     const std::string& source) {
  CalibratedPlan out;
  out.positions = resolve_positions(ExperimentSpec{}, recording.tokens);
  RecordingStats calibration(recording, out.positions.calibration);
  out.plan = strategy.build(StrategyInput{recording, seed, &calibration});
  const std::string bad = out.plan.check();
  // A plan the model's shape cannot hold (a group size that does not divide head_dim) is
  // the user's to change, as `run` reports it: a ConfigError (exit 2).
  if (!bad.empty()) throw ConfigError(source + ": invalid plan: " + bad);
  out.calibrated = strategy.needs_statistics();
  out.calibration_beyond_window = calibration.calibration_outside_window();
  return out;
}

}  // namespace kvb
