// kvbudget: KV-cache quantization error budgets, from a declarative config to a
// Pareto plot. `kvbudget help` lists the commands.
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "experiments/cli/commands.h"
#include "kvb/build_config.h"
#include "sim/core/allocator.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const kvb::cli::Args&);
};

// The command table.
const Command kCommands[] = {
    {"run", "run an experiment config: sweep, Pareto frontier, plots, budget answers", &kvb::cli::cmd_run},
    {"merge", "merge the shard folders of one sweep (run --shard) into one results folder", &kvb::cli::cmd_merge},
    {"status", "a results folder's status: points done, and whether a running run is alive or stale",
     &kvb::cli::cmd_status},
    {"inspect", "print a tensor file's tensors, statistics and per-head attention entropy", &kvb::cli::cmd_inspect},
    {"record", "run a checkpoint on a text and write per-layer q/k/v and attention outputs", &kvb::cli::cmd_record},
    {"eval", "run a checkpoint with an exact or quantized KV cache: PPL, KL, logits/NLL files", &kvb::cli::cmd_eval},
    {"generate", "continue a prompt with the exact and a quantized KV cache, side by side, with token match",
     &kvb::cli::cmd_generate},
    {"quantize", "quantize + dequantize one tensor file with any format: error, exact bpe, codes", &kvb::cli::cmd_quantize},
    {"formats", "list the format table (quantizers, names, bits per element)", &kvb::cli::cmd_formats},
    {"metrics", "list the metric table", &kvb::cli::cmd_metrics},
    {"strategies", "list the allocation strategies, their parameters and the presets", &kvb::cli::cmd_strategies},
    {"bounds", "write the bounds report: each bound or prediction, its measurement, whether it holds",
     &kvb::cli::cmd_bounds},
};

void usage(std::FILE* to) {
  std::fprintf(to, "kvbudget %s: KV-cache quantization error budgets\n\nusage: kvbudget <command> [options]\n\n",
               KVB_VERSION);
  for (const Command& c : kCommands) std::fprintf(to, "  %-11s %s\n", c.name, c.summary);
  std::fprintf(to, "\n`kvbudget <command> --help` describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  kvb::keep_freed_memory();
  if (argc < 2) {
    usage(stderr);
    return kvb::kExitUsage;
  }
  const std::string name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") {
    usage(stdout);
    return kvb::kExitOk;
  }
  if (name == "--version") {
    std::printf("kvbudget %s\n", KVB_VERSION);
    return kvb::kExitOk;
  }
  kvb::cli::Args args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const kvb::ConfigError& e) {
      std::fprintf(stderr, "kvbudget %s: error: %s\n", c.name, e.what());
      return kvb::kExitUsage;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr,
                   "kvbudget %s: error: out of memory (std::bad_alloc): the data, model or sweep is too large for this "
                   "machine's memory\n",
                   c.name);
      return kvb::kExitError;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvbudget %s: error: %s\n", c.name, e.what());
      return kvb::kExitError;
    }
  }
  std::vector<std::string> names;
  for (const Command& c : kCommands) names.push_back(c.name);
  std::fprintf(stderr, "kvbudget: unknown command '%s'%s\n\n", name.c_str(), kvb::did_you_mean(name, names).c_str());
  usage(stderr);
  return kvb::kExitUsage;
}
