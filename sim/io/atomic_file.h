// Crash-safe file writes: content goes to a temporary file in the same directory,
// is flushed to disk, then renamed over the target. A reader (or a crash, or Ctrl-C)
// sees either the old complete file or the new complete file, never a truncated one.
// A process that a signal ends leaves its temporary files (NAME.tmp.<pid>) unless its
// handler calls remove_unfinished_atomic_files() (the commands' interrupt handler does:
// experiments/cli/interrupt.h).
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>

namespace kvb {

// Writes `content` to `path` atomically.
void write_file_atomic(const std::filesystem::path& path, const std::string& content);

// The same, streamed: bytes are appended with write(); commit() flushes and renames
// onto the target. Destroyed without commit() (an exception on the way), the
// temporary file is removed and the target is untouched. Errors name the file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  int tracked_slot_ = -1;  // this writer's slot for remove_unfinished_atomic_files(); -1: none
};

// Unlinks the temporary file of every AtomicFileWriter alive in the process (neither
// committed nor destroyed): for a signal handler that ends the process. Async-signal-safe
// (it reads fixed slots and calls unlink only). The 16 writers alive first are tracked;
// one beyond them is still written atomically, but an interrupt leaves its temporary file.
void remove_unfinished_atomic_files() noexcept;

}  // namespace kvb
