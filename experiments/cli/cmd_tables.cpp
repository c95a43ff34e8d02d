// `kvbudget formats`, `kvbudget metrics`, `kvbudget strategies`: print the tables
// every config, sweep and test iterates over.
#include <cstdio>

#include "experiments/cli/commands.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/strategies/strategy.h"

namespace kvb::cli {

int cmd_formats(const Args& args) {
  int64_t head_dim = 128;
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--head-dim") head_dim = std::stoll(args[i + 1]);
  std::printf("Format families (bits per element at head_dim %lld, 4096 tokens, all metadata counted):\n\n",
              static_cast<long long>(head_dim));
  for (const FormatFamily& f : format_families()) {
    std::printf("%s: %s\n  syntax: %s\n", f.name.c_str(), f.description.c_str(), f.syntax.c_str());
    for (const std::string& ex : f.examples) {
      FormatPtr p = make_format(ex);
      const std::string bad = p->check_shape(4096, head_dim);
      if (bad.empty())
        std::printf("    %-34s %7.4f bpe\n", ex.c_str(), p->bpe(4096, head_dim));
      else
        std::printf("    %-34s (%s)\n", ex.c_str(), bad.c_str());
    }
    std::printf("\n");
  }
  std::printf("Presets:\n");
  for (const FormatAlias& a : format_aliases())
    std::printf("  %-16s = %-32s %s\n", a.alias.c_str(), a.canonical.c_str(), a.reproduces.c_str());
  return 0;
}

int cmd_metrics(const Args&) {
  std::printf("%-22s %-10s %-7s %s\n", "metric", "level", "better", "definition");
  for (const MetricDef& m : metric_table())
    std::printf("%-22s %-10s %-7s %s%s%s\n", m.name.c_str(), level_name(m.level),
                m.better == Better::Lower ? "lower" : "higher", m.description.c_str(), m.unit.empty() ? "" : " [",
                m.unit.empty() ? "" : (m.unit + "]").c_str());
  return 0;
}

int cmd_strategies(const Args&) {
  for (const StrategyType& t : strategy_types()) {
    std::printf("%s: %s\n", t.name.c_str(), t.description.c_str());
    for (const ParamDef& p : t.params) {
      std::string def = p.default_value ? param_to_string(*p.default_value) : "(required)";
      if (def.empty()) def = "\"\"";
      std::printf("    %-18s %-8s default %-10s %s\n", p.name.c_str(), param_type_name(p.type), def.c_str(),
                  p.description.c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace kvb::cli
