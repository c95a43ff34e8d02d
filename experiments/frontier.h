// Frontier: Pareto sets of memory against error, and budget queries over measured
// points (FAISS's OperatingPoints question: the cheapest point reaching an accuracy,
// the most accurate point within a cost).
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "sim/metrics/metric_table.h"

namespace kvb {

// Indices of the non-dominated points, sorted by increasing cost. A point is
// dominated if another has cost <= and value at least as good, one strictly. Points
// whose cost or value is NaN are ignored; of identical (cost, value) points the
// first index is kept.
std::vector<size_t> pareto_front(const std::vector<double>& cost, const std::vector<double>& value, Better better);

// One answer to a budget query.
struct BudgetAnswer {
  BudgetQuery query;
  // Error budget: the point with the least memory (FrontierInput::memory) meeting it.
  // Memory budget: for each Pareto metric, the point with the best value within it
  // (ties: the least memory).
  struct Pick {
    std::string metric;             // the metric optimized (memory budget) or constrained
    std::optional<size_t> index;    // into the rows given; nullopt = nothing qualifies
  };
  std::vector<Pick> picks;
};

// Rows are described by column accessors so the frontier code does not depend on
// how results are stored.
struct FrontierInput {
  std::vector<double> bpe, bytes, bpe_target, bytes_target, bpe_read;  // memory_columns()
  std::vector<std::string> metric_names;             // columns available
  std::vector<std::vector<double>> metric_values;    // [metric][row]
  std::vector<std::string> pareto_metrics;           // metrics a memory budget optimizes
  std::string memory = "bpe";  // the memory column an error budget minimizes (output.x)
};

// The column of `in` named `name` (a memory column or a metric); throws ConfigError
// naming metrics.report for a metric it lacks.
const std::vector<double>& frontier_column(const FrontierInput& in, const std::string& name);
// The member of `in` that holds memory column `name` (one of memory_columns()), to fill;
// throws kvb::Error for another name. With frontier_column, the one place that maps the
// memory columns to FrontierInput's members.
std::vector<double>& frontier_memory_column(FrontierInput& in, const std::string& name);

BudgetAnswer answer_budget(const BudgetQuery& q, const FrontierInput& in);

}  // namespace kvb
