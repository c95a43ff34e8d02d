// Input files are regular files: a FIFO, a terminal or a device such as /dev/zero
// would block a reader or never end, so every file kvbudget reads (configs,
// recordings, checkpoints, texts, token ids, tokenizers) is checked first.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace kvb {

// Throws kvb::Error "<path>: is a FIFO (named pipe), not a regular file; <what> must be
// a regular file (...)" when `path` exists and is not a regular file (after following
// symbolic links) nor, with allow_directory, a directory. A missing path is left to the
// caller's own "cannot open" message. Does not open the file (opening a FIFO blocks).
void require_regular_file(const std::filesystem::path& path, const std::string& what, bool allow_directory = false);

// At most max_bytes bytes from the start of a regular file (all of it when max_bytes is
// SIZE_MAX), with require_regular_file's check first. `at_end` (optional) is set when
// the file ended within the bytes read. kvb::Error naming the file when it cannot be read.
std::string read_file_prefix(const std::filesystem::path& path, const std::string& what, size_t max_bytes,
                             bool* at_end = nullptr);

}  // namespace kvb
