// Minifloat encode/decode (OCP FP8 E4M3 and E5M2, FP4 E2M1, and the E8M0 scale of the
// OCP Microscaling spec), shared by the CPU formats and their CUDA twins.
//
// Encoding rounds to nearest, ties to even, and saturates: any |x| at or above the
// largest finite value (infinities included) becomes ±max. Zero keeps its sign.
// NaN becomes the format's NaN code (E4M3 0x7f, E5M2 0x7e) and, for E2M1, which has
// none, +0 (callers never pass NaN: recordings are validated finite).
//
//  format  exp  man  bias  max      subnormal step  NaN/Inf
//  E4M3     4    3    7    448      2^-9            S.1111.111 NaN, no Inf
//  E5M2     5    2   15    57344    2^-16           IEEE-like Inf/NaN
//  E2M1     2    1    1    6        0.5             none
#pragma once
#include <cstdint>

#include "sim/core/hd_math.h"

namespace kvb {

struct MinifloatSpec {
  int exp_bits;
  int man_bits;
  int bias;
  uint8_t max_code;  // code of the largest finite positive value
  uint8_t nan_code;  // the NaN code the encoder writes; 0 when the format has no NaN
  bool ieee_specials;  // all-ones exponent is Inf (mantissa 0) / NaN (E5M2)
};

KVB_HD MinifloatSpec minifloat_e4m3() { return {4, 3, 7, 0x7e, 0x7f, false}; }
KVB_HD MinifloatSpec minifloat_e5m2() { return {5, 2, 15, 0x7b, 0x7e, true}; }
KVB_HD MinifloatSpec minifloat_e2m1() { return {2, 1, 1, 0x07, 0, false}; }

// Magnitude of a non-negative code (sign bit excluded); exact in fp32.
KVB_HD float minifloat_magnitude(uint32_t code, MinifloatSpec s) {
  const uint32_t e = code >> s.man_bits;
  const uint32_t m = code & ((1u << s.man_bits) - 1u);
  if (e == 0) return mul_rn(static_cast<float>(m), pow2f(1 - s.bias - s.man_bits));
  return mul_rn(static_cast<float>((1u << s.man_bits) + m), pow2f(static_cast<int>(e) - s.bias - s.man_bits));
}

KVB_HD float minifloat_max(MinifloatSpec s) { return minifloat_magnitude(s.max_code, s); }

KVB_HD float minifloat_decode(uint8_t code, MinifloatSpec s) {
  const uint32_t sign_bit = 1u << (s.exp_bits + s.man_bits);
  const uint32_t mag = code & (sign_bit - 1u);
  const uint32_t exp_ones = ((1u << s.exp_bits) - 1u) << s.man_bits;
  float v;
  if (s.ieee_specials && (mag & exp_ones) == exp_ones) {  // never produced by the encoder
    v = bits_float((mag & ~exp_ones) ? 0x7fc00000u : 0x7f800000u);
  } else if (!s.ieee_specials && s.nan_code && mag == s.nan_code) {
    v = bits_float(0x7fc00000u);
  } else {
    v = minifloat_magnitude(mag, s);
  }
  return (code & sign_bit) ? -v : v;
}

// x rounded to the nearest value of the format, in the fp32 domain (the quantize-
// dequantize hot path; minifloat_encode follows the same steps): normal values keep
// man_bits mantissa bits, rounded to nearest even on the bit pattern (the carry may bump
// the exponent); values below the smallest normal are rounded to a multiple of the
// subnormal step by adding and subtracting a power of two (exact RNE); then saturation.
// Bit-identical to a nearest-even search over the codes (tests/formats/test_minifloat_formats.cpp).
KVB_HD float minifloat_round(float x, MinifloatSpec s) {
  const uint32_t sign = float_bits(x) & 0x80000000u;
  const float a = absf(x);
  if (a != a) return s.nan_code ? bits_float(0x7fc00000u) : 0.0f;
  const float max = minifloat_max(s);
  const int emin = 1 - s.bias;
  float r;
  if (a >= max) {
    r = max;
  } else if (a < pow2f(emin)) {
    const float c = pow2f(emin - s.man_bits + 23);
    r = add_rn(add_rn(a, c), -c);
  } else {
    const int shift = 23 - s.man_bits;
    uint32_t u = float_bits(a);
    u += ((1u << (shift - 1)) - 1u) + ((u >> shift) & 1u);
    r = bits_float(u & ~((1u << shift) - 1u));
    r = r > max ? max : r;
  }
  return bits_float(float_bits(r) | sign);
}

// The code of r, a value the format holds exactly (what minifloat_round returns): the
// sign, then for a normal r its exponent rebiased and its top man_bits mantissa bits,
// for a subnormal r (or zero) its count of subnormal steps, exact in fp32. NaN gives
// the NaN code without a sign (0 for E2M1, whose minifloat_round returns +0 for NaN).
KVB_HD uint8_t minifloat_code(float r, MinifloatSpec s) {
  const uint32_t u = float_bits(r);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return s.nan_code;
  const uint32_t sign = (u >> 31) << (s.exp_bits + s.man_bits);
  const int e = static_cast<int>(a >> 23) - 127;
  const int emin = 1 - s.bias;  // exponent of the smallest normal
  uint32_t mag;
  if (e >= emin)
    mag = (static_cast<uint32_t>(e + s.bias) << s.man_bits) | ((a >> (23 - s.man_bits)) & ((1u << s.man_bits) - 1u));
  else
    mag = static_cast<uint32_t>(mul_rn(bits_float(a), pow2f(s.man_bits - emin)));
  return static_cast<uint8_t>(sign | mag);
}

// Encoding: minifloat_code(minifloat_round(x)) in one pass over the bits of |x|, the
// quantizers' hot path (a GPU twin spends most of its instructions here). The three
// cases of minifloat_round, each reading the code off directly:
//  - |x| >= max (infinities too): the code of max;
//  - |x| below the smallest normal: |x| + c with c = 2^(emin - man_bits + 23) rounds
//    |x| to a multiple of the subnormal step (the ulp of c's binade) exactly as
//    minifloat_round does, and the bits of that sum minus those of c count the steps:
//    the code (2^man_bits, the smallest normal's code, when it rounds up to it);
//  - normal: the bit pattern rounded to man_bits mantissa bits (nearest even, the
//    carry may bump the exponent), shifted down and rebiased: exponent and mantissa
//    fields of the code at once.
// NaN gives the NaN code (0 for E2M1), as minifloat_code(minifloat_round(NaN)) does.
// tests/formats/test_minifloat_formats.cpp checks it against a brute-force nearest-even
// search over every code, and against minifloat_code(minifloat_round(x)).
KVB_HD uint8_t minifloat_encode(float x, MinifloatSpec s) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return s.nan_code;
  const uint32_t sign = (u >> 31) << (s.exp_bits + s.man_bits);
  const int emin = 1 - s.bias;
  uint32_t mag;
  if (bits_float(a) >= minifloat_max(s)) {
    mag = s.max_code;
  } else if (a < static_cast<uint32_t>(emin + 127) << 23) {
    const float c = pow2f(emin - s.man_bits + 23);
    mag = float_bits(add_rn(bits_float(a), c)) - float_bits(c);
  } else {
    const int shift = 23 - s.man_bits;
    const uint32_t rounded = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
    mag = (rounded >> shift) - (static_cast<uint32_t>(127 - s.bias) << s.man_bits);
    mag = mag > s.max_code ? s.max_code : mag;
  }
  return static_cast<uint8_t>(sign | mag);
}

// E8M0 (OCP MX shared scale): 2^(e - 127) for e in 0..254; 255 is NaN.
KVB_HD float e8m0_decode(uint8_t e) { return e == 255 ? bits_float(0x7fc00000u) : pow2f(static_cast<int>(e) - 127); }

// The MX shared exponent of a block with absolute maximum amax (OCP MX v1.0 §6.3):
// floor(log2(amax)) - emax_elem, clamped to E8M0's range [-127, 127]; amax = 0 gives
// -127 (every element is then 0 anyway). Returns the biased E8M0 code.
KVB_HD uint8_t mx_shared_exponent(float amax, int emax_elem) {
  int e = amax > 0.0f ? floor_log2f(amax) - emax_elem : -127;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return static_cast<uint8_t>(e + 127);
}

}  // namespace kvb
