// Rotation + Lloyd-Max ("turbo", TurboQuant / HIGGS style; per-vector arithmetic in
// turbo_block.h): every token vector is stored as fp16 norm(s) plus b-bit codes of its
// randomized-Hadamard-rotated coordinates, quantized with the N(0, 1) Lloyd-Max
// codebook (lloyd_max.h). Every unit (layer, KV head, K/V, experiment seed) gets its
// own random signs.
//
// Name grammar: turbo-<b>[-o<n>b<B>[-cal<N>]]      b, B in 1..8; n = <count> or <p>%
//   turbo-<b>          one part: the whole vector (head_dim a power of two);
//                      b + 16/head_dim bits per element
//   -o<n>b<B>          outlier split in the ORIGINAL channel space (TurboQuant's
//                      mixed precision): per span, the n channels with the largest
//                      energy (sum of squares) over the span's first N tokens are
//                      quantized as one part at B bits; the other head_dim - n channels
//                      at b bits, as power-of-two parts (e.g. 96 = 64 + 32). Every part
//                      is an independent rotation + Lloyd-Max instance with its own fp16
//                      norm; the chosen channel set costs head_dim bits per span.
//                      n (a count, or p% of head_dim) must be a power of two below
//                      head_dim.
//   -cal<N>            calibration tokens for the split (default 128, omitted)
// E.g. turbo-2-o50%b3 stores half the channels at 3 bits and half at 2, 2.5 code bits
// per element at any power-of-two head_dim, + 2 x 16/head_dim norm bits per element
// and head_dim bits per span; turbo-2-o32b3 gives 32 channels 3 bits.
#pragma once
#include <string>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

struct TurboSpec {
  int bits = 3;
  int64_t outliers = 0;          // n as a count; 0 = no split (unless a percentage is set)
  float outlier_percent = 0.0f;  // n as p% of head_dim (rounded to nearest); 0 = unused
  int outlier_bits = 0;          // B
  bool split() const { return outliers > 0 || outlier_percent > 0.0f; }
  int64_t outlier_count(int64_t head_dim) const;
  int64_t calibration_tokens = 128;
  std::string name() const;
};

// One independently rotated part of a vector: channels perm[offset .. offset + size)
// of the span's channel order (outliers first, then the rest, each ascending).
struct TurboPart {
  int64_t offset = 0;
  int64_t size = 0;  // a power of two
  int bits = 0;
};

class TurboFormat final : public Format {
 public:
  explicit TurboFormat(TurboSpec spec) : spec_(spec) {}
  const TurboSpec& spec() const { return spec_; }

  std::string name() const override { return spec_.name(); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  // Code bits of the non-outlier channels (the true cost is storage_bits()).
  double nominal_bits() const override { return spec_.bits; }
  // Rotations are seeded per unit; a split's channel set is chosen per span.
  bool splits_at_groups() const override { return !spec_.split(); }
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;

  // The parts of a head_dim vector (empty if the shape is invalid).
  std::vector<TurboPart> parts(int64_t head_dim) const;
  // The span's channel order: the outlier channels, then the others, each ascending
  // (identity without a split).
  std::vector<int32_t> channel_order(ConstMatView x) const;

 private:
  // Calls fn(row, part index, norm bits, codes, decoded values in part order).
  template <class Fn>
  void run(ConstMatView x, const SpanInfo& span, bool decode, const std::vector<int32_t>& order, Fn fn) const;
  TurboSpec spec_;
};

// Seed stream of part p's random signs for a unit (shared with the reference in tests).
uint64_t turbo_sign_stream(const SpanInfo& span, int part);

FormatPtr parse_turbo_format(std::string_view name);

}  // namespace kvb
