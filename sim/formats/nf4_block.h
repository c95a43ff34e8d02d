// Per-group arithmetic of NF4 (nf4_format.h), shared by CPU and CUDA code.
#pragma once
#include <cstdint>

#include "sim/formats/codebook.h"
#include "sim/formats/hd_util.h"
#include "sim/formats/int_block.h"

namespace kvb {

// The stored absmax scale of a group of n values.
KVB_HD float nf4_group_scale(const float* x, int64_t n, StoreDtype dt) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = amax < absf(x[i]) ? absf(x[i]) : amax;
  return store_saturating(amax, dt);
}

// What values are multiplied by before the codebook search (bitsandbytes: 1/absmax).
KVB_HD float nf4_inverse_scale(float scale) { return scale > 0.0f ? div_rn(1.0f, scale) : 0.0f; }

// thresholds: the 15 values nf4_threshold(0..14); inv = nf4_inverse_scale(scale).
KVB_HD int nf4_encode(float x, float inv, const float* thresholds) {
  return codebook_index(mul_rn(x, inv), thresholds, 16);
}
// The same code by counting (codebook_count_below): no data-dependent loads, so a CUDA
// kernel that passes the thresholds in its parameters compares against constants (its
// round trip uses this; its quantize, bound elsewhere, the search on a shared copy).
KVB_HD int nf4_encode_counted(float x, float inv, const float* thresholds) {
  return codebook_count_below(mul_rn(x, inv), thresholds, 16);
}

KVB_HD float nf4_decode(int code, float scale) { return mul_rn(nf4_value(code), scale); }

}  // namespace kvb
