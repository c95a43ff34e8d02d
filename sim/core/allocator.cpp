#include "sim/core/allocator.h"

#include <cstdlib>  // defines __GLIBC__ on glibc (through <features.h>)
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvb {

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace kvb
