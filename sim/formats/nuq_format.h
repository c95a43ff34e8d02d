// Non-uniform per-channel codebooks (KVQuant's "nuq"): for every channel of a span, a
// 2^b-entry codebook is fitted by 1-D k-means (Lloyd iteration) on the channel's values
// over the span's first N tokens (the calibration tokens), optionally weighting each
// sample by its square; every token is then stored as b-bit indices into its channels'
// codebooks. The codebooks (fp16) are stored once per span and counted:
// b + 2^b * 16 / tokens bits per element.
//
// Name grammar: nuq<b>[-cal<N>][-wsq]    b in 1..8
//   -cal<N>  calibration tokens (default: the whole span, an in-sample fit)
//   -wsq     weight samples by x² (a gradient-free stand-in for KVQuant's Fisher
//            weighting that favours large magnitudes)
// KVQuant quantizes keys per channel before RoPE: wrap it, e.g. prerope:nuq4-cal256.
#pragma once
#include <string>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

struct NuqSpec {
  int bits = 4;
  int64_t calibration_tokens = 0;  // 0 = all tokens of the span
  bool weighted = false;
  std::string name() const;
};

// One channel's fitted codebook as stored.
struct ChannelCodebook {
  std::vector<float> values;      // 2^b ascending fp16-representable values
  std::vector<float> thresholds;  // 2^b - 1 midpoints (codebook.h)
};

// 1-D k-means with k = 2^bits on `samples` (sorted ascending in place), starting from
// the quantiles (k + 1/2)/K; at most max_iterations, stopping when no sample changes
// cell. Cells are contiguous ranges of the sorted samples; sums run in sorted order in
// double. Empty cells keep their centroid. Returns the exact (double) centroids.
std::vector<double> fit_kmeans_1d(std::vector<float>& samples, int bits, bool weighted, int max_iterations);

// The stored codebook from fitted centroids (fp16 rounding, thresholds).
ChannelCodebook make_channel_codebook(const std::vector<double>& centroids);

class NuqFormat final : public Format {
 public:
  static constexpr int kMaxIterations = 100;

  explicit NuqFormat(NuqSpec spec) : spec_(spec) {}
  const NuqSpec& spec() const { return spec_; }
  std::string name() const override { return spec_.name(); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  // -cal<N>: only the new rows once m >= N (the codebooks come from the first N rows).
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  double nominal_bits() const override { return spec_.bits; }
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;

  // The span's per-channel codebooks ([head_dim]).
  std::vector<ChannelCodebook> fit(ConstMatView x) const;

 private:
  NuqSpec spec_;
};

FormatPtr parse_nuq_format(std::string_view name);

}  // namespace kvb
