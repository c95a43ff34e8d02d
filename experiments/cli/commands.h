// The kvbudget subcommands: one function per command, listed in main.cpp's table.
// Each receives the arguments after the command name and returns the exit code
// (kvb::kExitOk, kExitError, kExitUsage, kExitInterrupted).
#pragma once
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "experiments/output_paths.h"

namespace kvb::cli {

using Args = std::vector<std::string>;

// Throws kvb::ConfigError naming `option` unless 0 <= threads <= kMaxThreads
// (experiments/experiment.h; 0 = all cores).
void check_threads(long long threads, const std::string& option);

// The seed given as `option` (an int64 on the command line, as the config's `seed`
// key is read), refused as the config refuses it: kvb::ConfigError naming the option
// unless seed >= 0. (An unsigned option would wrap -1 to 2^64 - 1 without a word.)
uint64_t checked_seed(int64_t seed, const std::string& option);

// Prints a bad command line's error (an unknown option, a value that does not parse)
// and where to find the options, "kvbudget COMMAND: error: ... (kvbudget COMMAND
// --help lists the options)", and returns kExitUsage.
int option_error(const std::string& command, const std::exception& e);

// Parses a command line: `opts` (what --help lists) and the command's positional
// argument, a hidden option `positional` whose value is stored by `value` (po::value(&x);
// options_description takes it over), `max_count` times at most (-1: any number). On a
// bad command line prints option_error's message and returns false (exit kExitUsage).
bool parse_command_line(const Args& args, const boost::program_options::options_description& opts,
                        const char* positional, const boost::program_options::value_semantic* value, int max_count,
                        const std::string& command, boost::program_options::variables_map& vm);

// Refuses `OPTION key value` written for `OPTION key=value` (--set, --param): boost
// would take `value` for a positional argument and report something else. Throws
// kvb::ConfigError saying to write key=value as one argument.
void check_assignments(const Args& args, const std::string& option, const std::string& example);

// What `run --json` and `merge --json` print (README "Command line conventions", stable keys):
// command, dir, status, points_total, points_measured, points_failed, wall_seconds,
// files {points, pareto, budgets, plots (null when not written)}, budgets (budgets.json's
// queries and answers, [] when it could not be read) and errors (messages).
struct ResultsSummary {
  std::string command;  // "run" or "merge"
  std::filesystem::path dir;
  std::string status;
  size_t points_total = 0, points_measured = 0, points_failed = 0;
  double wall_seconds = 0;
  bool plots_written = false;
  std::vector<std::string> errors;
};
nlohmann::ordered_json results_summary_json(const ResultsSummary& s);

// require_writable_output(path, option), require_writable_dir(dir, where):
// experiments/output_paths.h.
using kvb::require_writable_dir;
using kvb::require_writable_output;

int cmd_run(const Args& args);
int cmd_inspect(const Args& args);
int cmd_record(const Args& args);
int cmd_eval(const Args& args);
int cmd_generate(const Args& args);
int cmd_quantize(const Args& args);
int cmd_formats(const Args& args);
int cmd_metrics(const Args& args);
int cmd_strategies(const Args& args);
int cmd_bounds(const Args& args);
int cmd_merge(const Args& args);
int cmd_status(const Args& args);

}  // namespace kvb::cli
