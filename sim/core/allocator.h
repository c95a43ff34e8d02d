// Process-wide allocator settings for the programs (the CLI and the benchmarks; not
// the Python module, which lives in someone else's process).
#pragma once

namespace kvb {

// Keeps freed heap memory for reuse instead of handing it back to the kernel: every
// sweep point allocates and frees the same buffers again (each layer's attention rows,
// the point's merged rows, about 0.7 MB a point on gpt2-bytes), and fresh memory costs
// a page fault per 4 KiB on first touch (microseconds each on a VM). With glibc:
// allocations up to 32 MiB come from the heap, and up to 256 MiB of free memory at its
// top is kept. Elsewhere it does nothing.
void keep_freed_memory();

}  // namespace kvb
