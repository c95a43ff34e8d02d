#include "experiments/comparisons.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "experiments/report.h"
#include "sim/core/strings.h"

namespace kvb {

namespace {


// The baseline point nearest to `r` in memory (ties: the lower id); nullptr if none.
const PointResult* nearest_baseline(const PointResult& r, const std::vector<const PointResult*>& baselines,
                                    const std::string& x) {
  const PointResult* best = nullptr;
  double best_gap = std::numeric_limits<double>::infinity();
  for (const PointResult* b : baselines) {
    const double gap = std::fabs(memory_value(*b, x) - memory_value(r, x));
    if (gap < best_gap || (gap == best_gap && best && b->id < best->id)) {
      best_gap = gap;
      best = b;
    }
  }
  return best;
}

}  // namespace

std::vector<Comparison> compare_with_baseline(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                              const std::vector<PointResult>& results) {
  std::vector<Comparison> out;
  if (spec.metrics.baseline.empty()) return out;
  std::map<size_t, const PointResult*> by_id;
  for (const PointResult& r : results)
    if (r.ok) by_id[r.id] = &r;
  std::vector<const PointResult*> baselines;
  for (const auto& [id, r] : by_id)
    if (points.at(id).label == spec.metrics.baseline) baselines.push_back(r);
  if (baselines.empty()) return out;
  const BootstrapSettings settings = bootstrap_settings(spec);
  for (const auto& [id, r] : by_id) {
    if (points.at(id).label == spec.metrics.baseline) continue;
    const PointResult* base = nearest_baseline(*r, baselines, spec.output.x);
    for (size_t k = 0; k < spec.metrics.report.size(); ++k) {
      if (k >= r->block_sums.size() || k >= base->block_sums.size()) break;  // results of an older build
      const BlockSums& a = base->block_sums[k];
      const BlockSums& b = r->block_sums[k];
      if (a.empty() || b.empty()) continue;  // not pairable
      const MetricDef& metric = require_metric(spec.metrics.report[k], spec.metrics.report_where);
      Comparison c;
      c.id = id;
      c.baseline_id = base->id;
      c.metric = metric.name;
      c.value = r->metrics[k];
      c.baseline_value = base->metrics[k];
      c.memory_axis = spec.output.x;
      c.memory = memory_value(*r, spec.output.x);
      c.baseline_memory = memory_value(*base, spec.output.x);
      c.extrapolation = extrapolation_note(*r, spec.output.x, spec.output.target_context);
      c.baseline_extrapolation = extrapolation_note(*base, spec.output.x, spec.output.target_context);
      c.extrapolated = extrapolated_on(*r, spec.output.x);
      c.baseline_extrapolated = extrapolated_on(*base, spec.output.x);
      c.difference = paired_difference(metric, a, b, settings);
      c.verdict = paired_verdict(metric, c.difference);
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::string comparisons_csv(const std::vector<SweepPoint>& points, const std::vector<Comparison>& comparisons) {
  std::ostringstream os;
  os << "id,strategy,label,key,baseline_id,baseline_label,memory_axis,memory,baseline_memory,extrapolated,"
        "baseline_extrapolated,metric,value,baseline_value,difference,difference_lo,difference_hi,verdict\n";
  auto flag = [](bool b) { return b ? "true" : "false"; };
  for (const Comparison& c : comparisons)
    os << c.id << "," << csv_field(points.at(c.id).label) << "," << csv_field(points.at(c.id).display_label) << ","
       << csv_field(points.at(c.id).key) << "," << c.baseline_id << ","
       << csv_field(points.at(c.baseline_id).display_label) << "," << c.memory_axis << "," << format_double(c.memory)
       << "," << format_double(c.baseline_memory) << "," << flag(c.extrapolated) << ","
       << flag(c.baseline_extrapolated) << "," << c.metric << ","
       << format_double(c.value) << "," << format_double(c.baseline_value) << ","
       << format_double(c.difference.value) << "," << format_double(c.difference.interval.lo) << ","
       << format_double(c.difference.interval.hi) << "," << c.verdict << "\n";
  return os.str();
}

std::string comparisons_console(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                const std::vector<Comparison>& comparisons) {
  if (comparisons.empty()) return "";
  const BootstrapSettings settings = bootstrap_settings(spec);
  std::ostringstream os;
  char level[32];
  std::snprintf(level, sizeof level, "%g %%", settings.level * 100);
  os << "\nagainst the baseline '" << spec.metrics.baseline << "' (nearest in " << spec.output.x
     << "; paired bootstrap, " << level
     << " interval of the difference; better/worse only when it excludes zero), comparisons.csv:\n";
  std::vector<std::string> notes;  // why the marked points' memory is extrapolated, each once
  size_t i = 0;
  while (i < comparisons.size()) {
    const size_t id = comparisons[i].id;
    const Comparison& first = comparisons[i];
    append_once(notes, first.extrapolation);
    append_once(notes, first.baseline_extrapolation);
    os << "  " << points.at(id).display_label << (first.extrapolated ? kExtrapolatedMark : "") << " vs "
       << points.at(first.baseline_id).display_label << (first.baseline_extrapolated ? kExtrapolatedMark : "") << " ("
       << first.memory_axis << " " << four_digits(first.memory) << " vs " << four_digits(first.baseline_memory);
    if (first.memory != first.baseline_memory)
      os << ": at unequal memory, " << four_digits(std::fabs(first.memory - first.baseline_memory))
         << (first.memory > first.baseline_memory ? " more" : " less");
    os << "):";
    // The primary metric first (metrics.primary), then every other one.
    const size_t end = [&] {
      size_t e = i;
      while (e < comparisons.size() && comparisons[e].id == id) ++e;
      return e;
    }();
    const char* sep = " ";
    for (size_t k = i; k < end; ++k)
      if (comparisons[k].metric == spec.metrics.primary) {
        os << sep << comparisons[k].metric << " (primary) " << comparisons[k].verdict;
        sep = "; ";
      }
    for (size_t k = i; k < end; ++k)
      if (comparisons[k].metric != spec.metrics.primary) {
        os << sep << comparisons[k].metric << " " << comparisons[k].verdict;
        sep = ", ";
      }
    os << "\n";
    i = end;
  }
  for (const std::string& note : notes) os << "  " << extrapolation_line(note) << "\n";
  return os.str();
}

}  // namespace kvb
