// The kvbudget subcommands: one function per command, listed in main.cpp's table.
// Each receives the arguments after the command name and returns the exit code
// (kvb::kExitOk, kExitError, kExitUsage, kExitInterrupted).
#pragma once
#include <exception>
#include <string>
#include <vector>

namespace kvb::cli {

using Args = std::vector<std::string>;

// Throws kvb::ConfigError naming `option` unless 0 <= threads <= kMaxThreads
// (experiments/experiment.h; 0 = all cores).
void check_threads(long long threads, const std::string& option);

// Prints a bad command line's error (an unknown option, a value that does not parse)
// and where to find the options, "kvbudget COMMAND: error: ... (kvbudget COMMAND
// --help lists the options)", and returns kExitUsage.
int option_error(const std::string& command, const std::exception& e);

int cmd_run(const Args& args);
int cmd_inspect(const Args& args);
int cmd_record(const Args& args);
int cmd_eval(const Args& args);
int cmd_quantize(const Args& args);
int cmd_formats(const Args& args);
int cmd_metrics(const Args& args);
int cmd_strategies(const Args& args);
int cmd_bounds(const Args& args);

}  // namespace kvb::cli
