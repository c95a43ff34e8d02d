#include "sim/io/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "sim/core/error.h"

namespace kvb {

namespace {

// The temporary paths of the writers alive, for remove_unfinished_atomic_files(): fixed
// slots, so that a signal handler reads them without allocating. A writer claims a free
// slot (Free -> Filling), copies its path in, then publishes it (Live); the handler
// unlinks the Live paths only. A path is at most PATH_MAX bytes with its NUL (longer
// ones cannot be opened).
enum SlotState : int { kFree, kFilling, kLive };
struct TrackedTemporary {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads the slots' state");
std::array<TrackedTemporary, 16> g_tracked_temporaries;

// The slot now holding `path`, or -1 when every slot is taken or the path is too long.
int track_temporary(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (size_t i = 0; i < g_tracked_temporaries.size(); ++i) {
    TrackedTemporary& slot = g_tracked_temporaries[i];
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.state.store(kLive);
    return static_cast<int>(i);
  }
  return -1;
}

void untrack_temporary(int slot) {
  if (slot >= 0) g_tracked_temporaries[static_cast<size_t>(slot)].state.store(kFree);
}

}  // namespace

void remove_unfinished_atomic_files() noexcept {
  for (TrackedTemporary& slot : g_tracked_temporaries)
    if (slot.state.load() == kLive) ::unlink(slot.path);
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp." + std::to_string(::getpid())) {
  // Tracked before it exists: a signal in between finds nothing to unlink, never an untracked file.
  tracked_slot_ = track_temporary(tmp_.string());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const std::string why = std::strerror(errno);
    untrack_temporary(tracked_slot_);
    throw Error(path_.string() + ": cannot create (as " + tmp_.filename().string() + "): " + why);
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
  untrack_temporary(tracked_slot_);
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw Error("internal: " + path_.string() + ": write after commit");
  const char* p = static_cast<const char*>(data);
  size_t off = 0;
  while (off < bytes) {
    const ssize_t n = ::write(fd_, p + off, bytes - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path_.string() + ": write failed: " + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw Error("internal: " + path_.string() + ": committed twice");
  const int fd = fd_;
  fd_ = -1;
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd) == 0;
  // Untracked once the temporary name is gone (renamed or unlinked): a signal before
  // that unlinks a name that no longer exists, which is harmless.
  if (!synced || !closed) {
    const std::string why = std::strerror(synced ? errno : sync_errno);
    ::unlink(tmp_.c_str());
    untrack_temporary(std::exchange(tracked_slot_, -1));
    throw Error(path_.string() + ": flush failed: " + why);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp_.c_str());
    untrack_temporary(std::exchange(tracked_slot_, -1));
    throw Error(path_.string() + ": rename failed: " + why);
  }
  untrack_temporary(std::exchange(tracked_slot_, -1));
}

void write_file_atomic(const std::filesystem::path& path, const std::string& content) {
  AtomicFileWriter out(path);
  out.write(content);
  out.commit();
}

}  // namespace kvb
