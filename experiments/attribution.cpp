#include "experiments/attribution.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "sim/core/strings.h"

namespace kvb {

std::vector<AttributionRegion> attribution_regions(const Plan& plan, const Recording& rec) {
  bool sink_heads = false, sink_tokens = false, window = false;
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = plan.unit(l, g, kind);
        window |= u.window.active();
        for (const Segment& s : u.segments) {
          sink_heads |= s.role == SegmentRole::SinkHead;
          sink_tokens |= s.role == SegmentRole::SinkToken;
        }
      }
  using Part = ErrorRegion::Part;
  std::vector<AttributionRegion> out;
  if (sink_heads || sink_tokens || window) {
    if (sink_heads) out.push_back({"protection", "sink_heads", {Part::SinkHeads}});
    if (sink_tokens) out.push_back({"protection", "sink_tokens", {Part::SinkTokens}});
    if (window) out.push_back({"protection", "window", {Part::Window}});
    out.push_back({"protection", "rest", {Part::Rest}});
  }
  const std::optional<int64_t> b = plan.phase_boundary() ? plan.phase_boundary() : rec.phase_boundary;
  if (b && *b > 0 && *b < rec.tokens) {
    out.push_back({"phase", "first_phase", {Part::Tokens, 0, *b}});
    out.push_back({"phase", "second_phase", {Part::Tokens, *b, rec.tokens}});
  }
  return out;
}

const std::vector<const AdditiveError*>& default_attributed_errors() {
  static const std::vector<const AdditiveError*> errors = {&require_additive_error("attn_kl_mean", "attribution"),
                                                           &require_additive_error("attn_out_rel_fro", "attribution")};
  return errors;
}

ErrorSums error_sums(const ErrorStats& stats, const std::vector<const AdditiveError*>& errors) {
  ErrorSums e;
  for (const AdditiveError* error : errors) e.push_back(error->sum(stats.rows));
  return e;
}

double error_share(double part, double total) { return total > 0 ? part / total : 0.0; }

Attribution attribute(const ErrorStats& full, const std::vector<AttributionRegion>& regions,
                      const std::vector<ErrorStats>& region_stats, int64_t layers, int64_t q_heads,
                      const std::vector<const AdditiveError*>& errors) {
  const size_t n = errors.size();
  Attribution a;
  a.errors = errors;
  a.layers = layers;
  a.q_heads = q_heads;
  a.head.assign(static_cast<size_t>(layers * q_heads), ErrorSums(n, 0.0));
  for (const AttentionRow& r : full.rows) {
    ErrorSums& h = a.head[static_cast<size_t>(r.layer * q_heads + r.q_head)];
    for (size_t i = 0; i < n; ++i) h[i] += errors[i]->of_row(r);
  }
  a.total = error_sums(full, errors);
  auto close_partition = [&](const std::string& partition) {
    ErrorSums sum(n, 0.0);
    for (const Attribution::Region& r : a.regions)
      if (r.partition == partition)
        for (size_t i = 0; i < n; ++i) sum[i] += r.error[i];
    ErrorSums rest(n);
    for (size_t i = 0; i < n; ++i) rest[i] = a.total[i] - sum[i];
    a.regions.push_back({partition, "interaction", rest});
  };
  const bool has_protection = std::any_of(regions.begin(), regions.end(),
                                          [](const AttributionRegion& r) { return r.partition == "protection"; });
  if (!has_protection) {
    a.regions.push_back({"protection", "rest", a.total});
    a.regions.push_back({"protection", "interaction", ErrorSums(n, 0.0)});
  }
  std::string current;
  for (size_t i = 0; i < regions.size(); ++i) {
    if (!current.empty() && regions[i].partition != current) close_partition(current);
    current = regions[i].partition;
    a.regions.push_back({regions[i].partition, regions[i].name, error_sums(region_stats[i], errors)});
  }
  if (!current.empty()) close_partition(current);
  return a;
}

namespace {

std::string head_label(int64_t layer, int64_t head) { return "L" + std::to_string(layer) + "H" + std::to_string(head); }

}  // namespace

std::string attribution_rows(size_t id, const std::string& key, const Attribution& a) {
  std::ostringstream os;
  const std::string prefix = std::to_string(id) + "," + key + ",";
  for (size_t m = 0; m < a.errors.size(); ++m) {
    const double total = a.total[m];
    auto row = [&](const std::string& scope, const std::string& name, double e) {
      os << prefix << a.errors[m]->name << "," << scope << "," << name << "," << format_double(e) << ","
         << format_double(error_share(e, total)) << "\n";
    };
    for (int64_t l = 0; l < a.layers; ++l) {
      double e = 0;
      for (int64_t h = 0; h < a.q_heads; ++h) e += a.head[static_cast<size_t>(l * a.q_heads + h)][m];
      row("layer", "L" + std::to_string(l), e);
    }
    for (int64_t l = 0; l < a.layers; ++l)
      for (int64_t h = 0; h < a.q_heads; ++h)
        row("head", head_label(l, h), a.head[static_cast<size_t>(l * a.q_heads + h)][m]);
    for (const Attribution::Region& r : a.regions) row(r.partition, r.name, r.error[m]);
  }
  return os.str();
}

std::string concentration_rows(size_t id, const std::string& key, const Attribution& a) {
  std::ostringstream os;
  const size_t n = a.head.size();
  for (size_t m = 0; m < a.errors.size(); ++m) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return a.head[x][m] > a.head[y][m]; });
    const double total = a.total[m];
    double cum = 0;
    for (size_t r = 0; r < n; ++r) {
      cum += a.head[order[r]][m];
      const int64_t l = static_cast<int64_t>(order[r]) / a.q_heads, h = static_cast<int64_t>(order[r]) % a.q_heads;
      os << id << "," << key << "," << a.errors[m]->name << "," << (r + 1) << "," << head_label(l, h) << ","
         << format_double(static_cast<double>(r + 1) / static_cast<double>(n)) << ","
         << format_double(error_share(cum, total)) << "\n";
    }
  }
  return os.str();
}

}  // namespace kvb
