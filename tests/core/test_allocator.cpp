// keep_freed_memory (sim/core/allocator.h): on glibc, a large block freed stays in the
// heap for the next allocation instead of going back to the kernel. PrefaultedBuffer:
// zeroed memory whose pages are there before the first touch.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "sim/core/allocator.h"
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace kvb {

TEST_CASE("keep_freed_memory keeps a freed 8 MiB block in the heap") {
#if defined(__GLIBC__)
  keep_freed_memory();
  const size_t bytes = size_t(8) << 20;
  char* block = static_cast<char*>(std::malloc(bytes));
  REQUIRE(block != nullptr);
  std::memset(block, 1, bytes);  // faulted in
  CHECK(mallinfo2().hblkhd < bytes);  // from the heap, not a block of its own (mmap)
  std::free(block);
  CHECK(mallinfo2().fordblks >= bytes);  // kept free in the heap, not trimmed
#else
  keep_freed_memory();  // nothing to observe without glibc
  MESSAGE("not glibc: keep_freed_memory does nothing");
#endif
}

TEST_CASE("PrefaultedBuffer: zeroed, its pages allocated before the first touch, move-only") {
  const size_t bytes = (size_t(3) << 20) + 5;
  PrefaultedBuffer buffer(bytes);
  REQUIRE(buffer.data() != nullptr);
  CHECK(buffer.bytes() == bytes);
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  // Resident before anything touched them, where the kernel populates (Linux >= 5.14).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(probe != MAP_FAILED);
  const bool populates = madvise(probe, page, MADV_POPULATE_WRITE) == 0;
  munmap(probe, page);
  if (populates) {
    std::vector<unsigned char> resident((bytes + page - 1) / page);
    REQUIRE(mincore(buffer.data(), bytes, resident.data()) == 0);
    size_t in = 0;
    for (unsigned char r : resident) in += r & 1;
    CHECK(in == resident.size());
  } else {
    MESSAGE("this kernel does not populate (MADV_POPULATE_WRITE): pages fault in on first touch");
  }
#endif
  const unsigned char* bytes_in = static_cast<const unsigned char*>(buffer.data());
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; ++i) nonzero += bytes_in[i] != 0;
  CHECK(nonzero == 0);
  std::memset(buffer.data(), 7, bytes);  // writable to its last byte
  CHECK(bytes_in[bytes - 1] == 7);

  PrefaultedBuffer moved(std::move(buffer));
  CHECK(moved.data() == bytes_in);
  CHECK(moved.bytes() == bytes);
  CHECK(buffer.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is documented
  CHECK(buffer.bytes() == 0);
  PrefaultedBuffer assigned;
  assigned = std::move(moved);
  CHECK(assigned.data() == bytes_in);
  CHECK(PrefaultedBuffer(0).data() == nullptr);  // nothing to allocate
}

}  // namespace kvb
