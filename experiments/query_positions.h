// The query positions of a run: those strategies calibrate on and those evaluated,
// resolved for a recording's length from [calibration] and metrics.positions, and the
// checks that the evaluated rows can measure the reported metrics.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "sim/plan.h"
#include "sim/recording.h"
#include "sim/strategies/strategy.h"

namespace kvb {

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
// The calibration positions of a recording of T tokens ([calibration]'s explicit
// positions below T, or its stride rule), as resolve_positions chooses them.
std::vector<int64_t> calibration_positions(const CalibrationSpec& calibration, int64_t T);
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

// Throws kvb::ConfigError when `rec` is a sliding-window model's, recorded past its
// smallest window W (Recording::full_causal_queries() < T), and the run would measure
// attention on it: an attention-level metric in metrics.report (named at its key), or
// attribution (on by default; [attribution] points = "none" turns it off). The
// simulator computes full causal attention, which that model does not compute for
// queries t >= W; its model-level metrics (the forward pass honours the windows) run.
void check_full_causal_metrics(const ExperimentSpec& spec, const Recording& rec);

// A plan built from an exact run's recording outside an experiment, as `kvbudget eval`,
// `kvbudget generate` and kvbudget.evaluate (Python) build it.
struct CalibratedPlan {
  Plan plan;
  // Query positions of the recording: a strategy that reads statistics (entropies,
  // received attention) measures them on `calibration` (`kvbudget run`'s default
  // [calibration]: every 8th from 7); `evaluation` are the others.
  QueryPositions positions;
  bool calibrated = false;  // the strategy read statistics
  // Of `calibration`, those at or beyond a sliding-window model's window W, which the
  // statistics leave out (RecordingStats); `evaluation` leaves them out all the same.
  int64_t calibration_beyond_window = 0;
};
// Throws kvb::Error "<source>: invalid plan: ..." for a plan that fails Plan::check().
CalibratedPlan build_calibrated_plan(const Strategy& strategy, const Recording& recording, uint64_t seed,
                                     const std::string& source);

}  // namespace kvb
