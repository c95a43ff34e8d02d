// keep_freed_memory (sim/core/allocator.h): on glibc, a large block freed stays in the
// heap for the next allocation instead of going back to the kernel.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#include "sim/core/allocator.h"
#if defined(__GLIBC__)
#include <malloc.h>
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

}  // namespace kvb
