// The softmax perturbation of one attention row, shared by the CPU simulator
// (sim/simulator.cpp) and the CUDA row kernel (kernels/attention_rows.cu).
//
// With reference probabilities p_j and logit errors Δs_j over the causal keys j <= t:
//   p̂_j = p_j e^{Δs_j} / (1 + A),  A = Σ p_j (e^{Δs_j} - 1)
//   KL(p || p̂) = log(1 + A) - Σ p_j Δs_j
// expm1/log1p keep tiny errors exact (Δs = 0 gives exactly 0). When max Δs reaches
// kLargeLogitShift the max-shifted form is used instead:
//   ẑ = Σ p_j e^{Δs_j - max Δs},  p̂_j = p_j e^{Δs_j - max Δs} / ẑ,  KL = log ẑ + max Δs - Σ p_j Δs_j
#pragma once
#include <cmath>

#include "sim/core/hd.h"

namespace kvb {

inline constexpr double kLargeLogitShift = 30.0;

// p̂_j - p_j, small-shift form.
KVB_HD double attn_dprob_small_shift(double p, double ds, double a) { return p * (expm1(ds) - a) / (1.0 + a); }

KVB_HD double attn_kl_small_shift(double a, double mean_ds) { return log1p(a) - mean_ds; }

KVB_HD double attn_kl_large_shift(double zhat, double max_ds, double mean_ds) { return log(zhat) + max_ds - mean_ds; }

}  // namespace kvb
