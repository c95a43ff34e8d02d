// Vectorised fp32 arithmetic for one attention row: the fast CPU path of the
// attention-error measurement (sim/attention_error_fast.cpp). Host only.
//
// Everything works on blocks of kLanes floats, one native register: 16 lanes with
// AVX-512, 8 otherwise (one AVX2 register, two SSE ones). GCC/Clang vector extensions
// wider than the target's registers are split into pieces that spill through the stack:
// on AVX2, 16-lane blocks ran the row loop 1.6x slower than 8-lane ones.
// Lanes are in a fixed order, so every sum here is the same for any thread count and any
// allocation alignment; it may differ in the last bits between a CPU with AVX-512 and one
// without (as Eigen's GEMM kernels do). Sums that need more than fp32 accumulate per lane
// in fp64. A tail shorter than kLanes is loaded into a vector padded with a neutral value.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

// Without AVX the 8-lane vectors are wider than a register: GCC notes that passing them
// by value would use another ABI than an AVX build's. Everything here is inline, within
// one build. (A warning raised where the functions are called: it stays off for the
// includer.)
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvb::simd {

#if defined(__AVX512F__)
inline constexpr int64_t kLanes = 16;
#else
inline constexpr int64_t kLanes = 8;
#endif
typedef float f32v __attribute__((vector_size(kLanes * 4)));
typedef int32_t i32v __attribute__((vector_size(kLanes * 4)));

// kLanes doubles (per-lane fp64 sums), as two registers of kLanes / 2: one vector of
// kLanes doubles is wider than a register, and GCC lowered it through the stack.
typedef double f64h __attribute__((vector_size(kLanes * 4)));
struct f64v {
  f64h lo{}, hi{};  // lanes [0, kLanes / 2) and [kLanes / 2, kLanes)
};
typedef int64_t i64h __attribute__((vector_size(kLanes * 4)));  // f64h's lanes as integers
inline f64v operator+(f64v a, f64v b) { return {a.lo + b.lo, a.hi + b.hi}; }
inline f64v operator*(f64v a, f64v b) { return {a.lo * b.lo, a.hi * b.hi}; }
inline f64v& operator+=(f64v& a, f64v b) { return a = a + b; }

inline f32v splat(float c) { return f32v{} + c; }

// Lane i holds i (masks for tails).
inline i32v lane_index() {
  i32v v;
  for (int i = 0; i < kLanes; ++i) v[i] = i;
  return v;
}

// Lanes [0, count) from p, the rest `pad` (count in 0..kLanes). Only lanes below count
// are read: a tail never reads past the end of its array.
inline f32v load(const float* p, int64_t count = kLanes, float pad = 0.0f) {
  f32v v;
  if (count >= kLanes) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  const i32v in = lane_index() < static_cast<int32_t>(count);
#if defined(__AVX512F__)
  const __mmask16 m = _mm512_cmplt_epi32_mask((__m512i)lane_index(), _mm512_set1_epi32(static_cast<int32_t>(count)));
  v = (f32v)_mm512_mask_loadu_ps((__m512)splat(pad), m, p);
  (void)in;
#elif defined(__AVX__)
  v = (f32v)_mm256_maskload_ps(p, (__m256i)in);
  v = in ? v : splat(pad);
#else
  v = splat(pad);
  std::memcpy(&v, p, static_cast<size_t>(count) * sizeof(float));
  (void)in;
#endif
  return v;
}
inline void store(float* p, f32v v, int64_t count = kLanes) {
  if (count >= kLanes) {
    std::memcpy(p, &v, sizeof(v));
    return;
  }
#if defined(__AVX512F__)
  const __mmask16 m = _mm512_cmplt_epi32_mask((__m512i)lane_index(), _mm512_set1_epi32(static_cast<int32_t>(count)));
  _mm512_mask_storeu_ps(p, m, (__m512)v);
#elif defined(__AVX__)
  _mm256_maskstore_ps(p, (__m256i)(lane_index() < static_cast<int32_t>(count)), (__m256)v);
#else
  std::memcpy(p, &v, static_cast<size_t>(count) * sizeof(float));
#endif
}
inline f64v widen(f32v v) {
#if defined(__AVX512F__)
  return {(f64h)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)v)),
          (f64h)_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)v), 1)))};
#elif defined(__AVX__)
  return {(f64h)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)v)),
          (f64h)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)v, 1))};
#else
  typedef float f32h __attribute__((vector_size(kLanes * 2)));
  f32h lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  return {__builtin_convertvector(lo, f64h), __builtin_convertvector(hi, f64h)};
#endif
}

inline f32v vmax(f32v a, f32v b) { return a > b ? a : b; }
inline f32v vmin(f32v a, f32v b) { return a < b ? a : b; }
inline f32v vabs(f32v a) { return a < 0.0f ? -a : a; }

// a·b + c rounded once per lane (fmaf's value: the scalar twins in
// sim/metrics/attention_shift.h call fmaf, so both agree bit for bit).
inline f32v fma(f32v a, f32v b, f32v c) {
#if defined(__AVX512F__)
  return (f32v)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (f32v)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  f32v r;
  for (int i = 0; i < kLanes; ++i) r[i] = std::fmaf(a[i], b[i], c[i]);
  return r;
#endif
}
inline f32v fma(f32v a, f32v b, float c) { return fma(a, b, splat(c)); }

// Lane sums and maxima, lane 0 first (a fixed order).
inline double hsum(const f64v& v) {
  double s = 0;
  for (int i = 0; i < kLanes / 2; ++i) s += v.lo[i];
  for (int i = 0; i < kLanes / 2; ++i) s += v.hi[i];
  return s;
}
inline float hmax(f32v v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
// Bit i set where lane i of a comparison's mask is set.
inline uint32_t mask_bits(i32v m) {
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask((__m512i)m, (__m512i)m);
#elif defined(__AVX__)
  return static_cast<uint32_t>(_mm256_movemask_ps((__m256)m));
#else
  uint32_t bits = 0;
  for (int i = 0; i < kLanes; ++i) bits |= (m[i] != 0 ? 1u : 0u) << i;
  return bits;
#endif
}
// Whether any lane of a comparison's mask is set.
inline bool any(i32v m) { return mask_bits(m) != 0; }

// e^x for every lane, within 2 ulp of the correctly rounded value for
// x in [-87.3, 88.7]; 0 below (where fp32 has no normal result), +Inf above. Cody-Waite
// range reduction x = n ln 2 + r, |r| <= ln2 / 2, and a degree-7 polynomial for e^r.
// The same operations as attn_exp_f32 (sim/metrics/attention_shift.h).
inline f32v exp(f32v x) {
  const f32v lo = splat(-87.3365f), hi = splat(88.7228f);
  const i32v under = x < lo, over = x > hi;
  const f32v xc = vmin(vmax(x, lo), hi);
  const f32v magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  const f32v n = fma(xc, splat(1.44269504088896341f), magic) - magic;
  const f32v r = fma(n, splat(2.12194440e-4f), fma(n, splat(-0.693359375f), xc));
  f32v p = splat(1.9875691500e-4f);
  p = fma(p, r, 1.3981999507e-3f);
  p = fma(p, r, 8.3334519073e-3f);
  p = fma(p, r, 4.1665795894e-2f);
  p = fma(p, r, 1.6666665459e-1f);
  p = fma(p, r, 5.0000001201e-1f);
  p = fma(p * r, r, r) + 1.0f;
  // 2^n by building the exponent field; n in [-126, 128] after clamping: split the
  // scaling in two so that 2^128 and 2^-126·(tiny p) stay representable.
  const i32v ni = __builtin_convertvector(n, i32v);
  const i32v half = ni >> 1;
  const f32v s1 = (f32v)((half + 127) << 23), s2 = (f32v)((ni - half + 127) << 23);
  f32v e = (p * s1) * s2;
  e = under ? splat(0.0f) : e;
  return over ? splat(__builtin_huge_valf()) : e;
}

// φ(x) = e^x - 1 - x, accurate relative to φ itself for every x (no cancellation near
// 0, where φ(x) ≈ x²/2): a Taylor polynomial for |x| < 1 (the first omitted term is
// below 1e-7 of φ there), e^x - 1 - x beyond. e^x is evaluated only when some lane
// needs it (logit errors are mostly below 1: the polynomial alone), the same values.
// The same operations as attn_expm1_minus_x (sim/metrics/attention_shift.h).
inline f32v expm1_minus_x(f32v x) {
  f32v t = splat(1.0f / 3628800.0f);  // 1/10!
  t = fma(t, x, 1.0f / 362880.0f);
  t = fma(t, x, 1.0f / 40320.0f);
  t = fma(t, x, 1.0f / 5040.0f);
  t = fma(t, x, 1.0f / 720.0f);
  t = fma(t, x, 1.0f / 120.0f);
  t = fma(t, x, 1.0f / 24.0f);
  t = fma(t, x, 1.0f / 6.0f);
  t = fma(t, x, 0.5f);
  const f32v taylor = t * x * x;
  const i32v small = vabs(x) < 1.0f;
  if (!any(~small)) return taylor;
  const f32v direct = (exp(x) - 1.0f) - x;
  return small ? taylor : direct;
}

inline f64h splat64(double c) { return f64h{} + c; }

// a·b + c, rounded once per lane where the CPU fuses (std::fma's value), twice where it
// does not: fp64 std::fma in software costs more than the whole e^x it serves. Only
// simd::exp uses it, whose accuracy bound holds either way (test_attention_shift).
inline f64h fma(f64h a, f64h b, f64h c) {
#if defined(__AVX512F__)
  return (f64h)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#elif defined(__FMA__)
  return (f64h)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#else
  return a * b + c;
#endif
}
inline f64h fma(f64h a, f64h b, double c) { return fma(a, b, splat64(c)); }

// e^x for every lane in fp64, within 1 ulp of the correctly rounded value (std::exp's
// accuracy; tests/metrics/test_attention_shift.cpp measures it against std::exp): 0 below
// about -745.13 (subnormal results on the way), +Inf above about 709.78, NaN for NaN.
// For the long fp64 sums over a vocabulary's logits (sim/metrics/model_metrics.cpp).
// Range reduction x = n ln 2 + r, |r| <= ln 2 / 2 (ln 2 in two parts, fdlibm's), the
// Taylor polynomial of e^r to degree 13 (the first omitted term is below 5e-18 of e^r),
// and 2^n built in the exponent field in two halves, so that 2^1024 and the
// subnormal 2^-1075 · e^r come out of two exact or once-rounded products.
inline f64h exp(f64h x) {
  const f64h lo = splat64(-746.0), hi = splat64(710.0);
  const f64h xc = x < lo ? lo : (x > hi ? hi : x);  // NaN stays NaN (both compare false)
  const f64h magic = splat64(6755399441055744.0);  // 1.5·2^52: adding it rounds to an integer
  const f64h t = fma(xc, splat64(1.4426950408889634), magic);
  const f64h n = t - magic;
  const i64h ni = (i64h)t - (i64h)magic;  // n as an integer: t's low mantissa bits
  f64h r = fma(-n, splat64(6.93147180369123816490e-01), xc);
  r = fma(-n, splat64(1.90821492927058770002e-10), r);
  f64h p = splat64(1.0 / 6227020800.0);  // 1/13!
  constexpr double kInvFactorial[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                      1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,
                                      1.0 / 24.0,        1.0 / 6.0,        0.5};  // 1/12! .. 1/2!
  for (double c : kInvFactorial) p = fma(p, r, c);
  p = fma(p * r, r, r) + 1.0;  // 1 + r + r²·(1/2! + r/3! + ...)
  const i64h half = ni >> 1;
  const f64h s1 = (f64h)((half + 1023) << 52), s2 = (f64h)((ni - half + 1023) << 52);
  f64h e = (p * s1) * s2;
  e = x > splat64(709.782712893384) ? splat64(__builtin_huge_val()) : e;
  return x != x ? x : e;
}

}  // namespace kvb::simd
