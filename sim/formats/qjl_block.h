// Per-vector arithmetic of QJL (1-bit Johnson-Lindenstrauss sketch of keys),
// shared by the CPU format (qjl_format.cpp) and its CUDA twin.
//
// A key k (d values) is stored as m sign bits of S k (S: m x d Gaussian, row-major)
// and its fp16 norm. Projections are fp32 dot products summed in index order; a
// projection of exactly 0 counts as positive.
#pragma once
#include <cstdint>

#include "sim/core/half.h"
#include "sim/formats/hd_util.h"

namespace kvb {

// Sign bit of projection i (1 = negative) of k, for S row-major [m, d].
KVB_HD uint32_t qjl_sign_bit(const float* S_row, const float* k, int d) {
  float p = 0.0f;
  for (int c = 0; c < d; ++c) p = add_rn(p, mul_rn(S_row[c], k[c]));
  return p < 0.0f ? 1u : 0u;
}

KVB_HD uint16_t qjl_norm_bits(const float* k, int d) {
  float ss = 0.0f;
  for (int c = 0; c < d; ++c) ss = add_rn(ss, mul_rn(k[c], k[c]));
  const float n = sqrt_rn(ss);
  return f32_to_f16_bits(n < 65504.0f ? n : 65504.0f);
}

// √(π/2)/m · ||k||: the factor that makes √(π/2)/m · ||k|| · <S q, sign(S k)> an
// unbiased estimate of <q, k>.
KVB_HD float qjl_estimator_scale(uint16_t norm_bits, int m) {
  return mul_rn(div_rn(1.2533141373155002f, static_cast<float>(m)), f16_bits_to_f32(norm_bits));
}

}  // namespace kvb
