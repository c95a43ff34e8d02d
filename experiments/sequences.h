// Several sequences (methods.md §4 "Several sequences"): a config whose data names
// several recordings, texts or synthetic seeds measures every point on each, and
// reports the aggregate.
//
// A point's aggregate over S sequences:
//  - each metric: the mean over sequences of its value on each (each sequence weighs
//    the same; every sequence has the same number of tokens and evaluated positions);
//  - its interval (`<metric>_lo/_hi`): a two-level bootstrap, sequences drawn with
//    replacement and, within each drawn sequence, its blocks of query positions (or an
//    answer task's problems) with replacement (bootstrap.h pooled_sequence_resamples,
//    paired.h two_level_resamples);
//  - its standard error (`<metric>_se`): sqrt(Σ_s se_s²) / S, the sum of the
//    sequences' variances (the sequences taken as independent);
//  - the block sums that paired comparisons resample: joined in sequence order, so
//    that comparisons.csv resamples sequences and blocks (paired.h);
//  - memory (bpe, bytes, ...): the same on every sequence (refused before anything is
//    measured otherwise: plan_memory_mismatches), so taken from sequence 0; the plan
//    text and annotations are sequence 0's (every sequence's are in
//    points_by_sequence.csv); attribution sums add up over sequences; seconds add up;
//  - PointResult::sequences: each sequence's result (its row in points_by_sequence.csv),
//    also when the aggregate failed.
// With one sequence the aggregate is that sequence's result, bit for bit.
#pragma once
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/sweep.h"

namespace kvb {

// Aggregates one point's results on each sequence (aligned with `sources`, as
// sequence_source() names them; all for the same point id). A point that failed on a
// sequence fails, its error naming the sequence. Resamples kept for the intervals
// (PointResult::resamples) are dropped from the aggregate.
PointResult aggregate_sequences(const ExperimentSpec& spec, const std::vector<const PointResult*>& per_sequence,
                                const std::vector<std::string>& sources);

// Each point's memory accounting must be the same on every sequence (methods.md §1
// figures: bpe, bpe_target, bytes, bytes_target, the context a plan is sized for and
// whether the cache stores tokens alike). `checks[s]` is check_plans() on sequence s
// (recordings of `tokens` tokens each) for `points`. Returns one message per point
// whose memory differs: "KEY: bpe 4.25 on sequence 0 (a.safetensors) but 4.5 on
// sequence 1 (b.safetensors)". Points whose plan failed on some sequence are skipped
// (check_plans reports them).
std::vector<std::string> plan_memory_mismatches(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                                const std::vector<PlanCheck>& checks,
                                                const std::vector<std::string>& sources, int64_t tokens);

// Throws kvb::ConfigError naming both sequences (index and source) when a sequence's
// recording differs from sequence 0's in tokens (after data.max_tokens), layers,
// query or KV heads or head_dim: every point's memory and evaluated positions must be
// the same on every sequence (methods.md §4 "Several sequences").
void check_sequences_alike(const std::vector<const Recording*>& recordings, const std::vector<std::string>& sources,
                           const std::string& where);

// points_by_sequence.csv: points.csv's rows for every sequence, each with a leading
// `sequence` (index) and `source` column. `points_csv_of(s)` is points.csv's text of
// sequence s's results.
std::string points_by_sequence_csv(const std::vector<std::string>& sources,
                                   const std::vector<std::string>& points_csv_of_sequence);

// What a run or merge says when points_by_sequence.csv lacks the rows of measured
// points `ids` (Report::write_points_by_sequence: their per-sequence results were not
// logged by the build that measured them).
std::string unknown_sequence_rows_note(const std::vector<size_t>& ids);
// Whether `warning` is an unknown_sequence_rows_note (of any ids).
bool is_unknown_sequence_rows_note(const std::string& warning);

}  // namespace kvb
