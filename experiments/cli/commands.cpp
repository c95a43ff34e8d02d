// Checks shared by the subcommands.
#include "experiments/cli/commands.h"

#include <fstream>
#include <iostream>

#include "experiments/experiment.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"

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

bool parse_command_line(const Args& args, const boost::program_options::options_description& opts,
                        const char* positional, const boost::program_options::value_semantic* value, int max_count,
                        const std::string& command, boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  po::options_description hidden;
  hidden.add_options()(positional, value);
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add(positional, max_count);
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    option_error(command, e);
    return false;
  }
  return true;
}

void check_assignments(const Args& args, const std::string& option, const std::string& example) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == option && i + 1 < args.size()) value = args[i + 1];
    else if (args[i].starts_with(option + "=")) value = args[i].substr(option.size() + 1);
    else continue;
    if (value.find('=') != std::string::npos) continue;
    std::string msg = option + " " + value + ": expected key=value as one argument, e.g. " + option + " " + example;
    const size_t next = args[i] == option ? i + 2 : i + 1;
    if (next < args.size() && !args[next].starts_with("-"))  // `--set key value`: show the fix
      msg += " (write " + option + " " + value + "=" + args[next] + ", not " + option + " " + value + " " +
             args[next] + ")";
    throw ConfigError(msg);
  }
}

nlohmann::ordered_json results_summary_json(const ResultsSummary& s) {
  const auto path_of = [&](const char* file) {
    return std::filesystem::exists(s.dir / file) ? nlohmann::ordered_json((s.dir / file).string())
                                                 : nlohmann::ordered_json();
  };
  nlohmann::ordered_json budgets = nlohmann::ordered_json::array();
  try {
    std::ifstream in(s.dir / "budgets.json");
    if (in) budgets = nlohmann::ordered_json::parse(in);
  } catch (const std::exception&) {  // the errors list says why budgets.json is missing
  }
  return {{"command", s.command},
          {"dir", s.dir.string()},
          {"status", s.status},
          {"points_total", s.points_total},
          {"points_measured", s.points_measured},
          {"points_failed", s.points_failed},
          {"wall_seconds", s.wall_seconds},
          {"files",
           {{"points", path_of("points.csv")},
            {"pareto", path_of("pareto.csv")},
            {"budgets", path_of("budgets.json")},
            {"plots", s.plots_written ? nlohmann::ordered_json((s.dir / "plots").string()) : nlohmann::ordered_json()}}},
          {"budgets", budgets},
          {"errors", s.errors}};
}

}  // namespace kvb::cli
