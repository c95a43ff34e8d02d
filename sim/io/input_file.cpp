#include "sim/io/input_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "sim/core/error.h"

namespace kvb {

namespace {

// What a file that is not regular is, in words.
const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

}  // namespace

void require_regular_file(const std::filesystem::path& path, const std::string& what, bool allow_directory) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // missing or unreadable: the caller's open says so
  if (S_ISREG(st.st_mode) || (allow_directory && S_ISDIR(st.st_mode))) return;
  throw Error(path.string() + ": is " + file_kind(st.st_mode) + ", not a regular file; " + what +
              " must be a regular file" + (allow_directory ? " or a directory" : "") +
              " (a pipe or a device would block the reader or never end)");
}

std::string read_file_prefix(const std::filesystem::path& path, const std::string& what, size_t max_bytes,
                             bool* at_end) {
  require_regular_file(path, what);
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw Error(path.string() + ": cannot open " + what + ": " + std::strerror(errno));
  std::string out;
  char buffer[1 << 16];
  while (out.size() < max_bytes) {
    const size_t want = std::min(sizeof buffer, max_bytes - out.size());
    const size_t got = std::fread(buffer, 1, want, f.get());
    out.append(buffer, got);
    if (got < want) {
      if (std::ferror(f.get())) throw Error(path.string() + ": cannot read " + what + ": " + std::strerror(errno));
      if (at_end) *at_end = true;
      return out;
    }
  }
  // Exactly max_bytes read: the file ended there if nothing follows.
  if (at_end) *at_end = std::fgetc(f.get()) == EOF;
  return out;
}

}  // namespace kvb
