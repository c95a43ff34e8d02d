#include "sim/formats/ggml_format.h"

#include "sim/core/error.h"
#include "sim/formats/ggml_blocks.h"
#include "sim/formats/name_parse.h"

namespace kvb {

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return "q4_0";
    case GgmlType::Q4_1: return "q4_1";
    case GgmlType::Q5_0: return "q5_0";
    case GgmlType::Q5_1: return "q5_1";
    case GgmlType::Q8_0: return "q8_0";
    case GgmlType::IQ4_NL: return "iq4_nl";
  }
  return "?";
}

int ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return sizeof(GgmlBlockQ4_0);
    case GgmlType::Q4_1: return sizeof(GgmlBlockQ4_1);
    case GgmlType::Q5_0: return sizeof(GgmlBlockQ5_0);
    case GgmlType::Q5_1: return sizeof(GgmlBlockQ5_1);
    case GgmlType::Q8_0: return sizeof(GgmlBlockQ8_0);
    case GgmlType::IQ4_NL: return sizeof(GgmlBlockIQ4NL);
  }
  return 0;
}

std::string GgmlFormat::name() const {
  std::string n = ggml_type_name(type_);
  if (type_ == GgmlType::IQ4_NL && ntry_ >= 0) n += "-ntry" + std::to_string(ntry_);
  return n;
}

double GgmlFormat::nominal_bits() const {
  switch (type_) {
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: return 5;
    case GgmlType::Q8_0: return 8;
    default: return 4;
  }
}

uint64_t GgmlFormat::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  const uint64_t blocks = static_cast<uint64_t>(tokens) * static_cast<uint64_t>((head_dim + kGgmlBlock - 1) / kGgmlBlock);
  return blocks * 8u * static_cast<uint64_t>(ggml_block_bytes(type_));
}

std::string GgmlFormat::check_shape(int64_t /*tokens*/, int64_t head_dim) const {
  if (head_dim % kGgmlBlock != 0)
    return "ggml blocks of 32 do not divide head_dim " + std::to_string(head_dim);
  return {};
}

namespace {

template <class Block>
void write_block(const Block& b, BitWriter& out) {
  // Every field is a uint16_t (little-endian) or bytes; write them in struct order.
  if constexpr (requires { b.m; }) {
    out.put(b.d, 16);
    out.put(b.m, 16);
  } else {
    out.put(b.d, 16);
  }
  if constexpr (requires { b.qh; }) out.put_bytes(b.qh, sizeof b.qh);
  out.put_bytes(b.qs, sizeof b.qs);
}

// Calls fn(block) for every block of x, row by row, after quantizing it.
template <class Block, class Quantize, class Fn>
void for_each_block(ConstMatView x, Quantize quantize, Fn fn) {
  Block b;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c + kGgmlBlock <= x.cols; c += kGgmlBlock) {
      quantize(x.row(r) + c, b);
      fn(r, c, b);
    }
}

template <class Block, class Quantize, class Dequantize>
void roundtrip_blocks(ConstMatView x, MatView out, Quantize quantize, Dequantize dequantize) {
  for_each_block<Block>(x, quantize, [&](int64_t r, int64_t c, const Block& b) { dequantize(b, out.row(r) + c); });
}

template <class Block, class Quantize>
void encode_blocks(ConstMatView x, BitWriter& out, Quantize quantize) {
  for_each_block<Block>(x, quantize, [&](int64_t, int64_t, const Block& b) { write_block(b, out); });
}

void require_blocks(const GgmlFormat& f, int64_t cols) {
  if (cols % kGgmlBlock != 0)
    throw Error("format '" + f.name() + "': " + f.check_shape(0, cols));
}

}  // namespace

void GgmlFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  require_blocks(*this, x.cols);
  const int ntry = ntry_;
  switch (type_) {
    case GgmlType::Q4_0:
      roundtrip_blocks<GgmlBlockQ4_0>(x, out, ggml_quantize_q4_0, ggml_dequantize_q4_0);
      break;
    case GgmlType::Q4_1:
      roundtrip_blocks<GgmlBlockQ4_1>(x, out, ggml_quantize_q4_1, ggml_dequantize_q4_1);
      break;
    case GgmlType::Q5_0:
      roundtrip_blocks<GgmlBlockQ5_0>(x, out, ggml_quantize_q5_0, ggml_dequantize_q5_0);
      break;
    case GgmlType::Q5_1:
      roundtrip_blocks<GgmlBlockQ5_1>(x, out, ggml_quantize_q5_1, ggml_dequantize_q5_1);
      break;
    case GgmlType::Q8_0:
      roundtrip_blocks<GgmlBlockQ8_0>(x, out, ggml_quantize_q8_0, ggml_dequantize_q8_0);
      break;
    case GgmlType::IQ4_NL:
      roundtrip_blocks<GgmlBlockIQ4NL>(
          x, out, [ntry](const float* v, GgmlBlockIQ4NL& b) { ggml_quantize_iq4_nl(v, b, ntry); },
          ggml_dequantize_iq4_nl);
      break;
  }
}

void GgmlFormat::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  require_blocks(*this, x.cols);
  const int ntry = ntry_;
  switch (type_) {
    case GgmlType::Q4_0: encode_blocks<GgmlBlockQ4_0>(x, out, ggml_quantize_q4_0); break;
    case GgmlType::Q4_1: encode_blocks<GgmlBlockQ4_1>(x, out, ggml_quantize_q4_1); break;
    case GgmlType::Q5_0: encode_blocks<GgmlBlockQ5_0>(x, out, ggml_quantize_q5_0); break;
    case GgmlType::Q5_1: encode_blocks<GgmlBlockQ5_1>(x, out, ggml_quantize_q5_1); break;
    case GgmlType::Q8_0: encode_blocks<GgmlBlockQ8_0>(x, out, ggml_quantize_q8_0); break;
    case GgmlType::IQ4_NL:
      encode_blocks<GgmlBlockIQ4NL>(x, out, [ntry](const float* v, GgmlBlockIQ4NL& b) { ggml_quantize_iq4_nl(v, b, ntry); });
      break;
  }
}

std::string GgmlFormat::code_layout() const {
  std::string fields;
  switch (type_) {
    case GgmlType::Q4_0: fields = "fp16 d, 16 bytes qs"; break;
    case GgmlType::Q4_1: fields = "fp16 d, fp16 m, 16 bytes qs"; break;
    case GgmlType::Q5_0: fields = "fp16 d, 4 bytes qh, 16 bytes qs"; break;
    case GgmlType::Q5_1: fields = "fp16 d, fp16 m, 4 bytes qh, 16 bytes qs"; break;
    case GgmlType::Q8_0: fields = "fp16 d, 32 int8 qs"; break;
    case GgmlType::IQ4_NL: fields = "fp16 d, 16 bytes qs (indices into kvalues_iq4nl)"; break;
  }
  return "ggml block_" + std::string(ggml_type_name(type_)) + " (" + std::to_string(ggml_block_bytes(type_)) +
         " bytes: " + fields + ", little-endian), head_dim/32 blocks per row, rows in order: byte for byte what "
         "ggml stores for a tensor with ne0 = head_dim";
}

FormatPtr parse_ggml_format(std::string_view name) {
  NameParts parts(name);
  const std::string_view head = parts.at(0);
  static const GgmlType kTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                    GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL};
  for (GgmlType t : kTypes) {
    if (head != ggml_type_name(t)) continue;
    const std::string where = "format '" + std::string(name) + "'";
    if (parts.size() == 1) return std::make_shared<GgmlFormat>(t);
    if (t != GgmlType::IQ4_NL || parts.size() != 2)
      throw ConfigError(where + ": ggml formats take no options except iq4_nl-ntry<N>");
    const auto n = parse_int_suffix(parts.at(1), "ntry");
    if (!n || *n < 0 || *n > 127)
      throw ConfigError(where + ": expected iq4_nl-ntry<N> with N in 0..127 (e.g. iq4_nl-ntry7)");
    return std::make_shared<GgmlFormat>(t, static_cast<int>(*n));
  }
  return nullptr;
}

}  // namespace kvb
