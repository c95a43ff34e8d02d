// `kvbudget formats`, `kvbudget metrics`, `kvbudget strategies`: print the tables
// every config, sweep and test iterates over.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "experiments/cli/commands.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/strategies/budget.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/protections.h"
#include "sim/strategies/strategy.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// For the commands that take no options: true when they should print their table;
// otherwise the exit code is in *code (0 after --help, kExitUsage for anything else).
bool table_arguments_ok(const Args& args, const char* command, const char* what, int* code) {
  if (args.empty()) return true;
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("kvbudget %s: prints %s; takes no options\n", command, what);
    *code = kExitOk;
    return false;
  }
  std::fprintf(stderr, "kvbudget %s: unexpected argument '%s' (the command takes no options)\n", command,
               args[0].c_str());
  *code = kExitUsage;
  return false;
}

}  // namespace

int cmd_formats(const Args& args) {
  po::options_description opts("kvbudget formats [--head-dim D] [--tokens T]");
  int64_t head_dim = 128, tokens = 4096;
  opts.add_options()("help,h", "show this help")("head-dim", po::value(&head_dim), "head_dim of the span (default 128)")(
      "tokens", po::value(&tokens), "tokens of the span (default 4096): per-channel and calibrated formats' "
                                    "metadata is spread over them, as in a points.csv at that context");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(opts).positional(po::positional_options_description()).run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return option_error("formats", e);
  }
  if (vm.count("help")) {
    std::cout << opts << "\nPrints every format family with examples and their exact bits per element for one span\n"
                         "of TOKENS x HEAD_DIM (all metadata counted), and the format presets.\n";
    return kExitOk;
  }
  if (head_dim < 1 || tokens < 1) {
    std::fprintf(stderr, "kvbudget formats: --head-dim and --tokens must be >= 1\n");
    return kExitUsage;
  }
  std::printf("Format families (bits per element at head_dim %lld, %lld tokens, all metadata counted;\n"
              "[cuda]: has a CUDA twin, runs under backend = \"cuda\"):\n\n",
              static_cast<long long>(head_dim), static_cast<long long>(tokens));
  for (const FormatFamily& f : format_families()) {
    std::printf("%s: %s\n  syntax: %s\n", f.name.c_str(), f.description.c_str(), f.syntax.c_str());
    for (const FormatExample& ex : f.examples) {
      FormatPtr p = make_format(ex.name);
      const std::string bad = p->check_shape(tokens, head_dim);
      const char* cuda = f.cuda_twin ? "  [cuda]" : "";
      if (bad.empty())
        std::printf("    %-34s %7.4f bpe%s\n", ex.name.c_str(), p->bpe(tokens, head_dim), cuda);
      else
        std::printf("    %-34s (%s)%s\n", ex.name.c_str(), bad.c_str(), cuda);
    }
    std::printf("\n");
  }
  std::printf("Presets:\n");
  for (const FormatAlias& a : format_aliases())
    std::printf("  %-16s = %-32s %s\n", a.alias.c_str(), a.canonical.c_str(), a.reproduces.c_str());
  return 0;
}

int cmd_metrics(const Args& args) {
  if (int code = 0; !table_arguments_ok(args, "metrics", "the metric table", &code)) return code;
  // uncertainty: the points.csv columns after the metric (methods.md §4 "Uncertainty"):
  // "_se" a standard error, "_lo/_hi" an interval (bootstrap or Wilson), "-" none.
  std::printf("%-22s %-10s %-7s %-11s %s\n", "metric", "level", "better", "uncertainty", "definition");
  for (const MetricDef& m : metric_table()) {
    const char* uncertainty = m.standard_error ? "_se" : (m.has_interval() ? "_lo/_hi" : "-");
    std::printf("%-22s %-10s %-7s %-11s %s%s%s\n", m.name.c_str(), level_name(m.level),
                m.better == Better::Lower ? "lower" : "higher", uncertainty, m.description.c_str(),
                m.unit.empty() ? "" : " [", m.unit.empty() ? "" : (m.unit + "]").c_str());
  }
  return 0;
}

namespace {

void print_params(const std::vector<ParamDef>& params, const std::vector<ParamDef>& skip) {
  for (const ParamDef& p : params) {
    // Skipped: the shared definitions already printed; a type's own parameter of the
    // same name (another meaning) is still listed.
    if (std::find(skip.begin(), skip.end(), p) != skip.end()) continue;
    std::string def = p.default_value ? param_to_string(*p.default_value) : (p.optional ? "(unset)" : "(required)");
    if (def.empty()) def = "\"\"";
    const std::string name = (p.per_kind ? "[key_|value_]" : "") + p.name;
    std::printf("    %-32s %-12s %-12s %s\n", name.c_str(), param_type_name(p.type), def.c_str(), p.description.c_str());
  }
}

// The points.csv columns (plan annotations) of `columns` not in `skip`, on one line.
void print_columns(const std::vector<std::string>& columns, const std::vector<std::string>& skip) {
  std::vector<std::string> own;
  for (const std::string& c : columns)
    if (std::find(skip.begin(), skip.end(), c) == skip.end()) own.push_back(c);
  if (!own.empty()) std::printf("    points.csv columns: %s\n", join(own, ", ").c_str());
}

}  // namespace

int cmd_strategies(const Args& args) {
  if (int code = 0; !table_arguments_ok(args, "strategies", "the strategy types, their parameters and the presets", &code))
    return code;
  std::printf("Strategy types. [key_|value_]X: X also exists as key_X and value_X, which override it for keys\n"
              "or values. Columns: parameter, type, default, meaning.\n\n");
  std::vector<ParamDef> shared = protection_params();
  shared.insert(shared.end(), budget_params().begin(), budget_params().end());
  std::printf("Protections (every type; applied in this order before the allocator):\n");
  print_params(protection_params(), {});
  print_columns(protection_columns(), {});
  std::printf("\nBudget (every type unless it says otherwise; `format`-style fixed settings need none):\n");
  print_params(budget_params(), {});
  print_columns(budget_columns(), {});
  std::printf("\n");
  std::vector<std::string> shared_columns = protection_columns();
  shared_columns.insert(shared_columns.end(), budget_columns().begin(), budget_columns().end());
  for (const StrategyType& t : strategy_types()) {
    std::printf("%s: %s\n", t.name.c_str(), t.description.c_str());
    if (std::find(t.params.begin(), t.params.end(), budget_params().front()) == t.params.end())
      std::printf("    (takes no budget: no budget parameters)\n");
    print_params(t.params, shared);
    print_columns(t.columns, shared_columns);
    std::printf("\n");
  }
  std::printf("Presets (a [[strategy]] block selects one with preset = \"NAME\"; its own keys override):\n");
  for (const StrategyPreset& p : strategy_presets()) {
    std::printf("  %-18s %-8s %s\n", p.name.c_str(), p.type.c_str(), p.reproduces.c_str());
    std::string line;
    for (const auto& [k, v] : p.params) line += (line.empty() ? "" : ", ") + k + " = " + param_to_string(v);
    std::printf("  %-18s          %s\n", "", line.c_str());
  }
  return 0;
}

}  // namespace kvb::cli
