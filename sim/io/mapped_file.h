// A read-only memory mapping of one whole file, shared by the stores that read from
// it (a safetensors file, an .npy, an .npz archive). Internal to sim/io.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace kvb {

class MappedFile {
 public:
  // Maps `path` read-only. Throws kvb::Error naming the file when it is missing, not a
  // regular file, or cannot be mapped. An empty file maps to size() == 0, data() == nullptr.
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::filesystem::path& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::string where() const { return path_.string(); }  // error-message prefix

  // Hints for reading [p, p + n) once, start to end (p inside the mapping): prefetch()
  // starts reading it ahead (so a copy runs at the disk's rate), release() drops its
  // pages from this process's resident memory once copied (they stay in the page cache;
  // a later read faults them back in). Neither changes what the mapping reads.
  void prefetch(const uint8_t* p, uint64_t n) const;
  void release(const uint8_t* p, uint64_t n) const;

  // Copies [p, p + n) (p inside the mapping) to dst with pread() on the file, in chunks
  // read by all OpenMP threads: the kernel copies from the page cache, so neither the
  // mapping's pages nor a second copy of them enter this process (no page fault per
  // 4 KiB of source). The bytes are those the mapping reads. Throws kvb::Error naming
  // the file when a read fails or ends early.
  void copy_out(const uint8_t* p, uint64_t n, void* dst) const;

 private:
  MappedFile() = default;
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;  // kept open for copy_out
};

// Little-endian unsigned integer of N bytes at p (any alignment).
inline uint64_t load_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace kvb
