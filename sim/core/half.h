// IEEE binary16 (fp16) and bfloat16 conversions, round-to-nearest-even, host and device.
//
// These are the storage rules for every fp16 / bf16 scale, zero point and kept value in
// the simulator (sim/core/store_dtype.h), so that "fp16 metadata" means exactly what
// hardware would store. They
// match F16C's _cvtss_sh(x, 0) and CUDA's __float2half_rn bit for bit, including
// subnormals, overflow to infinity and NaN.
#pragma once
#include <cstddef>
#include <cstdint>
#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#include "sim/core/hd_math.h"

namespace kvb {

KVB_HD uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // Inf or NaN (NaN stays quiet NaN)
    return static_cast<uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (absx >= 0x477ff000u) {  // >= 65520 rounds to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (absx < 0x38800000u) {  // below 2^-14: half subnormal (or zero), m * 2^-24
    const float scaled = mul_rn(bits_float(absx), 16777216.0f);  // exact: power of two
    const uint32_t m = static_cast<uint32_t>(round_even(scaled));  // m == 1024 -> min normal
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  const uint32_t rounded = absx + 0xc8000fffu + ((absx >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

KVB_HD float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = mul_rn(static_cast<float>(mant), 5.9604644775390625e-08f);
    return sign ? -v : v;
  }
  if (exp == 31) {
    return bits_float(sign | 0x7f800000u | (mant << 13));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

KVB_HD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

KVB_HD float bf16_bits_to_f32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Bulk widening of n stored values into fp32 (host only: the forward pass converts a
// weight tile per product). Each out[i] equals f16_bits_to_f32 / bf16_bits_to_f32 of
// in[i] bit for bit (tests/core/test_half.cpp checks all 65536 patterns, at every
// offset into a group of eight).
//
// The portable fp16 loop, written without branches so that the compiler can vectorize
// it (the per-value function's subnormal branch kept fp16 decoding scalar: 79 % of a
// decoding step's time): the plain version f16_to_f32_n is tested against.
inline void f16_to_f32_n_portable(const uint16_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = in[i];
    const uint32_t magnitude = (h & 0x7fffu) << 13;  // exponent and mantissa in fp32's place
    const uint32_t exponent = magnitude & 0x0f800000u;
    // Rebias 15 -> 127; Inf/NaN (exponent 31) go to 255.
    const uint32_t normal = magnitude + (exponent == 0x0f800000u ? 0x70000000u : 0x38000000u);
    // Zero and subnormals: mant * 2^-24 = (2^-14 + mant * 2^-24) - 2^-14, exact.
    const float subnormal = bits_float(magnitude + 0x38800000u) - 6.103515625e-05f;
    const uint32_t value = exponent == 0 ? float_bits(subnormal) : normal;
    out[i] = bits_float(value | ((h & 0x8000u) << 16));
  }
}
// With F16C, eight at a time by the hardware's exact conversion: GCC does not vectorize
// the portable loop for AVX2, where it ran at about 2 ns a value (a decoding step
// widens every weight). The hardware quiets a signalling NaN, so a group of eight
// holding a NaN takes the portable loop (a checkpoint's weights are finite, checked at
// load). Code nvcc compiles takes the portable loop throughout: the same bits.
inline void f16_to_f32_n(const uint16_t* in, size_t n, float* out) {
  size_t i = 0;
#if defined(__F16C__) && !defined(__CUDACC__)
  const __m128i magnitude_mask = _mm_set1_epi16(0x7fff), infinity = _mm_set1_epi16(0x7c00);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, magnitude_mask), infinity);  // |h| > Inf as int16
    if (_mm_testz_si128(nan, nan)) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    } else {
      f16_to_f32_n_portable(in + i, 8, out + i);
    }
  }
#endif
  f16_to_f32_n_portable(in + i, n - i, out + i);
}
inline void bf16_to_f32_n(const uint16_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = bits_float(static_cast<uint32_t>(in[i]) << 16);
}

// Round-trip helpers: the value a float becomes once stored at that precision.
KVB_HD float round_to_f16(float f) { return f16_bits_to_f32(f32_to_f16_bits(f)); }
KVB_HD float round_to_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

}  // namespace kvb
