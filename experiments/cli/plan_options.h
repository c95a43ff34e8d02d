// Options shared by the commands that quantize a model's KV cache (`eval`, `generate`):
// one of --format, --key-format/--value-format and --strategy (a type or a preset,
// with --param); the plan is built by build_calibrated_plan (experiments/query_positions.h).
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "sim/plan.h"
#include "sim/recording.h"
#include "sim/strategies/strategy.h"

namespace kvb::cli {

struct PlanOptions {
  std::string format, key_format, value_format, strategy;
  std::vector<std::string> params;  // --param name=value, in order
  // After make_strategy(): the budget parameter the strategy meets (budget_bpe,
  // key_budget_bpe, value_budget_bpe), empty when it has none.
  std::string budget_param;

  // Adds --format, --key-format, --value-format, --strategy, --param.
  void add_options(boost::program_options::options_description& opts);
  // Checks the combination and makes the strategy (a format is strategy `uniform`), so
  // that a bad name fails before any work; nullptr when no option was given. Throws
  // kvb::ConfigError naming the option (with "did you mean", and a preset given as a
  // format pointing to --strategy).
  std::unique_ptr<Strategy> make_strategy();
  // What the plan was made from, e.g. "uniform(format=int4-asym-g32)" (after
  // make_strategy()).
  std::string source() const;
};

}  // namespace kvb::cli
