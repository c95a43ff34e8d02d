// ggml block formats: q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl (blocks of 32 along head_dim),
// bit-exact with ggml's reference quantizers (see ggml_blocks.h for the semantics).
//
// Name grammar: q4_0 | q4_1 | q5_0 | q5_1 | q8_0 | iq4_nl | iq4_nl-ntry<N>
//   iq4_nl         quantize_row_iq4_nl_ref (what ggml's CPU backend uses for an iq4_nl
//                  KV cache): no scale search
//   iq4_nl-ntry<N> quantize_iq4_nl's scale search over N candidates each side
//                  (N = 7 is llama-quantize without an importance matrix)
// Bits per element follow from the block structs: sizeof(block) * 8 / 32.
#pragma once
#include <string>

#include "sim/formats/format.h"

namespace kvb {

enum class GgmlType { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL };

const char* ggml_type_name(GgmlType t);  // "q4_0", ...
int ggml_block_bytes(GgmlType t);        // sizeof of the block struct

class GgmlFormat final : public Format {
 public:
  // ntry: iq4_nl only; -1 reproduces quantize_row_iq4_nl_ref.
  explicit GgmlFormat(GgmlType type, int ntry = -1) : type_(type), ntry_(ntry) {}
  GgmlType type() const { return type_; }
  int ntry() const { return ntry_; }

  std::string name() const override;
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override;
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  double nominal_bits() const override;
  bool splits_at_groups() const override { return true; }  // blocks along head_dim, per token
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  // ggml's own bytes: for each row, its head_dim/32 blocks in order, exactly as a ggml
  // tensor with ne0 = head_dim stores them.
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;

 private:
  GgmlType type_;
  int ntry_;
};

FormatPtr parse_ggml_format(std::string_view name);

}  // namespace kvb
