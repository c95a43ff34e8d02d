// Checks shared by the subcommands.
#include "experiments/cli/commands.h"

#include "experiments/experiment.h"
#include "sim/core/error.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

namespace kvb::cli {

void check_threads(long long threads, const std::string& option) {
  if (threads < 0 || threads > kMaxThreads)
    throw ConfigError(option + " must be between 0 (all cores) and " + std::to_string(kMaxThreads) + ", got " +
                      std::to_string(threads));
}

void require_writable_output(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw ConfigError(option + " " + path + ": is a directory; give a file name");
  if (!fs::is_directory(dir, ec))
    throw ConfigError(option + " " + path + ": directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    throw ConfigError(option + " " + path + ": directory " + dir.string() + " is not writable");
}

void require_writable_dir(const std::filesystem::path& dir, const std::string& where) {
  namespace fs = std::filesystem;
  // Nothing is created: the nearest existing ancestor must be a writable directory.
  fs::path p = fs::absolute(dir).lexically_normal();
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    throw ConfigError(where + ": cannot create directory " + dir.string() + ": " + p.string() + " is not a directory");
  if (::access(p.c_str(), W_OK) != 0)
    throw ConfigError(where + ": cannot create directory " + dir.string() + ": " + p.string() + " is not writable");
}

int option_error(const std::string& command, const std::exception& e) {
  std::cerr << "kvbudget " << command << ": error: " << e.what() << "\n(kvbudget " << command
            << " --help lists the options)\n";
  return kExitUsage;
}

}  // namespace kvb::cli
