// Checks shared by the subcommands.
#include "experiments/cli/commands.h"

#include "experiments/experiment.h"
#include "sim/core/error.h"

namespace kvb::cli {

void check_threads(long long threads, const std::string& option) {
  if (threads < 0 || threads > kMaxThreads)
    throw ConfigError(option + " must be between 0 (all cores) and " + std::to_string(kMaxThreads) + ", got " +
                      std::to_string(threads));
}

}  // namespace kvb::cli
