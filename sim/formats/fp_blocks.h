// Per-block arithmetic of the scaled minifloat formats (fp8 with a scale, MXFP4, NVFP4),
// shared by the CPU formats (fp8_format.cpp, fp4_format.cpp) and their CUDA twins.
// Element encoding is minifloat.h's (round to nearest even, saturating).
#pragma once
#include <cstdint>

#include "sim/core/minifloat.h"

namespace kvb {

// ---------------------------------------------------------------- fp8 with a scale
KVB_HD MinifloatSpec fp8_minifloat(bool e5m2) { return e5m2 ? minifloat_e5m2() : minifloat_e4m3(); }

// A calibrated scale maps the calibration absmax to the format's max; all-zero
// calibration data gives scale 1, and so does data so small that the quotient
// underflows to 0 (its values then round to zeros instead of x / 0).
KVB_HD float fp8_scale_from_absmax(float amax, MinifloatSpec s) {
  const float scale = div_rn(amax, minifloat_max(s));
  return scale > 0.0f ? scale : 1.0f;
}
// Elements are encoded as x / scale (scale_divisor(scale) made once per row or span).
KVB_HD uint8_t fp8_encode_scaled(float x, ScaleDivisor scale, MinifloatSpec s) {
  return minifloat_encode(divide(x, scale), s);
}
KVB_HD float fp8_decode_scaled(uint8_t code, float scale, MinifloatSpec s) {
  return mul_rn(minifloat_decode(code, s), scale);
}
// fp8_decode_scaled(fp8_encode_scaled(x)) without materialising the code.
KVB_HD float fp8_roundtrip_scaled(float x, ScaleDivisor scale, MinifloatSpec s) {
  return mul_rn(minifloat_round(divide(x, scale), s), scale.scale);
}

// ---------------------------------------------------------------- MXFP4 (OCP MX v1.0)
// 32 E2M1 elements sharing an E8M0 scale X = 2^(floor(log2 amax) - 2): 4.25 bits/element.
inline constexpr int kMxfp4Block = 32;

// Quantizes one block: e is the E8M0 code, codes[j] the 4-bit E2M1 code of x[j].
KVB_HD void mxfp4_quantize_block(const float* x, uint8_t& e, uint8_t* codes) {
  float amax = 0.0f;
  for (int j = 0; j < kMxfp4Block; ++j) amax = amax < absf(x[j]) ? absf(x[j]) : amax;
  e = mx_shared_exponent(amax, 2);  // E2M1's largest normal is 1.5 * 2^2
  const float inv = pow2f(127 - static_cast<int>(e));  // 1/X, exact
  for (int j = 0; j < kMxfp4Block; ++j) codes[j] = minifloat_encode(mul_rn(x[j], inv), minifloat_e2m1());
}
// mxfp4_dequantize_block(mxfp4_quantize_block(x)) without materialising codes.
KVB_HD void mxfp4_roundtrip_block(const float* x, float* y) {
  float amax = 0.0f;
  for (int j = 0; j < kMxfp4Block; ++j) amax = amax < absf(x[j]) ? absf(x[j]) : amax;
  const uint8_t e = mx_shared_exponent(amax, 2);
  const float inv = pow2f(127 - static_cast<int>(e)), X = e8m0_decode(e);
  for (int j = 0; j < kMxfp4Block; ++j) y[j] = mul_rn(minifloat_round(mul_rn(x[j], inv), minifloat_e2m1()), X);
}
KVB_HD void mxfp4_dequantize_block(uint8_t e, const uint8_t* codes, float* y) {
  const float X = e8m0_decode(e);
  for (int j = 0; j < kMxfp4Block; ++j) y[j] = mul_rn(minifloat_decode(codes[j], minifloat_e2m1()), X);
}

// ---------------------------------------------------------------- NVFP4
// 16 E2M1 elements sharing an E4M3 scale, times one fp32 scale per tensor (here: per
// span). The tensor scale g = amax(span) / (6 * 448) lets every block scale
// amax(block) / (6 g) fit E4M3's range; an all-zero span gets g = 1, and so does a span
// so small (amax <= 1344 · 2^-149) that g rounds to 0 (its blocks then decode to zeros
// instead of 0/0 = NaN).
inline constexpr int kNvfp4Block = 16;

KVB_HD float nvfp4_tensor_scale(float span_amax) {
  const float g = div_rn(span_amax, 2688.0f);
  return g > 0.0f ? g : 1.0f;
}

// Quantizes one block with tensor scale g: s is the E4M3 code of the block scale.
KVB_HD void nvfp4_quantize_block(const float* x, float g, uint8_t& s, uint8_t* codes) {
  float amax = 0.0f;
  for (int j = 0; j < kNvfp4Block; ++j) amax = amax < absf(x[j]) ? absf(x[j]) : amax;
  s = minifloat_encode(div_rn(div_rn(amax, 6.0f), g), minifloat_e4m3());
  const float eff = mul_rn(minifloat_decode(s, minifloat_e4m3()), g);
  for (int j = 0; j < kNvfp4Block; ++j)
    codes[j] = minifloat_encode(eff > 0.0f ? div_rn(x[j], eff) : 0.0f, minifloat_e2m1());
}
// nvfp4_dequantize_block(nvfp4_quantize_block(x)) without materialising codes.
KVB_HD void nvfp4_roundtrip_block(const float* x, float g, float* y) {
  float amax = 0.0f;
  for (int j = 0; j < kNvfp4Block; ++j) amax = amax < absf(x[j]) ? absf(x[j]) : amax;
  const float eff = mul_rn(minifloat_round(div_rn(div_rn(amax, 6.0f), g), minifloat_e4m3()), g);
  for (int j = 0; j < kNvfp4Block; ++j)
    y[j] = mul_rn(minifloat_round(eff > 0.0f ? div_rn(x[j], eff) : 0.0f, minifloat_e2m1()), eff);
}
KVB_HD void nvfp4_dequantize_block(uint8_t s, float g, const uint8_t* codes, float* y) {
  const float eff = mul_rn(minifloat_decode(s, minifloat_e4m3()), g);
  for (int j = 0; j < kNvfp4Block; ++j) y[j] = mul_rn(minifloat_decode(codes[j], minifloat_e2m1()), eff);
}

}  // namespace kvb
