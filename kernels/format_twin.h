// CUDA twins of the formats: quantize, dequantize and the fused round trip of spans
// resident on the device, bit-identical to the CPU formats (sim/formats/) because
// both run the per-element and per-group arithmetic of the same KVB_HD header.
//
// The twin table (twin_table.cpp) lists one entry per format family that has a twin;
// the format table's cuda_twin flags (sim/formats/registry.h, has_cuda_twin) say which
// those are in every build, and tests/gpu/test_twins.cpp checks that the two agree for
// every example of the format table. Adding a twin is one
// kernel file using the family's KVB_HD header plus one entry in the table.
//
// Host-only header: callable from code built by the host compiler.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/formats/format.h"

namespace kvb::cuda {

// `spans` matrices of [rows, cols] fp32 stored back to back, row-major, on the device:
// [spans, rows, cols]. Each span is quantized on its own, exactly as Format::roundtrip
// quantizes one [rows, cols] span (e.g. the units of one layer: [kv_heads, T, head_dim]).
struct SpanBatch {
  int64_t spans = 1;
  int64_t rows = 0;  // tokens per span
  int64_t cols = 0;  // head_dim
  int64_t elements() const { return spans * rows * cols; }
};

// Device bytes of a quantized batch: per-element codes and per-group metadata, in the
// layout the family's header documents (int: kernels/int_twin.h).
struct CodeBytes {
  size_t codes = 0;
  size_t meta = 0;
};

// One format's twin. Calls enqueue work on `stream` and return without waiting.
// Pointers are device memory; inputs and outputs must not overlap. A twin may keep
// device scratch between calls, so one twin object serves one host thread.
class FormatTwin {
 public:
  virtual ~FormatTwin() = default;
  virtual std::string name() const = 0;  // the format's canonical name
  virtual CodeBytes code_bytes(SpanBatch b) const = 0;
  // x [spans, rows, cols] -> codes and metadata (code_bytes(b) bytes each).
  virtual void quantize(const float* x, SpanBatch b, void* codes, void* meta, cudaStream_t stream) const = 0;
  // codes and metadata -> out [spans, rows, cols], the dequantized values.
  virtual void dequantize(const void* codes, const void* meta, SpanBatch b, float* out,
                          cudaStream_t stream) const = 0;
  // dequantize(quantize(x)) without storing codes: what attention reads back.
  virtual void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const = 0;
};

struct TwinFamily {
  std::string family;  // as in the format table: "int", "keep", ...
  // The twin of `format` if it belongs to this family, else nullptr.
  std::unique_ptr<FormatTwin> (*make)(const Format& format);
};

// The twin table.
const std::vector<TwinFamily>& twin_families();

// The twin of a format, or nullptr when it has none.
std::unique_ptr<FormatTwin> make_twin(const Format& format);

// As make_twin, but throws kvb::Error naming the format when it has no twin.
std::unique_ptr<FormatTwin> require_twin(const Format& format);

}  // namespace kvb::cuda
