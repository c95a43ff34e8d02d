// Placeholder until `kvbudget inspect` lands.
#include "experiments/cli/commands.h"
namespace kvb::cli {
int cmd_inspect(const Args&) { return 2; }
}  // namespace kvb::cli
