// Per-vector arithmetic of the rotation + Lloyd-Max formats (TurboQuant / HIGGS
// style, methods.md §2), shared by the CPU format (turbo_format.cpp) and its CUDA twin.
//
// One vector v of n = 2^k values is stored as its fp16 norm and n b-bit codes:
//   w = H_n (D v) / ||v||      D = diag(random ±1), H_n the unnormalised Hadamard
//                              matrix; each w_i ≈ N(0, 1) (the rotated unit vector
//                              times sqrt(n)), so the N(0, 1) Lloyd-Max codebook applies
//   code_i = index of w_i in the codebook (codebook.h thresholds)
//   v̂ = ||v||_fp16 / n · D H_n ĉ,  ĉ_i = centroid[code_i]   (H_n H_n = n I)
// The norm is the fp32 sum of squares in index order, correctly rounded sqrt; it
// saturates at fp16's max (65504) when stored.
#pragma once
#include <cstdint>

#include "sim/core/half.h"
#include "sim/formats/codebook.h"
#include "sim/formats/hadamard.h"
#include "sim/formats/hd_util.h"

namespace kvb {

// Encodes v[0..n); signs[i] is D's ±1 diagonal; work holds n floats of scratch.
// Returns the stored norm (fp16 bits).
KVB_HD uint16_t turbo_encode(const float* v, int n, const float* signs, const float* thresholds, int levels,
                             float* work, uint8_t* codes) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss = add_rn(ss, mul_rn(v[i], v[i]));
  const float norm = sqrt_rn(ss);
  const float inv = norm > 0.0f ? div_rn(1.0f, norm) : 0.0f;
  for (int i = 0; i < n; ++i) work[i] = mul_rn(v[i], signs[i]);
  fwht(work, n);
  for (int i = 0; i < n; ++i) work[i] = mul_rn(work[i], inv);
  codebook_indices(work, n, thresholds, levels, codes);
  return f32_to_f16_bits(norm < 65504.0f ? norm : 65504.0f);
}

// Decodes n codes into out[0..n).
KVB_HD void turbo_decode(const uint8_t* codes, int n, uint16_t norm_bits, const float* signs, const float* centroids,
                         float* out) {
  for (int i = 0; i < n; ++i) out[i] = centroids[codes[i]];
  fwht(out, n);
  const float scale = mul_rn(f16_bits_to_f32(norm_bits), div_rn(1.0f, static_cast<float>(n)));  // 1/n exact
  for (int i = 0; i < n; ++i) out[i] = mul_rn(mul_rn(out[i], scale), signs[i]);
}

}  // namespace kvb
