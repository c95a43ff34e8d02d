#include "experiments/sequences.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "experiments/merge.h"
#include "experiments/report.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/bootstrap.h"
#include "sim/metrics/paired.h"

namespace kvb {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Tags of the aggregate intervals' sequence draws ("seqinter", "seqclose"), streams of
// their own.
constexpr uint64_t kPooledIntervalTag = 0x736571696e746572ull;
constexpr uint64_t kClosedFormTag = 0x736571636c6f7365ull;

std::string sequence_name(size_t s, const std::vector<std::string>& sources) {
  return "sequence " + std::to_string(s) + " (" + sources.at(s) + ")";
}

// Attribution sums over sequences (same layers, heads and regions), or nullopt when
// some sequence has none or they are not alike.
std::optional<Attribution> add_attributions(const std::vector<const PointResult*>& per_sequence) {
  std::optional<Attribution> sum;
  for (const PointResult* r : per_sequence) {
    if (!r->attribution) return std::nullopt;
    const Attribution& a = *r->attribution;
    if (!sum) {
      sum = a;
      continue;
    }
    if (a.layers != sum->layers || a.q_heads != sum->q_heads || a.head.size() != sum->head.size() ||
        a.regions.size() != sum->regions.size() || a.errors != sum->errors)
      return std::nullopt;
    // Every ErrorSums holds one sum per attributed error (Attribution::errors).
    auto add = [](ErrorSums& into, const ErrorSums& from) {
      for (size_t e = 0; e < into.size() && e < from.size(); ++e) into[e] += from[e];
    };
    add(sum->total, a.total);
    for (size_t h = 0; h < a.head.size(); ++h) add(sum->head[h], a.head[h]);
    for (size_t g = 0; g < a.regions.size(); ++g) {
      if (a.regions[g].partition != sum->regions[g].partition || a.regions[g].name != sum->regions[g].name)
        return std::nullopt;
      add(sum->regions[g].error, a.regions[g].error);
    }
  }
  return sum;
}

}  // namespace

PointResult aggregate_sequences(const ExperimentSpec& spec, const std::vector<const PointResult*>& per_sequence,
                                const std::vector<std::string>& sources) {
  if (per_sequence.empty() || per_sequence.size() != sources.size())
    throw Error("aggregate_sequences: one result per sequence expected");
  if (per_sequence.size() == 1) {
    PointResult one = *per_sequence.front();
    one.resamples.clear();
    return one;
  }
  const size_t S = per_sequence.size();
  PointResult out;
  const PointResult& first = *per_sequence.front();
  out.id = first.id;
  for (size_t s = 0; s < S; ++s) {
    out.seconds += per_sequence[s]->seconds;
    if (per_sequence[s]->id != out.id) throw Error("aggregate_sequences: results of different points");
  }
  for (const PointResult* r : per_sequence) {  // points_by_sequence.csv's rows, kept in results.jsonl
    PointResult row = *r;
    row.block_sums.clear();
    row.resamples.clear();
    row.attribution.reset();
    row.sequences.clear();
    out.sequences.push_back(std::move(row));
  }
  for (size_t s = 0; s < S; ++s)
    if (!per_sequence[s]->ok) {
      out.error = sequence_name(s, sources) + ": " + per_sequence[s]->error;
      return out;
    }
  out.bpe = first.bpe;
  out.bpe_target = first.bpe_target;
  out.bytes = first.bytes;
  out.bytes_target = first.bytes_target;
  {  // each sequence's queries read caches of its own plan: their mean, as the metrics'
    std::vector<double> read;
    for (size_t s = 0; s < S; ++s) read.push_back(per_sequence[s]->bpe_read);
    out.bpe_read = mean_over_sequences(read);
  }
  out.measured_tokens = first.measured_tokens;
  out.sized_for_tokens = first.sized_for_tokens;
  out.target_extrapolated = first.target_extrapolated;
  out.stores_tokens_alike = first.stores_tokens_alike;
  out.plan = first.plan;
  for (size_t s = 1; s < S; ++s)
    if (per_sequence[s]->plan != first.plan) {
      out.plan = "differs by sequence (points_by_sequence.csv); sequence 0: " + first.plan;
      break;
    }
  out.annotations = first.annotations;
  const BootstrapSettings settings = bootstrap_settings(spec);
  for (size_t k = 0; k < spec.metrics.report.size(); ++k) {
    const MetricDef& metric = require_metric(spec.metrics.report[k], spec.metrics.report_where);
    std::vector<double> values;
    double variance = 0;
    std::vector<std::vector<double>> pools;
    std::vector<BlockSums> sums;
    for (const PointResult* r : per_sequence) {
      if (k >= r->metrics.size()) throw Error("aggregate_sequences: a sequence's result lacks metric " + metric.name);
      values.push_back(r->metrics[k]);
      const double se = k < r->standard_errors.size() ? r->standard_errors[k] : kNaN;
      variance += se * se;
      pools.push_back(k < r->resamples.size() ? r->resamples[k] : std::vector<double>{});
      sums.push_back(k < r->block_sums.size() ? r->block_sums[k] : BlockSums{});
    }
    out.metrics.push_back(mean_over_sequences(values));
    out.standard_errors.push_back(std::sqrt(variance) / static_cast<double>(S));
    BlockSums joined = join_sequences(sums);
    Interval interval{kNaN, kNaN};
    if (metric.rows.kind != RowReduction::Kind::None)  // the block bootstrap's resamples, per sequence
      interval = percentile_interval(pooled_sequence_resamples(pools, settings, kPooledIntervalTag), settings.level);
    else if (metric.interval && !joined.empty())  // closed form on one sequence: resample its samples
      interval = percentile_interval(two_level_resamples(metric, nullptr, joined, settings, kClosedFormTag),
                                     settings.level);
    out.intervals.push_back(interval);
    out.block_sums.push_back(std::move(joined));
  }
  out.attribution = add_attributions(per_sequence);
  out.ok = true;
  return out;
}

std::vector<std::string> plan_memory_mismatches(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                                                const std::vector<PlanCheck>& checks,
                                                const std::vector<std::string>& sources, int64_t tokens) {
  std::vector<std::string> out;
  if (checks.size() < 2) return out;
  const int64_t target = spec.output.target_context;
  for (size_t i = 0; i < points.size(); ++i) {
    const std::optional<Plan>& base = checks[0].plans.at(i);
    if (!base) continue;
    for (size_t s = 1; s < checks.size(); ++s) {
      const std::optional<Plan>& other = checks[s].plans.at(i);
      if (!other) continue;
      std::string differs;
      auto compare = [&](const char* what, double a, double b) {
        if (differs.empty() && a != b)
          differs = std::string(what) + " " + format_double(a) + " on " + sequence_name(0, sources) + " but " +
                    format_double(b) + " on " + sequence_name(s, sources);
      };
      compare("bpe", base->bpe(), other->bpe());
      compare("bytes", base->bytes_at(tokens), other->bytes_at(tokens));
      compare("bpe_target", base->bpe_at(target), other->bpe_at(target));
      compare("bytes_target", base->bytes_at(target), other->bytes_at(target));
      compare("the context the allocation is sized for", static_cast<double>(base->sized_for_context().value_or(tokens)),
              static_cast<double>(other->sized_for_context().value_or(tokens)));
      if (differs.empty() && base->stores_tokens_alike() != other->stores_tokens_alike())
        differs = "whether every token is stored alike differs between " + sequence_name(0, sources) + " and " +
                  sequence_name(s, sources);
      if (!differs.empty()) {
        out.push_back(points[i].key + ": " + differs);
        break;
      }
    }
  }
  return out;
}

void check_sequences_alike(const std::vector<const Recording*>& recordings, const std::vector<std::string>& sources,
                           const std::string& where) {
  if (recordings.empty()) return;
  const Recording& a = *recordings.front();
  for (size_t s = 1; s < recordings.size(); ++s) {
    const Recording& b = *recordings[s];
    if (a.tokens == b.tokens && a.num_layers() == b.num_layers() && a.q_heads == b.q_heads &&
        a.kv_heads == b.kv_heads && a.head_dim == b.head_dim)
      continue;
    throw ConfigError(where + ": " + sequence_name(s, sources) + " has " + b.summary() + ", but " +
                      sequence_name(0, sources) + " has " + a.summary() +
                      ": every sequence must have the same shape and number of tokens, so that each point's memory "
                      "(bytes at the recording's length) and its evaluated positions are the same on all of them; "
                      "cut them to a common length with data.max_tokens");
  }
}

std::string points_by_sequence_csv(const std::vector<std::string>& sources,
                                   const std::vector<std::string>& points_csv_of_sequence) {
  std::ostringstream os;
  std::string header;
  for (size_t s = 0; s < points_csv_of_sequence.size(); ++s) {
    const std::vector<std::string> lines = split(points_csv_of_sequence[s], '\n');
    for (size_t l = 0; l < lines.size(); ++l) {
      if (lines[l].empty()) continue;
      if (l == 0) {
        if (s == 0) {
          header = lines[l];
          os << "sequence,source," << header << "\n";
        } else if (lines[l] != header) {  // a strategy annotated other columns on this sequence
          throw Error("points_by_sequence.csv: " + sequence_name(s, sources) +
                      "'s points have other columns than sequence 0's (" + lines[l] + " against " + header + ")");
        }
        continue;
      }
      os << s << "," << csv_field(sources.at(s)) << "," << lines[l] << "\n";
    }
  }
  return os.str();
}

namespace {
constexpr std::string_view kUnknownSequenceRowsLead = "points_by_sequence.csv has no rows for ";
}  // namespace

bool is_unknown_sequence_rows_note(const std::string& warning) {
  return warning.rfind(kUnknownSequenceRowsLead, 0) == 0;
}

std::string unknown_sequence_rows_note(const std::vector<size_t>& ids) {
  return std::string(kUnknownSequenceRowsLead) + std::to_string(ids.size()) + " measured point(s) (ids " +
         id_ranges(ids) +
         "): their results.jsonl lines, written by an older kvbudget, hold no per-sequence results; their rows are "
         "unavailable (points.csv has their aggregate); run them again in a fresh run to get them";
}

}  // namespace kvb
