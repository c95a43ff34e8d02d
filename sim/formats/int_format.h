// Integer quantizers, b = 1..8, symmetric (absmax) or asymmetric (min-max), grouped
// along head_dim (g<G>, tok) or along tokens per channel (ch<G>, ch).
//
// Name grammar: int<b>-<sym|asym>-<g<G>|tok|ch<G>|ch>[-s<fp16|bf16|fp32>][-z<fp16|bf16|fp32>]
//   g<G>   groups of G consecutive channels within each token (G divides head_dim)
//   tok    per token: one group is the whole head_dim vector
//   ch<G>  per channel, groups of G consecutive tokens (KIVI keys); a last partial
//          group is quantized on its own and pays its own metadata
//   ch     per channel over the whole span
//   -s/-z  dtype of the stored scale / zero (min); default fp16, omitted in the
//          canonical name. Symmetric formats store no zero.
#pragma once
#include <string>
#include <vector>

#include "sim/core/half.h"
#include "sim/formats/format.h"
#include "sim/formats/int_block.h"

namespace kvb {

enum class IntGrouping { Channels, PerToken, TokensPerChannel, WholeSpanPerChannel };

struct IntFormatSpec {
  int bits = 4;
  bool symmetric = false;
  IntGrouping grouping = IntGrouping::Channels;
  int64_t group = 32;  // for Channels and TokensPerChannel
  StoreDtype scale_dtype = StoreDtype::F16;
  StoreDtype zero_dtype = StoreDtype::F16;

  std::string name() const;
  // Elements per group along the grouping axis for a span (head_dim or tokens).
  int64_t group_len(int64_t tokens, int64_t head_dim) const;
  int metadata_bits_per_group() const;
};

// The quantized form of a [rows, cols] span, unpacked: what the CUDA twin's quantize
// kernel writes (kernels/int_twin.h), compared byte for byte by the GPU tests.
struct IntCodes {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;           // [rows, cols]: int_stored_code of each element
  std::vector<IntGroupParams> params;   // per group, as stored (scale, zero), in group order:
                                        // g<G>/tok: [rows, ceil(cols / G)]; ch<G>/ch: [ceil(rows / G), cols]
};

class IntFormat final : public Format {
 public:
  explicit IntFormat(IntFormatSpec spec) : spec_(spec) {}
  const IntFormatSpec& spec() const { return spec_; }

  std::string name() const override { return spec_.name(); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  // dequantize(quantize(x)), bit for bit, fused (no codes materialized).
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  double nominal_bits() const override { return spec_.bits; }
  int64_t tokens_per_group() const override {
    return spec_.grouping == IntGrouping::TokensPerChannel ? spec_.group
           : spec_.grouping == IntGrouping::WholeSpanPerChannel ? 0
                                                                 : 1;
  }
  bool splits_at_groups() const override { return tokens_per_group() >= 1; }  // not int ch
  // int ch: only the new rows while every channel's stored scale and zero over the grown
  // span are the first m rows' (2 bits and more: the new rows within each channel's
  // range); the whole span otherwise, from the same folds.
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;
  int64_t clipped_values(ConstMatView x, const SpanInfo& span) const override;

  IntCodes quantize(ConstMatView x) const;
  void dequantize(const IntCodes& codes, MatView out) const;

 private:
  // Where the groups of a [rows, cols] span lie: of(r, c) is the index into
  // IntCodes::params of element (r, c). Built once per span.
  struct GroupLayout {
    int64_t group, cols, groups_per_row;
    bool along_channels;
    size_t of(int64_t r, int64_t c) const {
      return static_cast<size_t>(along_channels ? r * groups_per_row + c / group : (r / group) * cols + c);
    }
  };
  GroupLayout group_layout(int64_t rows, int64_t cols) const;

  IntFormatSpec spec_;
};

// Family entry for the registry.
FormatPtr parse_int_format(std::string_view name);

}  // namespace kvb
