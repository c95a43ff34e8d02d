#include "experiments/frontier.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"

namespace kvb {

namespace {
bool better_than(double a, double b, Better dir) { return dir == Better::Lower ? a < b : a > b; }
}  // namespace

namespace {
// The member of `in` (const or not) holding memory column `name`; nullptr for a name
// that is not one of memory_columns().
template <class Input>
auto memory_member(Input& in, const std::string& name) -> decltype(&in.bpe) {
  if (name == "bpe") return &in.bpe;
  if (name == "bytes") return &in.bytes;
  if (name == "bpe_target") return &in.bpe_target;
  if (name == "bytes_target") return &in.bytes_target;
  if (name == "bpe_read") return &in.bpe_read;
  return nullptr;
}
}  // namespace

std::vector<double>& frontier_memory_column(FrontierInput& in, const std::string& name) {
  if (std::vector<double>* column = memory_member(in, name)) return *column;
  throw Error("internal: '" + name + "' is not a memory column (memory_columns())");
}

const std::vector<double>& frontier_column(const FrontierInput& in, const std::string& name) {
  if (const std::vector<double>* column = memory_member(in, name)) return *column;
  for (size_t i = 0; i < in.metric_names.size(); ++i)
    if (in.metric_names[i] == name) return in.metric_values[i];
  throw ConfigError("budget query: metric '" + name + "' is not among the reported metrics (add it to metrics.report)");
}

std::vector<size_t> pareto_front(const std::vector<double>& cost, const std::vector<double>& value, Better better) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < cost.size(); ++i)
    if (!std::isnan(cost[i]) && !std::isnan(value[i])) idx.push_back(i);
  // By cost, then best value, then index: the first point of each cost is its best.
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    if (cost[a] != cost[b]) return cost[a] < cost[b];
    if (value[a] != value[b]) return better_than(value[a], value[b], better);
    return a < b;
  });
  std::vector<size_t> front;
  for (size_t i : idx) {
    if (front.empty() || better_than(value[i], value[front.back()], better)) front.push_back(i);
  }
  return front;
}

BudgetAnswer answer_budget(const BudgetQuery& q, const FrontierInput& in) {
  BudgetAnswer ans;
  ans.query = q;
  const std::vector<double>& lhs = frontier_column(in, q.lhs);
  const std::vector<double>& memory = frontier_column(in, in.memory);
  auto meets = [&](size_t i) {
    return !std::isnan(lhs[i]) && (q.upper ? lhs[i] <= q.bound : lhs[i] >= q.bound);
  };
  if (!q.memory) {
    // Least memory meeting an error budget; ties broken by the better metric value.
    const MetricDef& def = *find_metric(q.lhs);
    std::optional<size_t> best;
    for (size_t i = 0; i < lhs.size(); ++i) {
      if (!meets(i)) continue;
      if (!best || memory[i] < memory[*best] ||
          (memory[i] == memory[*best] && better_than(lhs[i], lhs[*best], def.better)))
        best = i;
    }
    ans.picks.push_back({q.lhs, best});
    return ans;
  }
  for (const std::string& m : in.pareto_metrics) {
    const std::vector<double>& v = frontier_column(in, m);
    const MetricDef& def = *find_metric(m);
    std::optional<size_t> best;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!meets(i) || std::isnan(v[i])) continue;
      if (!best || better_than(v[i], v[*best], def.better) || (v[i] == v[*best] && memory[i] < memory[*best]))
        best = i;
    }
    ans.picks.push_back({m, best});
  }
  return ans;
}

}  // namespace kvb
