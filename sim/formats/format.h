// Format: one quantizer setting, e.g. "int4-asym-g32", "keep-fp16".
//
// A Format encodes and decodes one *span* of a cache unit: the [tokens, head_dim]
// block of one (layer, KV head, K or V) over a token range, and states the exact
// number of bits that span costs in storage, every scale, zero point, norm, codebook
// share and outlier index included (methods.md §1). Formats are immutable and
// shared between threads.
//
// Every format is created from its canonical name through the one table in
// sim/formats/registry.h; the name is also its key in results.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvb {

// A row-major [rows, cols] view of host fp32 memory with a row stride (in floats).
struct ConstMatView {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  const float* row(int64_t r) const { return data + r * stride; }
};
struct MatView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  float* row(int64_t r) const { return data + r * stride; }
};

// Which part of the cache a span belongs to, for formats that depend on it (seeded
// rotations, pre-RoPE keys, fitted codebooks).
struct SpanInfo {
  int64_t layer = 0;          // index into Recording::layers
  int64_t kv_head = 0;
  bool is_key = true;
  int64_t first_token = 0;    // position of the span's first row in the sequence
  uint64_t seed = 0;          // experiment seed
};

// Backends a format can run on.
enum class Backend { Cpu, Cuda };

class Format {
 public:
  virtual ~Format() = default;

  // Canonical name: parse(name()) reproduces this format exactly.
  virtual std::string name() const = 0;

  // Exact storage of a [tokens, head_dim] span in bits, all metadata included.
  virtual uint64_t storage_bits(int64_t tokens, int64_t head_dim) const = 0;

  // Quantize then dequantize x into out (same shape; may alias only if
  // supports_in_place()). This is what the cache would hand back to attention.
  virtual void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const = 0;

  // Bits per element of a [tokens, head_dim] span (storage_bits / elements).
  double bpe(int64_t tokens, int64_t head_dim) const {
    return static_cast<double>(storage_bits(tokens, head_dim)) / static_cast<double>(tokens * head_dim);
  }

  // True when roundtrip() returns its input unchanged (fp32 keep).
  virtual bool lossless() const { return false; }

  // Code width in bits (nominal, for display and for strategies that rank widths);
  // the true cost is storage_bits().
  virtual double nominal_bits() const = 0;

  // Whether the span's head_dim / token count is acceptable; returns an empty string
  // if so, else a reason ("group 48 does not divide head_dim 64").
  virtual std::string check_shape(int64_t /*tokens*/, int64_t /*head_dim*/) const { return {}; }

  virtual bool supports(Backend b) const { return b == Backend::Cpu; }
};

using FormatPtr = std::shared_ptr<const Format>;

}  // namespace kvb
