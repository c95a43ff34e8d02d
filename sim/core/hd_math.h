// Correctly rounded scalar helpers that behave identically on host and device.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "sim/core/hd.h"

namespace kvb {

// a*b rounded once, never fused with a following add.
KVB_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // host code is built with -ffp-contract=off
#endif
}

KVB_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KVB_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Division by a scale that many values share, correctly rounded. A normal power-of-two
// scale has an exact reciprocal, and x * (1/scale) rounds the same real number as
// x / scale, so the product (far cheaper on a GPU) is bit-identical; other scales divide.
struct ScaleDivisor {
  float scale;
  float inverse;  // 1 / scale when exact, else 0
};

KVB_HD ScaleDivisor scale_divisor(float scale) {
  uint32_t u;
  memcpy(&u, &scale, sizeof u);
  const uint32_t biased_exponent = (u >> 23) & 0xffu;
  const bool power_of_two = (u & 0x7fffffu) == 0 && biased_exponent >= 1 && biased_exponent <= 254;
  return {scale, power_of_two ? div_rn(1.0f, scale) : 0.0f};
}

KVB_HD float divide(float x, ScaleDivisor d) { return d.inverse != 0.0f ? mul_rn(x, d.inverse) : div_rn(x, d.scale); }

// Round to nearest integer, ties to even (IEEE default mode on both sides).
KVB_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);  // default rounding mode: to nearest, ties to even
#endif
}

KVB_HD float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

KVB_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

KVB_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// |x| by clearing the sign bit (exact, -0 -> +0).
KVB_HD float absf(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }

// 2^k as an fp32, exact for k in [-149, 127] (subnormal below -126).
KVB_HD float pow2f(int k) {
  if (k >= -126) return bits_float(static_cast<uint32_t>(k + 127) << 23);
  return bits_float(1u << (k + 149));
}

// floor(log2(a)) for a finite a > 0, exact (fp32 subnormals included).
KVB_HD int floor_log2f(float a) {
  const uint32_t u = float_bits(a) & 0x7fffffffu;
  const int e = static_cast<int>(u >> 23);
  if (e != 0) return e - 127;
  int k = -127;  // subnormal: the highest set mantissa bit gives the exponent
  for (uint32_t m = u & 0x7fffffu; (m & 0x400000u) == 0; m <<= 1) --k;
  return k;
}

}  // namespace kvb
