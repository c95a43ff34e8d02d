// Budget queries ([budgets] queries, `kvbudget run --budget`): "attn_kl_mean <= 1e-3"
// asks for the least memory meeting an error budget, "bpe <= 4" for the least error
// within a memory budget.
#pragma once
#include <string>

namespace kvb {

struct ExperimentSpec;

struct BudgetQuery {
  std::string text;       // as written
  std::string lhs;        // metric name, "bpe" or "bytes"
  bool upper = true;      // "<=" (true) or ">=" (false)
  double bound = 0;
  bool memory = false;    // a memory budget (least error within it) vs an error budget
};

// Parses "attn_kl_mean <= 1e-3" / "bpe <= 4" / "topk_overlap >= 0.9". Strict '<' and
// '>' are rejected (budgets are inclusive).
BudgetQuery parse_budget_query(const std::string& text, const std::string& where);

// Parses a budget query and adds it to spec.budgets. An error budget's metric must be
// measurable on spec.data (a model-level metric needs source = "model") and is added
// to spec.metrics.report (in table order) so that every point measures it. Throws
// ConfigError naming `where`. Used for [budgets] queries and `--budget`.
void add_budget_query(ExperimentSpec& spec, const std::string& text, const std::string& where);

}  // namespace kvb
