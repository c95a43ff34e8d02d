// Checks that an output can be written, made before the work whose result goes there
// (a results folder, a file a command writes).
#pragma once
#include <filesystem>
#include <string>

namespace kvb {

// Throws kvb::ConfigError naming `option` unless `path` can be written: its directory
// exists and is writable, and the path is not a directory. Called before the work
// whose result goes there.
void require_writable_output(const std::string& path, const std::string& option);

// Throws kvb::ConfigError naming `where` (a config key or an option) unless directory
// `dir` exists and is writable or could be created (its nearest existing ancestor is
// a writable directory). Creates nothing.
void require_writable_dir(const std::filesystem::path& dir, const std::string& where);

}  // namespace kvb
