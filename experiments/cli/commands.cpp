// Checks shared by the subcommands.
#include "experiments/cli/commands.h"

#include <iostream>

#include "experiments/experiment.h"
#include "sim/core/error.h"

namespace kvb::cli {

void check_threads(long long threads, const std::string& option) {
  if (threads < 0 || threads > kMaxThreads)
    throw ConfigError(option + " must be between 0 (all cores) and " + std::to_string(kMaxThreads) + ", got " +
                      std::to_string(threads));
}

uint64_t checked_seed(int64_t seed, const std::string& option) {
  if (seed < 0) throw ConfigError(option + " must be >= 0, got " + std::to_string(seed));
  return static_cast<uint64_t>(seed);
}

int option_error(const std::string& command, const std::exception& e) {
  std::cerr << "kvbudget " << command << ": error: " << e.what() << "\n(kvbudget " << command
            << " --help lists the options)\n";
  return kExitUsage;
}

}  // namespace kvb::cli
