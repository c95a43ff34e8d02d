#include "sim/formats/fp4_format.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "sim/core/error.h"
#include "sim/formats/fp_blocks.h"
#include "sim/formats/name_parse.h"

namespace kvb {

namespace {

float span_absmax(ConstMatView x) {
  float m = 0.0f;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) m = std::max(m, absf(x.row(r)[c]));
  return m;
}

}  // namespace

uint64_t Fp4Format::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  const uint64_t n = static_cast<uint64_t>(tokens) * static_cast<uint64_t>(head_dim);
  const uint64_t blocks = static_cast<uint64_t>(tokens) * static_cast<uint64_t>((head_dim + block() - 1) / block());
  return n * 4u + blocks * 8u + (nv_ ? 32u : 0u);
}

std::string Fp4Format::check_shape(int64_t /*tokens*/, int64_t head_dim) const {
  if (head_dim % block() != 0)
    return name() + " blocks of " + std::to_string(block()) + " do not divide head_dim " + std::to_string(head_dim);
  return {};
}

template <class Fn>
void Fp4Format::for_each_block(ConstMatView x, float g, Fn fn) const {
  if (x.cols % block() != 0) throw Error("format '" + name() + "': " + check_shape(x.rows, x.cols));
  uint8_t codes[kMxfp4Block];
  uint8_t scale = 0;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; c += block()) {
      if (nv_) nvfp4_quantize_block(x.row(r) + c, g, scale, codes);
      else mxfp4_quantize_block(x.row(r) + c, scale, codes);
      fn(r, c, scale, codes);
    }
}

void Fp4Format::roundtrip_blocks(ConstMatView x, float g, MatView out) const {
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; c += block()) {
      if (nv_) nvfp4_roundtrip_block(x.row(r) + c, g, out.row(r) + c);
      else mxfp4_roundtrip_block(x.row(r) + c, out.row(r) + c);
    }
}

void Fp4Format::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  if (x.cols % block() != 0) throw Error("format '" + name() + "': " + check_shape(x.rows, x.cols));
  roundtrip_blocks(x, nv_ ? nvfp4_tensor_scale(span_absmax(x)) : 1.0f, out);
}

int64_t Fp4Format::roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& /*span*/,
                                  GrowthMemo* /*memo*/) const {
  if (x.cols % block() != 0) throw Error("format '" + name() + "': " + check_shape(x.rows, x.cols));
  m = std::clamp<int64_t>(m, 0, x.rows);
  // span_absmax is a maximum (NaN skipped), so the grown span's is the larger of its parts'.
  const float prefix = nv_ ? span_absmax(x.rows_in(0, m)) : 0.0f;
  const float g = nv_ ? nvfp4_tensor_scale(std::max(prefix, span_absmax(x.rows_in(m, x.rows)))) : 1.0f;
  if (nv_ && std::bit_cast<uint32_t>(g) != std::bit_cast<uint32_t>(nvfp4_tensor_scale(prefix))) m = 0;
  roundtrip_blocks(x.rows_in(m, x.rows), g, out.rows_in(m, x.rows));
  return m;
}

void Fp4Format::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  const float g = nv_ ? nvfp4_tensor_scale(span_absmax(x)) : 1.0f;
  if (nv_) {
    uint32_t gb;
    std::memcpy(&gb, &g, sizeof gb);
    out.put(gb, 32);
  }
  for_each_block(x, g, [&](int64_t, int64_t, uint8_t scale, const uint8_t* codes) {
    out.put(scale, 8);
    for (int j = 0; j < block(); ++j) out.put(codes[j], 4);
  });
}

std::string Fp4Format::code_layout() const {
  if (nv_)
    return "fp32 tensor scale of the span (little-endian), then per row, per block of 16: one E4M3 block-scale "
           "byte and 16 E2M1 codes (4 bits each, element 2i in the low nibble of a byte, 2i+1 in the high one)";
  return "per row, per block of 32: one E8M0 scale byte (2^(e-127)) and 32 E2M1 codes (4 bits each, element 2i in "
         "the low nibble of a byte, 2i+1 in the high one)";
}

FormatPtr parse_fp4_format(std::string_view name) {
  if (name == "mxfp4") return std::make_shared<Fp4Format>(false);
  if (name == "nvfp4") return std::make_shared<Fp4Format>(true);
  NameParts parts(name);
  if (parts.at(0) == "mxfp4" || parts.at(0) == "nvfp4")
    throw ConfigError("format '" + std::string(name) + "': mxfp4 and nvfp4 take no options");
  return nullptr;
}

}  // namespace kvb
