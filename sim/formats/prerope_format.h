// Pre-RoPE key quantization (KVQuant): a key span is quantized *before* RoPE with the
// inner format, from the recording's pre-RoPE keys, and RoPE is re-applied after
// dequantization with the recording's positions and theta (Hugging Face rotate_half
// convention, see rope_rotate_row). The reconstructed keys are then compared with the
// recorded post-RoPE keys as usual, so any mismatch between the model's own RoPE
// arithmetic (often bf16) and ours shows up as error.
// Values have no RoPE: a value span is stored with the inner format unchanged, so one
// preset can name both keys and values.
//
// Name grammar: prerope:<format>     e.g. prerope:nuq4-cal256, prerope:int2-asym-ch32
// Errors (kvb::Error naming the format and the recording) when the recording carries
// no pre-RoPE keys or its keys are not post-RoPE.
#pragma once
#include <string>
#include <vector>

#include "sim/core/rope.h"
#include "sim/formats/format.h"

namespace kvb {

// RoPE of one head_dim row x at an integer position, in place (sim/core/rope.h:
// rotate_half pairs (i, i + d/2), Hugging Face's fp32 arithmetic).
void rope_rotate_row(float* x, int64_t d, double position, double theta);

// The rotation reapply_rope gives rows [r0, r1) of `span`: each row at its position
// (span.positions[r], else span.first_token + r), with the span's scaled inverse
// frequencies when it has them, else theta^(-2i/head_dim).
RopeTable span_rope_table(const SpanInfo& span, int64_t r0, int64_t r1, int64_t head_dim);

// The largest relative L2 error ||RoPE(key_pre_rope) − key||₂ / ||key||₂ of one span (one
// layer's KV head in a recording) that check_pre_rope_keys accepts. Rounding alone stays
// well below it: the committed recordings (F16, fp32 RoPE) give at most 3.1e-4; a model
// computing RoPE in bf16 (cos, sin and the products rounded) stored as BF16 gives
// ~2.5e-3. A wrong theta or keys from other positions give ~0.1 to 1.4 (500000 read as
// 10000: 1.2; spans that restart at position 0 mid-sequence: 0.7). TorchRecorder checks
// its captures with the same bound.
inline constexpr double kPreRopeKeyTolerance = 2e-2;

// Checks that RoPE as the prerope: formats re-apply it (span_rope_table: the span's
// positions, theta or scaled frequencies) turns each span's pre-RoPE keys
// (spans[i].key_pre_rope, keys[i].rows x keys[i].cols) into its post-RoPE keys keys[i].
// Throws kvb::Error when a span's relative L2 error exceeds kPreRopeKeyTolerance, or the
// head_dim is odd (rotate-half RoPE pairs channels i and i + head_dim/2): the message
// names `where`, the worst span (`unit` and its kv_head, e.g. "KV head 1"), the theta (and
// the scaling), the error, and `causes` (what to check, in the caller's terms). At most
// 4096 rows a span are compared, evenly spread with the first and last (a mismatch shows
// on every row), so a 128K-token layer costs what a 4K-token one does.
void check_pre_rope_keys(const std::vector<ConstMatView>& keys, const std::vector<SpanInfo>& spans,
                         const std::string& where, const std::string& unit, const std::string& causes);
// check_pre_rope_keys on a flat tensor of `rows` x `head_dim` post-RoPE keys and its
// pre-RoPE twin, cut into spans of `rows_per_span` rows, each at positions 0.. (what
// `kvbudget quantize --pre-rope` and the Python quantize(pre_rope=) quantize): span s is
// `base` with kv_head s and its rows of `pre_rope`.
void check_pre_rope_key_rows(const float* keys, const float* pre_rope, int64_t rows, int64_t head_dim,
                             int64_t rows_per_span, const SpanInfo& base, const std::string& where,
                             const std::string& causes);

class PreRopeFormat final : public Format {
 public:
  explicit PreRopeFormat(FormatPtr inner) : inner_(std::move(inner)) {}
  const FormatPtr& inner() const { return inner_; }

  std::string name() const override { return "prerope:" + inner_->name(); }
  uint64_t storage_bits(int64_t tokens, int64_t head_dim) const override {
    return inner_->storage_bits(tokens, head_dim);
  }
  void roundtrip(ConstMatView x, MatView out, const SpanInfo& span) const override;
  int64_t roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& span,
                          GrowthMemo* memo) const override;
  double nominal_bits() const override { return inner_->nominal_bits(); }
  bool splits_at_groups() const override { return inner_->splits_at_groups(); }  // RoPE per row's position
  int64_t tokens_per_group() const override { return inner_->tokens_per_group(); }
  std::string check_shape(int64_t tokens, int64_t head_dim) const override;
  void encode(ConstMatView x, const SpanInfo& span, BitWriter& out) const override;
  std::string code_layout() const override;
  bool reads_pre_rope_keys() const override { return true; }

 private:
  // The pre-RoPE keys of a key span; throws when the recording has none.
  ConstMatView pre_rope_keys(ConstMatView x, const SpanInfo& span) const;
  // RoPE applied to rows [r0, r1) of out, at the span's positions of those rows.
  void reapply_rope(const SpanInfo& span, int64_t r0, int64_t r1, MatView out) const;
  FormatPtr inner_;
};

FormatPtr parse_prerope_format(std::string_view name);

}  // namespace kvb
