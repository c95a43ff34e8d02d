// `kvbudget formats`, `kvbudget metrics`, `kvbudget strategies`: print the tables
// every config, sweep and test iterates over.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <variant>

#include "experiments/cli/commands.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/plan.h"
#include "sim/strategies/budget.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/protections.h"
#include "sim/strategies/strategy.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// For the commands whose only option is --json: true when they should print their
// table (*json: as JSON); otherwise the exit code is in *code (0 after --help, with
// --json or alone; kExitUsage for anything else). An error names the argument at fault:
// the first that is neither --json nor --help, or a second --json.
bool table_arguments_ok(const Args& args, const char* command, const char* what, bool* json, int* code) {
  *json = false;
  bool help = false;
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      help = true;
    } else if (arg == "--json" && *json) {
      std::fprintf(stderr, "kvbudget %s: --json given twice\n", command);
      *code = kExitUsage;
      return false;
    } else if (arg == "--json") {
      *json = true;
    } else {
      std::fprintf(stderr, "kvbudget %s: unexpected argument '%s' (the only option is --json)%s\n", command,
                   arg.c_str(), did_you_mean(arg, {"--json", "--help"}).c_str());
      *code = kExitUsage;
      return false;
    }
  }
  if (help) {
    std::printf("kvbudget %s: prints %s; --json prints it as JSON (README \"Command line conventions\")\n", command, what);
    *code = kExitOk;
    return false;
  }
  return true;
}

nlohmann::ordered_json param_json(const ParamValue& v) {
  return std::visit([](const auto& x) { return nlohmann::ordered_json(x); }, v);
}

nlohmann::ordered_json params_json(const std::vector<ParamDef>& params) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ParamDef& p : params)
    out.push_back({{"name", p.name},
                   {"type", param_type_name(p.type)},
                   {"default", p.default_value ? param_json(*p.default_value) : nlohmann::ordered_json()},
                   {"required", !p.default_value && !p.optional},
                   {"per_kind", p.per_kind},
                   {"description", p.description}});
  return out;
}

}  // namespace

namespace {

// Bits per element of a causal cache of `tokens` tokens x `head_dim` stored in `f`, as a
// run's bpe counts it: a one-unit plan's (Plan::storage_bits_at: a group along tokens
// still open at the last token, up to G tokens for ch<G> and the whole span for ch,
// which never closes, is held at the residual precision; methods.md §3).
double causal_cache_bpe(const FormatPtr& f, int64_t tokens, int64_t head_dim) {
  Plan plan(1, 1, tokens, head_dim);
  plan.assign_all(Kind::Key, f);
  plan.assign_all(Kind::Value, f);
  return plan.bpe();
}

}  // namespace

int cmd_formats(const Args& args) {
  po::options_description opts("kvbudget formats [--head-dim D] [--tokens T] [--json]");
  int64_t head_dim = 128, tokens = 4096;
  opts.add_options()("help,h", "show this help")("json", "print the table as JSON (README \"Command line conventions\")")("head-dim", po::value(&head_dim), "head_dim of the span (default 128)")(
      "tokens", po::value(&tokens), "tokens of the span (default 4096): per-channel and calibrated formats' "
                                    "metadata is spread over them; formats with groups along tokens (ch<G>, ch) "
                                    "also show a causal cache's bpe at that context, as points.csv counts it");
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
  if (const std::string why = table_span_error(tokens, head_dim); !why.empty()) {
    std::fprintf(stderr, "kvbudget formats: --%s\n", why.c_str());
    return kExitUsage;
  }
  if (vm.count("json")) {
    nlohmann::ordered_json families = nlohmann::ordered_json::array(), presets = nlohmann::ordered_json::array();
    for (const FormatFamily& f : format_families()) {
      nlohmann::ordered_json examples = nlohmann::ordered_json::array();
      for (const FormatExample& ex : f.examples) {
        FormatPtr p = make_format(ex.name);
        const std::string bad = p->check_shape(tokens, head_dim);
        nlohmann::ordered_json e = {
            {"name", ex.name},
            {"bpe", bad.empty() ? nlohmann::ordered_json(p->bpe(tokens, head_dim)) : nullptr},
            {"shape_error", bad.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(bad)}};
        if (bad.empty() && p->tokens_per_group() != 1) e["cache_bpe"] = causal_cache_bpe(p, tokens, head_dim);
        examples.push_back(e);
      }
      families.push_back({{"family", f.name},
                          {"syntax", f.syntax},
                          {"description", f.description},
                          {"cuda", f.cuda_twin},
                          {"examples", examples}});
    }
    for (const FormatAlias& a : format_aliases())
      presets.push_back({{"name", a.alias}, {"format", a.canonical}, {"reproduces", a.reproduces}});
    const nlohmann::ordered_json j = {
        {"head_dim", head_dim}, {"tokens", tokens}, {"families", families}, {"presets", presets}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("Format families (bits per element of one span of head_dim %lld, %lld tokens, all metadata counted;\n"
              "[cuda]: has a CUDA twin, runs under backend = \"cuda\"; groups along tokens also give a causal\n"
              "cache's bpe, whose open group stays in fp16: docs/methods.md §3):\n\n",
              static_cast<long long>(head_dim), static_cast<long long>(tokens));
  for (const FormatFamily& f : format_families()) {
    std::printf("%s: %s\n  syntax: %s\n", f.name.c_str(), f.description.c_str(), f.syntax.c_str());
    for (const FormatExample& ex : f.examples) {
      FormatPtr p = make_format(ex.name);
      const std::string bad = p->check_shape(tokens, head_dim);
      const char* cuda = f.cuda_twin ? "  [cuda]" : "";
      if (bad.empty() && p->tokens_per_group() != 1)
        std::printf("    %-34s %7.4f bpe%s; in a causal cache of %lld tokens %.4f bpe\n", ex.name.c_str(),
                    p->bpe(tokens, head_dim), cuda, static_cast<long long>(tokens),
                    causal_cache_bpe(p, tokens, head_dim));
      else if (bad.empty())
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
  bool json = false;
  if (int code = 0; !table_arguments_ok(args, "metrics", "the metric table", &json, &code)) return code;
  if (json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const MetricDef& m : metric_table())
      j.push_back({{"name", m.name},
                   {"level", level_name(m.level)},
                   {"better", m.better == Better::Lower ? "lower" : "higher"},
                   {"uncertainty", m.standard_error ? nlohmann::ordered_json("_se")
                                   : m.has_interval() ? nlohmann::ordered_json("_lo/_hi")
                                                      : nlohmann::ordered_json()},
                   {"unit", m.unit},
                   {"description", m.description}});
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
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
  bool json = false;
  if (int code = 0;
      !table_arguments_ok(args, "strategies", "the strategy types, their parameters and the presets", &json, &code))
    return code;
  if (json) {
    nlohmann::ordered_json types = nlohmann::ordered_json::array(), presets = nlohmann::ordered_json::array();
    for (const StrategyType& t : strategy_types())
      types.push_back({{"name", t.name}, {"description", t.description}, {"params", params_json(t.params)},
                       {"columns", t.columns}});
    for (const StrategyPreset& p : strategy_presets()) {
      nlohmann::ordered_json values = nlohmann::ordered_json::object();
      for (const auto& [k, v] : p.params) values[k] = param_json(v);
      presets.push_back({{"name", p.name}, {"type", p.type}, {"reproduces", p.reproduces}, {"params", values}});
    }
    const nlohmann::ordered_json j = {{"protections", {{"params", params_json(protection_params())},
                                                       {"columns", protection_columns()}}},
                                      {"budget", {{"params", params_json(budget_params())}, {"columns", budget_columns()}}},
                                      {"types", types},
                                      {"presets", presets}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
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
