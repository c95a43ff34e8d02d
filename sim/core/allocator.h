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
// The Python module does not call it: it would change the malloc settings of the host
// process (a notebook's), and repeated kvbudget.run() calls in one process (quickstart,
// 256 tokens, four calls each way on the 2-core dev machine) took 0.51-0.81 s with and
// without these settings, no difference beyond the noise (glibc's dynamic mmap
// threshold already keeps such buffers on the heap after the first call).
void keep_freed_memory();

}  // namespace kvb
