#include "sim/formats/keep_format.h"

#include "sim/core/error.h"
#include "sim/formats/int_format.h"
#include "sim/formats/name_parse.h"

namespace kvb {

std::string KeepFormat::name() const { return std::string("keep-") + store_dtype_name(dtype_); }

void KeepFormat::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    float* orow = out.row(r);
    for (int64_t c = 0; c < x.cols; ++c) orow[c] = round_to_store(xr[c], dtype_);
  }
}

void KeepFormat::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) out.put(store_bits(x.row(r)[c], dtype_), store_dtype_bits(dtype_));
}

std::string KeepFormat::code_layout() const {
  return std::string("one little-endian ") + store_dtype_name(dtype_) + " value per element, row-major";
}

FormatPtr parse_keep_format(std::string_view name) {
  NameParts parts(name);
  if (parts.at(0) != "keep") return nullptr;
  StoreDtype dt;
  if (parts.size() != 2 || !parse_store_dtype(parts.at(1), dt))
    throw ConfigError("format '" + std::string(name) + "': expected keep-fp16, keep-bf16 or keep-fp32");
  return std::make_shared<KeepFormat>(dt);
}

}  // namespace kvb
