#include "sim/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
  ::close(fd);  // the mapping stays valid without the descriptor
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
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
