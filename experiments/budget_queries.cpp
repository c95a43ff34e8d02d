#include "experiments/budget_queries.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <regex>

#include "experiments/experiment.h"
#include "sim/core/error.h"
#include "sim/metrics/metric_table.h"

namespace kvb {

BudgetQuery parse_budget_query(const std::string& text, const std::string& where) {
  static const std::regex re(R"(^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw ConfigError(where + ": budget query '" + text +
                      "' should look like 'attn_kl_mean <= 1e-3' (least memory meeting an error budget) or "
                      "'bpe <= 4' / 'bytes <= 1e6' (least error within a memory budget)");
  const std::string op = m[2];
  if (op == "<" || op == ">")
    throw ConfigError(where + ": budget query '" + text + "': strict '" + op +
                      "' is not supported; budgets are inclusive, write '" + op + "='");
  BudgetQuery q;
  q.text = text;
  q.lhs = m[1];
  q.upper = op[0] == '<';
  const std::string number = m[3];
  char* end = nullptr;
  q.bound = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(q.bound)) {
    throw ConfigError(where + ": budget query '" + text + "': '" + number + "' is not a finite number");
  }
  q.memory = std::find(memory_columns().begin(), memory_columns().end(), q.lhs) != memory_columns().end();
  if (q.memory) {
    if (!q.upper) throw ConfigError(where + ": memory budget '" + text + "' must be an upper bound (<=)");
    if (!(q.bound > 0)) throw ConfigError(where + ": memory budget '" + text + "' must be > 0: no cache fits in it");
  } else {
    const MetricDef& def = require_metric(q.lhs, where + ": budget query '" + text + "'");
    if ((def.better == Better::Lower) != q.upper)
      throw ConfigError(where + ": budget query '" + text + "': " + q.lhs + " is better when " +
                        (def.better == Better::Lower ? "lower; use <=" : "higher; use >="));
  }
  return q;
}

void add_budget_query(ExperimentSpec& spec, const std::string& text, const std::string& where) {
  BudgetQuery q = parse_budget_query(text, where);
  if (q.memory && spec.metrics.pareto.empty())
    throw ConfigError(where + ": budget query '" + text +
                      "' asks for the least error within a memory budget, for each metrics.pareto metric, but "
                      "metrics.pareto is empty: name the error metric(s) to minimise there");
  if (!q.memory) {
    // An error budget reads its metric from every point: it must be measurable on this
    // data and reported, which is checked now, before any work.
    const std::string at = where + ": budget query '" + text + "'";
    check_metric_source(require_metric(q.lhs, at), spec.data, at);
    std::vector<std::string>& report = spec.metrics.report;
    if (std::find(report.begin(), report.end(), q.lhs) == report.end()) {
      report.push_back(q.lhs);
      std::vector<std::string> ordered;  // table order, as parse_metrics leaves it
      for (const MetricDef& d : metric_table())
        if (std::find(report.begin(), report.end(), d.name) != report.end()) ordered.push_back(d.name);
      report = ordered;
    }
  }
  spec.budgets.push_back(std::move(q));
}

}  // namespace kvb
