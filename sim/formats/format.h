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
  // Rows [begin, end) of this view.
  ConstMatView rows_in(int64_t begin, int64_t end) const { return {row(begin), end - begin, cols, stride}; }
};
struct MatView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  float* row(int64_t r) const { return data + r * stride; }
  // Rows [begin, end) of this view.
  MatView rows_in(int64_t begin, int64_t end) const { return {row(begin), end - begin, cols, stride}; }
};

// Which part of the cache a span belongs to, for formats that depend on it (seeded
// rotations, pre-RoPE keys, fitted codebooks).
struct SpanInfo {
  int64_t layer = 0;          // index into Recording::layers
  int64_t kv_head = 0;
  bool is_key = true;
  int64_t first_token = 0;    // index of the span's first row in the sequence
  uint64_t seed = 0;          // experiment seed

  // RoPE context of key spans, for formats that quantize keys before RoPE
  // (prerope:<inner>). All optional; the simulator fills them from the recording.
  const float* key_pre_rope = nullptr;  // the span's pre-RoPE keys, [rows, head_dim] with
                                        // row stride key_pre_rope_stride (floats); null when
                                        // the recording has none
  int64_t key_pre_rope_stride = 0;
  const int64_t* positions = nullptr;   // RoPE position of each row; null = first_token + row
  bool rope_applied = false;            // the span's keys are post-RoPE
  double rope_theta = 10000.0;
  // The RoPE inverse frequencies, head_dim/2 of them, when they are not
  // rope_theta^(-2i/head_dim) (a model with llama3 or linear RoPE scaling); null =
  // from rope_theta.
  const std::vector<float>* rope_inv_freq = nullptr;
  const char* recording = "";           // recording name, for error messages
};

// Estimated attention logits q·k computed from a format's stored key representation
// without decoding the keys (QJL). Built once per key span; immutable afterwards.
class ScoreEstimator {
 public:
  virtual ~ScoreEstimator() = default;
  // Number of keys (rows of the span) it was built from.
  virtual int64_t keys() const = 0;
  // out[r][j] = estimate of q_r · k_j (unscaled: no 1/sqrt(head_dim)) for query rows
  // r of `queries` ([rows, head_dim]) and the span's keys j in [0, n_keys),
  // n_keys <= keys(). `out` is [rows, >= n_keys].
  virtual void estimate(ConstMatView queries, int64_t n_keys, MatView out) const = 0;
};

// A growing little-endian bit stream: the stored representation of a span as a
// format documents it (Format::encode). Fields are appended least significant bit
// first; byte-sized fields written at byte boundaries are therefore plain bytes.
class BitWriter {
 public:
  void put(uint64_t value, int nbits) {
    if (nbits < 64) value &= (uint64_t{1} << nbits) - 1;
    while (nbits > 0) {
      const int offset = static_cast<int>(bits_ & 7u);
      if (offset == 0) bytes_.push_back(0);
      const int take = nbits < 8 - offset ? nbits : 8 - offset;
      bytes_.back() = static_cast<uint8_t>(bytes_.back() | ((value & ((1u << take) - 1u)) << offset));
      value >>= take;
      nbits -= take;
      bits_ += static_cast<uint64_t>(take);
    }
  }
  void put_bytes(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    if ((bits_ & 7u) == 0) {
      bytes_.insert(bytes_.end(), p, p + n);
      bits_ += 8 * static_cast<uint64_t>(n);
    } else {
      for (size_t i = 0; i < n; ++i) put(p[i], 8);
    }
  }
  uint64_t bits() const { return bits_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
  uint64_t bits_ = 0;
};

// What Format::roundtrip_grown may keep between calls on one growing span (the same
// unit, first token, format object and rows, only more of them): a growing cache holds
// one per fitted segment and window and drops it when that segment is made anew. NUQ
// -cal<N> keeps its codebooks once N rows are in, so that later steps need not fit
// them again. `owner` is the format that wrote `state`; any other format ignores it.
// The state is immutable, so copies of a cache may share it.
struct GrowthMemo {
  const void* owner = nullptr;
  std::shared_ptr<const void> state;
};

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

  // The stored representation of a span (codes and every piece of metadata), appended
  // to `out` in the layout code_layout() describes. Exactly storage_bits() bits are
  // written. The ggml formats write ggml's own block bytes.
  // Every format in the table implements it (tests/formats/test_format_table.cpp checks that
  // exactly storage_bits() bits come out); the default is for ad-hoc test formats.
  virtual void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const;
  // One paragraph describing encode()'s layout (field order, widths, packing).
  virtual std::string code_layout() const { return "(no code layout: " + name() + " is not in the format table)"; }

  // Formats that store keys only as a sketch for inner products (QJL) return true;
  // such formats cannot hold values, and attention takes their keys' scores from
  // score_estimator() instead of a decoded key.
  virtual bool keys_only() const { return false; }
  // Formats that quantize a key span's pre-RoPE keys (SpanInfo::key_pre_rope) and
  // rotate the result, ignoring x (prerope:<format>), return true; no wrapper may hold
  // one, since what it passes in as x would not be what gets quantized.
  virtual bool reads_pre_rope_keys() const { return false; }
  // How many values of the span roundtrip() clips instead of rounding, because the
  // format's range could not reach them: a stored scale or zero saturated at its
  // dtype's largest value (int, nf4 with fp16 metadata beyond ~6e4), or a value lies
  // beyond ±max·scale of a static or calibrated fp8 scale by more than half a step. A
  // diagnostic (kvbudget quantize warns); formats that cannot clip this way return 0.
  // ggml's fp16 scales overflow to infinity instead, which shows as non-finite output.
  virtual int64_t clipped_values(ConstMatView /*x*/, const SpanInfo& /*span*/) const { return 0; }
  // How many consecutive tokens one quantization group spans, for formats whose groups
  // run along tokens (int ch<G>: G; int ch: 0, one group over the whole span). A causal
  // cache cannot quantize a group before its last token is written: until then the
  // group's tokens stay at the residual precision (plan.h, open_group_begin; methods.md
  // §3, "groups along tokens"). 1 (the default): each token is quantized on its own.
  virtual int64_t tokens_per_group() const { return 1; }
  // Whether a span may be quantized in pieces cut at its groups: roundtrip() of rows
  // [0, c) and of rows [c, T) (with span_from's SpanInfo, first_token moved by c) give
  // the bits of the whole span's roundtrip() for every cut c that is a multiple of
  // tokens_per_group() (>= 1). True when nothing is fitted to the span as a whole (a
  // scale, codebook or channel set calibrated on its rows); a growing cache then
  // re-quantizes only its new groups (sim/model/kv_cache.h). False, the default, is
  // always correct, only slower there; tests/formats/test_format_table.cpp checks every
  // format that says true.
  virtual bool splits_at_groups() const { return false; }
  // The round trip of a span grown from its first m rows (0 <= m <= x.rows) into out,
  // whose rows [0, m) hold the round trip of x's first m rows as a span of their own
  // (never read): rewrites only the rows that differ and returns the first row it
  // wrote. A format fitted to its span (splits_at_groups() false) keeps the first m
  // rows and returns m when the fit over the grown span is bit for bit theirs (NVFP4's
  // tensor scale, fp8 -cal<N>'s scale, NUQ -cal<N>'s codebooks, int ch's channel scales;
  // wrappers ask their inner format), and otherwise writes every row and returns 0.
  // `memo`: null, or what this call may keep for the next call on the same growing
  // span (GrowthMemo). The default, the whole round trip and 0, is always correct. A
  // growing cache calls it for fitted segments (sim/reconstruction.h,
  // update_unit_versions); test_format_table.cpp checks every format against roundtrip().
  virtual int64_t roundtrip_grown(ConstMatView x, int64_t /*m*/, MatView out, const SpanInfo& span,
                                  GrowthMemo* /*memo*/) const {
    roundtrip(x, out, span);
    return 0;
  }
  // Builds the score estimator of a key span; nullptr (the default) means attention
  // uses the decoded keys from roundtrip().
  virtual std::unique_ptr<ScoreEstimator> score_estimator(ConstMatView /*keys*/, const SpanInfo& /*span*/) const {
    return nullptr;
  }
};

using FormatPtr = std::shared_ptr<const Format>;

}  // namespace kvb
