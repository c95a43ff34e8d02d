#include "sim/formats/nf4_format.h"

#include <algorithm>
#include <cstring>

#include "sim/core/error.h"
#include "sim/formats/int_format.h"
#include "sim/formats/name_parse.h"
#include "sim/formats/nf4_block.h"

namespace kvb {

namespace {

struct Nf4Thresholds {
  float t[15];
  Nf4Thresholds() {
    for (int i = 0; i < 15; ++i) t[i] = nf4_threshold(i);
  }
};
const Nf4Thresholds kThresholds;
constexpr int kChunk = 256;

}  // namespace

std::string Nf4Format::name() const {
  std::string n = "nf4-g" + std::to_string(group_);
  if (scale_dtype_ != StoreDtype::F16) n += std::string("-s") + store_dtype_name(scale_dtype_);
  return n;
}

uint64_t Nf4Format::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  const uint64_t groups = static_cast<uint64_t>(tokens) * static_cast<uint64_t>((head_dim + group_ - 1) / group_);
  return static_cast<uint64_t>(tokens * head_dim) * 4u + groups * static_cast<uint64_t>(store_dtype_bits(scale_dtype_));
}

std::string Nf4Format::check_shape(int64_t /*tokens*/, int64_t head_dim) const {
  if (head_dim % group_ != 0)
    return "group size " + std::to_string(group_) + " does not divide head_dim " + std::to_string(head_dim);
  return {};
}

template <class Fn>
void Nf4Format::for_each_group(ConstMatView x, Fn fn) const {
  if (x.cols % group_ != 0) throw Error("format '" + name() + "': " + check_shape(x.rows, x.cols));
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; c += group_) fn(r, c, nf4_group_scale(x.row(r) + c, group_, scale_dtype_));
}

void Nf4Format::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  for_each_group(x, [&](int64_t r, int64_t c, float s) {
    const float* xr = x.row(r) + c;
    float* o = out.row(r) + c;
    const float inv = nf4_inverse_scale(s);
    // The group's codes at once (vectorized; the same indices as nf4_encode).
    for (int64_t i0 = 0; i0 < group_; i0 += kChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kChunk, group_ - i0));
      float v[kChunk];
      uint8_t codes[kChunk];
      for (int i = 0; i < n; ++i) v[i] = mul_rn(xr[i0 + i], inv);
      codebook_indices(v, n, kThresholds.t, 16, codes);
      for (int i = 0; i < n; ++i) o[i0 + i] = nf4_decode(codes[i], s);
    }
  });
}

void Nf4Format::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  for_each_group(x, [&](int64_t r, int64_t c, float s) {
    out.put(store_bits(s, scale_dtype_), store_dtype_bits(scale_dtype_));
    const float* xr = x.row(r) + c;
    const float inv = nf4_inverse_scale(s);
    for (int64_t i = 0; i < group_; ++i) out.put(static_cast<uint64_t>(nf4_encode(xr[i], inv, kThresholds.t)), 4);
  });
}

int64_t Nf4Format::clipped_values(ConstMatView x, const SpanInfo& /*span*/) const {
  // A group's absmax scale reaches its largest value only if it saturated; then the
  // values beyond it come back as ±scale (the codebook's ±1).
  int64_t clipped = 0;
  for_each_group(x, [&](int64_t r, int64_t c, float s) {
    if (s < store_dtype_max(scale_dtype_)) return;
    for (int64_t i = 0; i < group_; ++i) clipped += absf(x.row(r)[c + i]) > s;
  });
  return clipped;
}

std::string Nf4Format::code_layout() const {
  return std::string("per row, per group of ") + std::to_string(group_) + " channels: " + store_dtype_name(scale_dtype_) +
         " absmax scale, then one 4-bit NF4 index per value (low nibble first)";
}

FormatPtr parse_nf4_format(std::string_view name) {
  NameParts parts(name);
  if (parts.at(0) != "nf4") return nullptr;
  const std::string where = "format '" + std::string(name) + "'";
  const auto g = parse_int_suffix(parts.at(1), "g");
  if (!g || *g < 1) throw ConfigError(where + ": expected nf4-g<G>[-s<fp16|bf16|fp32>] (e.g. nf4-g64)");
  StoreDtype dt = StoreDtype::F16;
  if (parts.size() == 3) {
    const std::string_view opt = parts.at(2);
    if (!(opt.size() > 1 && opt[0] == 's' && parse_store_dtype(opt.substr(1), dt)))
      throw ConfigError(where + ": unknown option '-" + std::string(opt) + "' (expected -s<fp16|bf16|fp32>)");
  } else if (parts.size() > 3) {
    throw ConfigError(where + ": too many options");
  }
  return std::make_shared<Nf4Format>(*g, dt);
}

}  // namespace kvb
