// Vectorised fp32 arithmetic for one attention row: the fast CPU path of the
// attention-error measurement (sim/attention_error_fast.cpp). Host only.
//
// Everything works on 16-lane blocks (GCC/Clang vector extensions: one AVX-512
// register, two AVX2 registers, four SSE ones: the compiler picks), with a fixed lane
// order, so every sum here is the same for any thread count and any allocation
// alignment. Sums that need more than fp32 accumulate per lane in fp64.
// A tail shorter than 16 lanes is loaded into a vector padded with a neutral value.
#pragma once
#include <cstdint>
#include <cstring>

namespace kvb::simd {

inline constexpr int64_t kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef double f64x16 __attribute__((vector_size(128)));

inline f32x16 splat(float c) { return f32x16{} + c; }
inline f64x16 splat64(double c) { return f64x16{} + c; }

// Lanes [0, count) from p, the rest `pad` (count in 0..16).
inline f32x16 load(const float* p, int64_t count = kLanes, float pad = 0.0f) {
  f32x16 v;
  if (count >= kLanes) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  v = splat(pad);
  std::memcpy(&v, p, static_cast<size_t>(count) * sizeof(float));
  return v;
}
inline void store(float* p, f32x16 v, int64_t count = kLanes) {
  std::memcpy(p, &v, static_cast<size_t>(count < kLanes ? count : kLanes) * sizeof(float));
}
inline f64x16 widen(f32x16 v) { return __builtin_convertvector(v, f64x16); }

inline f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
inline f32x16 vmin(f32x16 a, f32x16 b) { return a < b ? a : b; }
inline f32x16 vabs(f32x16 a) { return a < 0.0f ? -a : a; }

// Lane sums and maxima, lane 0 first (a fixed order).
inline double hsum(const f64x16& v) {
  double s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}
inline float hmax(f32x16 v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
inline bool any(i32x16 m) {
  int32_t a = 0;
  for (int i = 0; i < kLanes; ++i) a |= m[i];
  return a != 0;
}

// e^x for every lane, within 2 ulp of the correctly rounded value for
// x in [-87.3, 88.7]; 0 below (where fp32 has no normal result), +Inf above. Cody-Waite
// range reduction x = n ln 2 + r, |r| <= ln2 / 2, and a degree-7 polynomial for e^r.
inline f32x16 exp(f32x16 x) {
  const f32x16 lo = splat(-87.3365f), hi = splat(88.7228f);
  const i32x16 under = x < lo, over = x > hi;
  const f32x16 xc = vmin(vmax(x, lo), hi);
  const f32x16 magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  const f32x16 n = (xc * 1.44269504088896341f + magic) - magic;
  const f32x16 r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  f32x16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  // 2^n by building the exponent field; n in [-126, 128] after clamping: split the
  // scaling in two so that 2^128 and 2^-126·(tiny p) stay representable.
  const i32x16 ni = __builtin_convertvector(n, i32x16);
  const i32x16 half = ni >> 1;
  const f32x16 s1 = (f32x16)((half + 127) << 23), s2 = (f32x16)((ni - half + 127) << 23);
  f32x16 e = (p * s1) * s2;
  e = under ? splat(0.0f) : e;
  return over ? splat(__builtin_huge_valf()) : e;
}

// φ(x) = e^x - 1 - x, accurate relative to φ itself for every x (no cancellation near
// 0, where φ(x) ≈ x²/2): a Taylor polynomial for |x| < 1 (the first omitted term is
// below 1e-7 of φ there), e^x - 1 - x beyond. e^x is evaluated only when some lane
// needs it (logit errors are mostly below 1: the polynomial alone), the same values.
inline f32x16 expm1_minus_x(f32x16 x) {
  f32x16 t = splat(1.0f / 3628800.0f);  // 1/10!
  t = t * x + 1.0f / 362880.0f;
  t = t * x + 1.0f / 40320.0f;
  t = t * x + 1.0f / 5040.0f;
  t = t * x + 1.0f / 720.0f;
  t = t * x + 1.0f / 120.0f;
  t = t * x + 1.0f / 24.0f;
  t = t * x + 1.0f / 6.0f;
  t = t * x + 0.5f;
  const f32x16 taylor = t * x * x;
  const i32x16 small = vabs(x) < 1.0f;
  if (!any(~small)) return taylor;
  const f32x16 direct = (exp(x) - 1.0f) - x;
  return small ? taylor : direct;
}

}  // namespace kvb::simd
