// Process-wide allocator settings for the programs (the CLI and the benchmarks; not
// the Python module, which lives in someone else's process), and memory allocated
// up front for large buffers filled once.
#pragma once
#include <cstddef>

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

// `bytes` of zeroed memory whose pages are allocated when it is created, in one call
// into the kernel, instead of by a page fault per 4 KiB on first touch (about 9 µs each
// on the 2-core dev VM: 2.4 s a GiB, and the kernel serializes them within a process).
// On Linux: an anonymous mapping, huge pages asked for (MADV_HUGEPAGE, where the kernel
// gives them), populated with MADV_POPULATE_WRITE (Linux >= 5.14; on older kernels
// pages fault in on first touch as usual). Elsewhere: zeroed heap memory. Move-only.
class PrefaultedBuffer {
 public:
  PrefaultedBuffer() = default;
  explicit PrefaultedBuffer(size_t bytes);
  ~PrefaultedBuffer();
  PrefaultedBuffer(PrefaultedBuffer&& o) noexcept;
  PrefaultedBuffer& operator=(PrefaultedBuffer&& o) noexcept;
  PrefaultedBuffer(const PrefaultedBuffer&) = delete;
  PrefaultedBuffer& operator=(const PrefaultedBuffer&) = delete;

  void* data() const { return data_; }  // nullptr when empty (0 bytes, or moved from)
  size_t bytes() const { return bytes_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;  // an mmap (munmap it), else heap memory (free it)
};

}  // namespace kvb
