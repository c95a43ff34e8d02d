// Checks that an output can be written (experiments/output_paths.h).
#include "experiments/output_paths.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "sim/core/error.h"

namespace kvb {

namespace {

namespace fs = std::filesystem;

// Whether a file can be created in directory `dir`: a real probe (create and remove a
// temporary file), since access(W_OK) says yes to root on any permission bits and
// knows nothing of read-only mounts or /proc.
bool can_create_in(const fs::path& dir) {
  std::string probe = (dir / ".kvbudget-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

}  // namespace

void require_writable_output(const std::string& path, const std::string& option) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw ConfigError(option + " " + path + ": is a directory; give a file name");
  const fs::path dir = fs::weakly_canonical(fs::absolute(p), ec).parent_path();
  if (!fs::is_directory(dir, ec))
    throw ConfigError(option + " " + path + ": directory " + dir.string() + " does not exist");
  if (!can_create_in(dir)) throw ConfigError(option + " " + path + ": cannot create files in " + dir.string());
}

void require_writable_dir(const fs::path& dir, const std::string& where) {
  // Nothing is created: the nearest existing ancestor must be a directory in which
  // files can be created. The path is not normalised: the file system resolves each
  // prefix (a symbolic link followed by .. goes where the link points).
  std::error_code ec;
  fs::path p = fs::absolute(dir);
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) {
    if (fs::is_symlink(fs::symlink_status(p, ec)))
      throw ConfigError(where + ": cannot create directory " + dir.string() + ": " + p.string() +
                        " is a symbolic link to nothing");
    p = p.parent_path();
  }
  if (!fs::is_directory(p, ec))
    throw ConfigError(where + ": cannot create directory " + dir.string() + ": " + p.string() + " is not a directory");
  if (!can_create_in(p))
    throw ConfigError(where + ": cannot create directory " + dir.string() + ": " + p.string() + " is not writable");
}

}  // namespace kvb
