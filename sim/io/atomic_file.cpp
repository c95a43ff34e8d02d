#include "sim/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "sim/core/error.h"

namespace kvb {

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path_.string() + ": cannot create (as " + tmp_.filename().string() + "): " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
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
  if (!synced || !closed) {
    const std::string why = std::strerror(synced ? errno : sync_errno);
    ::unlink(tmp_.c_str());
    throw Error(path_.string() + ": flush failed: " + why);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp_.c_str());
    throw Error(path_.string() + ": rename failed: " + why);
  }
}

void write_file_atomic(const std::filesystem::path& path, const std::string& content) {
  AtomicFileWriter out(path);
  out.write(content);
  out.commit();
}

}  // namespace kvb
