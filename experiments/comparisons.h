// Paired comparisons against a baseline (metrics.baseline; methods.md §4,
// "Uncertainty"): comparisons.csv and its console summary.
//
// Every finished point that is not a baseline point is compared with the baseline
// strategy's point nearest to it in memory (output.x; ties: the lower id), so a sweep
// of budgets compares each budget with the baseline at the same budget. For every
// reported metric that is pairable (sim/metrics/paired.h) a row gives both values, the
// difference (point − baseline), its paired bootstrap interval and the verdict:
// "better" / "worse" only when the interval excludes zero, else "no measurable
// difference" (or "not comparable": too few blocks or problems, kMinIntervalUnits).
// Both points' memory on output.x stands beside it: a point with no baseline point at
// its memory is compared at unequal memory, and says so; a memory taken at a longer
// context than the error was measured on is marked extrapolated (extrapolated_on, as
// pareto.csv marks it).
#pragma once
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/sweep.h"

namespace kvb {

struct Comparison {
  size_t id = 0, baseline_id = 0;
  std::string metric;
  double value = 0, baseline_value = 0;
  std::string memory_axis;                 // output.x: bpe, bytes, bpe_target or bytes_target
  double memory = 0, baseline_memory = 0;  // the two points' memory on it
  // Whether each memory is extrapolated (extrapolated_on), and why (extrapolation_note;
  // empty when not).
  bool extrapolated = false, baseline_extrapolated = false;
  std::string extrapolation, baseline_extrapolation;
  PairedDifference difference;
  std::string verdict;
};

// The comparisons of `results` (any order; failed points skipped) against
// spec.metrics.baseline, in (id, metric table) order. Empty when no baseline is set
// or no baseline point finished.
std::vector<Comparison> compare_with_baseline(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                              const std::vector<PointResult>& results);

// comparisons.csv: id, strategy, label, key, baseline_id, baseline_label, memory_axis,
// memory, baseline_memory, extrapolated, baseline_extrapolated (true/false), metric,
// value, baseline_value, difference, difference_lo, difference_hi, verdict.
std::string comparisons_csv(const std::vector<SweepPoint>& points, const std::vector<Comparison>& comparisons);

// One console line per compared point: its verdict in the primary metric
// (metrics.primary) first, then in every other compared metric; a point whose memory
// is extrapolated is marked " (extrapolated)", and the notes saying why follow the
// lines, each once.
std::string comparisons_console(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                const std::vector<Comparison>& comparisons);

}  // namespace kvb
