// The softmax perturbation of one attention row, shared by the CPU simulator
// (sim/simulator.cpp) and the CUDA row kernel (kernels/attention_rows.cu).
//
// With reference probabilities p_j and logit errors Δs_j over the causal keys j <= t:
//   p̂_j = p_j e^{Δs_j} / (1 + A),  A = Σ p_j (e^{Δs_j} - 1)
//   KL(p || p̂) = log(1 + A) - Σ p_j Δs_j
// expm1/log1p keep tiny errors exact (Δs = 0 gives exactly 0). When max |Δs| reaches
// kLargeLogitShift (attn_large_shift), p̂ is computed from the perturbed logits
// ŝ = s + Δs with their own max m̂, so nothing underflows or cancels: p_j e^{Δs_j}
// underflows when large positive Δs meet tiny p, and 1 + A cancels to 0 when the mass
// of p sits on keys whose Δs is large and negative (A ≈ −1):
//   ẑ = Σ e^{ŝ_j - m̂},  p̂_j = e^{ŝ_j - m̂} / ẑ,
//   KL = (m̂ + log ẑ) - (m + log z) - Σ p_j Δs_j
// where m and z are the reference row's max logit and Σ e^{s_j - m}.
#pragma once
#include <cmath>

#include "sim/core/hd.h"
#include "sim/core/hd_math.h"

namespace kvb {

inline constexpr double kLargeLogitShift = 30.0;

// Whether a row whose largest |Δs_j| is `max_abs_ds` takes the large-shift form.
KVB_HD bool attn_large_shift(double max_abs_ds) { return max_abs_ds >= kLargeLogitShift; }

// Rows whose largest |Δs_j| reaches kPhatByExpShift (and stays below kLargeLogitShift)
// take p̂_j = p_j e^{c_j} / (1 + A) in the fast fp32 path, an exp of its own per key,
// instead of p_j + (p̂_j - p_j): p̂_j / p_j can fall to e^{-2 max|Δs|}, and below about
// 2^-24 the sum is fp32 rounding noise that p̂'s top-k would rank keys by.
inline constexpr double kPhatByExpShift = 4.0;
KVB_HD bool attn_phat_by_exp(double max_abs_ds) { return max_abs_ds >= kPhatByExpShift; }

// p̂_j - p_j, small-shift form.
KVB_HD double attn_dprob_small_shift(double p, double ds, double a) { return p * (expm1(ds) - a) / (1.0 + a); }

KVB_HD double attn_kl_small_shift(double a, double mean_ds) { return log1p(a) - mean_ds; }

KVB_HD double attn_kl_large_shift(double zhat, double max_shat, double z, double max_s, double mean_ds) {
  return (max_shat + log(zhat)) - (max_s + log(z)) - mean_ds;
}

// ---------------------------------------------------------------------------
// The fast path's fp32 per-element arithmetic, one element at a time: the CUDA row
// kernels (kernels/attention_rows.cu) use these; sim/attention_error_fast.cpp computes
// the same operations kLanes (8 or 16) at a time (sim/metrics/row_simd.h: exp,
// expm1_minus_x; exact_row's weights), and tests/metrics/test_attention_shift.cpp
// checks that the two agree lane for lane. The host builds with -ffp-contract=off; on
// the device nvcc (and ptxas after it) would fuse a * b + c by default. So every
// product-then-add is written out: fmaf where the lanes fuse (one rounding, host and
// device alike), mul_rn / add_rn (sim/core/hd_math.h) where a product or sum that an
// add may follow must round on its own. The kernels do the same in their own
// arithmetic (attention_rows.cu); their values do not depend on -fmad.
// ---------------------------------------------------------------------------

// e^x in fp32 (Cody-Waite reduction and a degree-6 polynomial): 0 below -87.34,
// +Inf above 88.72.
KVB_HD float attn_exp_f32(float x) {
  const float lo = -87.3365f, hi = 88.7228f;
  const float xc = x > lo ? (x < hi ? x : hi) : lo;
  const float magic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  const float n = fmaf(xc, 1.44269504088896341f, magic) - magic;
  const float r = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, xc));
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p * r, r, r) + 1.0f;
  // 2^n in two factors, so that 2^128 and 2^-126·(tiny p) stay representable.
  const int32_t ni = static_cast<int32_t>(n), half = ni >> 1;
  const float s1 = bits_float(static_cast<uint32_t>(half + 127) << 23);
  const float s2 = bits_float(static_cast<uint32_t>(ni - half + 127) << 23);
  const float e = mul_rn(mul_rn(p, s1), s2);  // rounded here: expm1_minus_x subtracts 1 from it
  if (x < lo) return 0.0f;
  if (x > hi) return bits_float(0x7f800000u);
  return e;
}

// φ(x) = e^x - 1 - x, accurate relative to φ (a Taylor polynomial for |x| < 1).
KVB_HD float attn_expm1_minus_x(float x) {
  float t = 1.0f / 3628800.0f;  // 1/10!
  t = fmaf(t, x, 1.0f / 362880.0f);
  t = fmaf(t, x, 1.0f / 40320.0f);
  t = fmaf(t, x, 1.0f / 5040.0f);
  t = fmaf(t, x, 1.0f / 720.0f);
  t = fmaf(t, x, 1.0f / 120.0f);
  t = fmaf(t, x, 1.0f / 24.0f);
  t = fmaf(t, x, 1.0f / 6.0f);
  t = fmaf(t, x, 0.5f);
  if (absf(x) < 1.0f) return t * x * x;
  return (attn_exp_f32(x) - 1.0f) - x;
}

// The unnormalised exact weight e^{s - m} of a score s under the row's max m: s - m
// rounds to fp32, its rounding error e is recovered exactly (TwoSum) and applied to
// first order, e^{x + e} = e^x (1 + e).
KVB_HD float attn_exact_weight(float s, float m) {
  const float x = s - m, back = x - s;
  const float e = (s - (x - back)) + (-m - back);
  const float ex = attn_exp_f32(x);
  return ex > 0.0f ? ex * (e + 1.0f) : ex;
}

}  // namespace kvb
