#include "sim/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "sim/core/error.h"
#include "sim/io/input_file.h"

namespace kvb {

std::shared_ptr<const MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const std::string where = path.string();
  require_regular_file(path, "a tensor file");  // before open(), which blocks on a FIFO
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(where, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(where, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(where, "not a regular file");
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(where, std::string("cannot memory-map ") + std::to_string(file->size_) + " bytes: " + std::strerror(err));
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  file->fd_ = fd;  // the mapping stays valid without it; copy_out reads through it
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::copy_out(const uint8_t* p, uint64_t n, void* dst) const {
  if (n == 0) return;
  if (p < data_ || static_cast<uint64_t>(p - data_) + n > size_)
    fail(where(), "copy_out: range outside the file (" + std::to_string(n) + " bytes)");
  constexpr uint64_t kChunk = uint64_t{8} << 20;
  const uint64_t first = static_cast<uint64_t>(p - data_);
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
  std::vector<int> errors(static_cast<size_t>(chunks), 0);  // errno per chunk (-1: end of file)
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t done = static_cast<uint64_t>(c) * kChunk;
    const uint64_t end = std::min(n, done + kChunk);
    while (done < end) {
      const ssize_t got = ::pread(fd_, static_cast<uint8_t*>(dst) + done, static_cast<size_t>(end - done),
                                  static_cast<off_t>(first + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        errors[static_cast<size_t>(c)] = got < 0 ? errno : -1;
        break;
      }
      done += static_cast<uint64_t>(got);
    }
  }
  for (const int err : errors)
    if (err != 0)
      fail(where(), err < 0 ? std::string("the file ended while reading ") + std::to_string(n) + " bytes"
                            : std::string("cannot read: ") + std::strerror(err));
}

namespace {

// The whole pages covering [p, p + n) of a mapping that starts at base (page-aligned).
void advise_pages(const uint8_t* base, uint64_t size, const uint8_t* p, uint64_t n, int advice) {
  if (n == 0 || base == nullptr) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = static_cast<uint64_t>(p - base) / page * page;
  const uint64_t end = std::min(size, static_cast<uint64_t>(p - base) + n);
  ::madvise(const_cast<uint8_t*>(base + begin), end - begin, advice);  // a hint: failure changes nothing
}

}  // namespace

void MappedFile::prefetch(const uint8_t* p, uint64_t n) const { advise_pages(data_, size_, p, n, MADV_WILLNEED); }
void MappedFile::release(const uint8_t* p, uint64_t n) const { advise_pages(data_, size_, p, n, MADV_DONTNEED); }

}  // namespace kvb
