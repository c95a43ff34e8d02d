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

namespace kvb {

inline constexpr double kLargeLogitShift = 30.0;

// Whether a row whose largest |Δs_j| is `max_abs_ds` takes the large-shift form.
KVB_HD bool attn_large_shift(double max_abs_ds) { return max_abs_ds >= kLargeLogitShift; }

// p̂_j - p_j, small-shift form.
KVB_HD double attn_dprob_small_shift(double p, double ds, double a) { return p * (expm1(ds) - a) / (1.0 + a); }

KVB_HD double attn_kl_small_shift(double a, double mean_ds) { return log1p(a) - mean_ds; }

KVB_HD double attn_kl_large_shift(double zhat, double max_shat, double z, double max_s, double mean_ds) {
  return (max_shat + log(zhat)) - (max_s + log(z)) - mean_ds;
}

}  // namespace kvb
