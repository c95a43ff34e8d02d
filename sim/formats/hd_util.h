// Exact scalar helpers for the per-element format arithmetic shared by the CPU
// formats and their CUDA twins (KVB_HD: no std:: containers, exceptions or virtuals).
#pragma once
#include <cstdint>

#include "sim/core/hd_math.h"

namespace kvb {

// v[i] of a 16-entry table, i in [0, 16), as a select tree on the bits of i: only
// constant indices, so a constant table never lives in memory.
template <class T>
KVB_HD T table16_select(const T (&v)[16], int i) {
  const bool b0 = (i & 1) != 0, b1 = (i & 2) != 0, b2 = (i & 4) != 0, b3 = (i & 8) != 0;
  const T p0 = b0 ? v[1] : v[0], p1 = b0 ? v[3] : v[2], p2 = b0 ? v[5] : v[4], p3 = b0 ? v[7] : v[6];
  const T p4 = b0 ? v[9] : v[8], p5 = b0 ? v[11] : v[10], p6 = b0 ? v[13] : v[12], p7 = b0 ? v[15] : v[14];
  const T q0 = b1 ? p1 : p0, q1 = b1 ? p3 : p2, q2 = b1 ? p5 : p4, q3 = b1 ? p7 : p6;
  const T r0 = b2 ? q1 : q0, r1 = b2 ? q3 : q2;
  return b3 ? r1 : r0;
}

// Byte s (s in [0, 8)) of the eight bytes of x then y (x's least significant first):
// one byte permute (__byte_perm) on the device, shifts on the host.
KVB_HD uint32_t select_byte8(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s) & 0xffu;
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(y) << 32) | x) >> (8 * s)) & 0xffu;
#endif
}

// v[i] of a 16-entry table of bytes (ggml's iq4_nl grid), i in [0, 16): the table
// packed into four words (constants for a constant table), a byte selection from
// each half and a select on bit 3 of i: three operations where table16_select takes 15.
template <class T>
KVB_HD T table16_bytes(const T (&v)[16], int i) {
  static_assert(sizeof(T) == 1, "a table of bytes");
  uint32_t w[4];
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<uint32_t>(static_cast<uint8_t>(v[4 * k])) |
           (static_cast<uint32_t>(static_cast<uint8_t>(v[4 * k + 1])) << 8) |
           (static_cast<uint32_t>(static_cast<uint8_t>(v[4 * k + 2])) << 16) |
           (static_cast<uint32_t>(static_cast<uint8_t>(v[4 * k + 3])) << 24);
  const uint32_t s = static_cast<uint32_t>(i) & 7u;
  const uint32_t byte = (i & 8) != 0 ? select_byte8(w[2], w[3], s) : select_byte8(w[0], w[1], s);
  return static_cast<T>(static_cast<uint8_t>(byte));
}

// v[i] of a small constant table (NF4's values, ggml's iq4_nl grid), i in [0, 16): an
// indexed load on the host; table16_bytes (tables of bytes) or table16_select on the
// device, where CUDA would copy a dynamically indexed local table to local memory at
// every call. Same values either way (tests/formats/test_codebook_formats.cpp checks
// both on the host).
template <class T>
KVB_HD T table16(const T (&v)[16], int i) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 1) return table16_bytes(v, i);
  else return table16_select(v, i);
#else
  return v[i];
#endif
}

// x86-64's default NaN (0xffc00000, the "real indefinite") for any NaN, on the host
// and on the device. SSE arithmetic returns that NaN for an invalid operation (0·∞,
// ∞ - ∞, ∞/∞) and propagates it; CUDA returns 0x7fffffff, and AArch64 0x7fc00000.
// Formats whose outputs can be NaN for finite inputs (ggml, once an fp16 scale
// overflows to ∞) pass those outputs through here, so that every host and the GPU
// store the same bits (on x86-64 hosts this changes nothing: every NaN the formats
// produce there is already the default one).
KVB_HD float x86_nan(float v) { return v != v ? bits_float(0xffc00000u) : v; }

// Correctly rounded square root.
KVB_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Round half away from zero (C's roundf), without a libm call on the host: round to
// nearest even (inlined), then move ties that went toward zero one step away. x - r
// is exact (|x| < 2^23, or x is already an integer).
KVB_HD float round_away(float x) {
#if defined(__CUDA_ARCH__)
  return roundf(x);
#else
  const float r = std::rint(x);
  const float d = x - r;
  if (d == 0.5f && x > 0.0f) return r + 1.0f;   // e.g. 2.5 -> 2 -> 3
  if (d == -0.5f && x < 0.0f) return r - 1.0f;  // e.g. -2.5 -> -2 -> -3
  return r;                                     // (-1.5 -> -2 and 1.5 -> 2 are already away)
#endif
}

// What C's float -> int8_t / uint8_t conversion yields on x86-64 (cvttss2si to 32 bits,
// then the low byte): truncation toward zero for in-range values; NaN and values
// outside the int32 range give the "integer indefinite" 0x80000000, whose low byte
// is 0. ggml's reference quantizers reach that case only when 1/d overflows (d an
// fp32 subnormal), where every code becomes 0.
KVB_HD int32_t trunc_to_i32_x86(float v) {
  if (!(v > -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
  return static_cast<int32_t>(v);
}
KVB_HD int8_t c_float_to_i8(float v) { return static_cast<int8_t>(static_cast<uint8_t>(trunc_to_i32_x86(v) & 0xff)); }
KVB_HD uint8_t c_float_to_u8(float v) { return static_cast<uint8_t>(trunc_to_i32_x86(v) & 0xff); }

}  // namespace kvb
