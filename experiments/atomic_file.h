// Crash-safe file writes: content goes to a temporary file in the same directory,
// is flushed to disk, then renamed over the target. A reader (or a crash, or Ctrl-C)
// sees either the old complete file or the new complete file, never a truncated one.
#pragma once
#include <filesystem>
#include <string>

namespace kvb {

void write_file_atomic(const std::filesystem::path& path, const std::string& content);

}  // namespace kvb
