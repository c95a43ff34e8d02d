#include "sim/core/allocator.h"

#include <cstdlib>  // defines __GLIBC__ on glibc (through <features.h>)
#include <new>
#include <utility>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvb {

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

PrefaultedBuffer::PrefaultedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
#if defined(__linux__)
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) {
    data_ = p;
    mapped_ = true;
#if defined(MADV_HUGEPAGE)
    (void)madvise(p, bytes, MADV_HUGEPAGE);  // a hint: refused or ignored, 4 KiB pages
#endif
#if defined(MADV_POPULATE_WRITE)
    (void)madvise(p, bytes, MADV_POPULATE_WRITE);  // refused (older kernel): faults on first touch
#endif
    return;
  }
#endif
  data_ = std::calloc(bytes, 1);
  if (!data_) throw std::bad_alloc();
}

PrefaultedBuffer::~PrefaultedBuffer() { release(); }

PrefaultedBuffer::PrefaultedBuffer(PrefaultedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), mapped_(o.mapped_) {}

PrefaultedBuffer& PrefaultedBuffer::operator=(PrefaultedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = o.mapped_;
  }
  return *this;
}

void PrefaultedBuffer::release() {
  if (!data_) return;
#if defined(__linux__)
  if (mapped_) {
    munmap(data_, bytes_);
    data_ = nullptr;
    return;
  }
#endif
  std::free(data_);
  data_ = nullptr;
}

}  // namespace kvb
