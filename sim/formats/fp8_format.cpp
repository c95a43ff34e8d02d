#include "sim/formats/fp8_format.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "sim/core/error.h"
#include "sim/formats/fp_blocks.h"
#include "sim/formats/name_parse.h"

namespace kvb {

namespace {

float row_absmax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, absf(x[i]));
  return m;
}

uint32_t f32_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

}  // namespace

std::string Fp8Spec::name() const {
  std::string n = e5m2 ? "fp8-e5m2" : "fp8-e4m3";
  switch (scale) {
    case Fp8Scale::Static:
      if (static_scale != 1.0f) n += "-s" + name_number(static_scale);
      break;
    case Fp8Scale::Calibrated: n += "-cal" + std::to_string(calibration_tokens); break;
    case Fp8Scale::PerToken: n += "-tok"; break;
  }
  return n;
}

uint64_t Fp8Format::storage_bits(int64_t tokens, int64_t head_dim) const {
  if (tokens <= 0 || head_dim <= 0) return 0;
  const uint64_t codes = static_cast<uint64_t>(tokens) * static_cast<uint64_t>(head_dim) * 8u;
  switch (spec_.scale) {
    case Fp8Scale::Static: return codes;
    case Fp8Scale::Calibrated: return codes + 32u;
    case Fp8Scale::PerToken: return codes + 32u * static_cast<uint64_t>(tokens);
  }
  return codes;
}

float Fp8Format::span_scale(ConstMatView x) const {
  const MinifloatSpec s = fp8_minifloat(spec_.e5m2);
  if (spec_.scale == Fp8Scale::Static) return spec_.static_scale;
  float amax = 0.0f;
  const int64_t rows = std::min(x.rows, spec_.calibration_tokens);
  for (int64_t r = 0; r < rows; ++r) amax = std::max(amax, row_absmax(x.row(r), x.cols));
  return fp8_scale_from_absmax(amax, s);
}

void Fp8Format::roundtrip_rows(ConstMatView x, float shared, MatView out) const {
  const MinifloatSpec s = fp8_minifloat(spec_.e5m2);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    float* o = out.row(r);
    const ScaleDivisor scale =
        scale_divisor(spec_.scale == Fp8Scale::PerToken ? fp8_scale_from_absmax(row_absmax(xr, x.cols), s) : shared);
    for (int64_t c = 0; c < x.cols; ++c) o[c] = fp8_roundtrip_scaled(xr[c], scale, s);
  }
}

void Fp8Format::roundtrip(ConstMatView x, MatView out, const SpanInfo& /*span*/) const {
  roundtrip_rows(x, spec_.scale == Fp8Scale::PerToken ? 1.0f : span_scale(x), out);
}

int64_t Fp8Format::roundtrip_grown(ConstMatView x, int64_t m, MatView out, const SpanInfo& /*span*/,
                                  GrowthMemo* /*memo*/) const {
  m = std::clamp<int64_t>(m, 0, x.rows);
  const float shared = spec_.scale == Fp8Scale::PerToken ? 1.0f : span_scale(x);
  if (spec_.scale == Fp8Scale::Calibrated && m < spec_.calibration_tokens &&
      std::bit_cast<uint32_t>(shared) != std::bit_cast<uint32_t>(span_scale(x.rows_in(0, m))))
    m = 0;
  roundtrip_rows(x.rows_in(m, x.rows), shared, out.rows_in(m, x.rows));
  return m;
}

void Fp8Format::encode(ConstMatView x, const SpanInfo& /*span*/, BitWriter& out) const {
  const MinifloatSpec s = fp8_minifloat(spec_.e5m2);
  const float shared = spec_.scale == Fp8Scale::PerToken ? 1.0f : span_scale(x);
  if (spec_.scale == Fp8Scale::Calibrated) out.put(f32_bits(shared), 32);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    float scale = shared;
    if (spec_.scale == Fp8Scale::PerToken) {
      scale = fp8_scale_from_absmax(row_absmax(xr, x.cols), s);
      out.put(f32_bits(scale), 32);
    }
    const ScaleDivisor divisor = scale_divisor(scale);
    for (int64_t c = 0; c < x.cols; ++c) out.put(fp8_encode_scaled(xr[c], divisor, s), 8);
  }
}

int64_t Fp8Format::clipped_values(ConstMatView x, const SpanInfo& /*span*/) const {
  // A per-token scale covers its row; a static or calibrated one may not. Values whose
  // x / scale lies beyond max by more than half the last step saturate at ±max.
  if (spec_.scale == Fp8Scale::PerToken) return 0;
  const MinifloatSpec s = fp8_minifloat(spec_.e5m2);
  const float max = minifloat_max(s);
  const float rounds_to_max = max + (max - minifloat_magnitude(s.max_code - 1, s)) / 2;
  const ScaleDivisor scale = scale_divisor(span_scale(x));
  int64_t clipped = 0;
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c) clipped += absf(divide(x.row(r)[c], scale)) > rounds_to_max;
  return clipped;
}

std::string Fp8Format::code_layout() const {
  const std::string fp8 = spec_.e5m2 ? "OCP E5M2" : "OCP E4M3";
  switch (spec_.scale) {
    case Fp8Scale::Static: return "one " + fp8 + " byte per element, row-major (the static scale is not stored)";
    case Fp8Scale::Calibrated:
      return "fp32 span scale (little-endian), then one " + fp8 + " byte per element, row-major";
    case Fp8Scale::PerToken: return "per row: fp32 scale (little-endian), then head_dim " + fp8 + " bytes";
  }
  return {};
}

FormatPtr parse_fp8_format(std::string_view name) {
  NameParts parts(name);
  if (parts.at(0) != "fp8") return nullptr;
  const std::string where = "format '" + std::string(name) + "'";
  Fp8Spec spec;
  if (parts.at(1) == "e4m3") spec.e5m2 = false;
  else if (parts.at(1) == "e5m2") spec.e5m2 = true;
  else throw ConfigError(where + ": expected fp8-e4m3 or fp8-e5m2 (OCP FP8)");
  if (parts.size() > 3) {
    if (!parts.at(2).empty() && parts.at(2)[0] == 's')  // s1e-3: '-' separates name parts
      throw ConfigError(where + ": write the static scale as a plain decimal such as s0.001 ('-' separates the "
                        "parts of a format name, so s1e-3 cannot be read)");
    throw ConfigError(where + ": at most one scale option (-s<scale>, -cal<N> or -tok)");
  }
  if (parts.size() == 3) {
    const std::string_view opt = parts.at(2);
    if (opt == "tok") {
      spec.scale = Fp8Scale::PerToken;
    } else if (auto n = parse_int_suffix(opt, "cal")) {
      if (*n < 1) throw ConfigError(where + ": calibration tokens must be >= 1");
      spec.scale = Fp8Scale::Calibrated;
      spec.calibration_tokens = *n;
    } else if (opt.size() > 1 && opt[0] == 's') {
      const auto v = parse_name_number(opt.substr(1));
      if (!v || !(*v > 0.0f) || !(*v < 3.0e38f))
        throw ConfigError(where + ": static scale must be a positive decimal such as s0.5, got '" +
                          std::string(opt) + "'");
      spec.static_scale = *v;
    } else {
      throw ConfigError(where + ": unknown option '-" + std::string(opt) + "' (expected -s<scale>, -cal<N> or -tok)");
    }
  }
  return std::make_shared<Fp8Format>(spec);
}

}  // namespace kvb
