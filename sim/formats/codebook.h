// Scalar codebook quantization shared by the codebook formats (NF4, rotation +
// Lloyd-Max, per-channel non-uniform codebooks) on CPU and CUDA.
//
// A codebook of K ascending values c[0..K) comes with K-1 decision thresholds
// t[0..K-1), t[i] the fp32-rounded midpoint of c[i] and c[i+1]. The code of x is the
// number of thresholds strictly below x, so x exactly on a threshold takes the lower
// value (as bitsandbytes' NF4 decision tree does with its `>` tests).
#pragma once
#include <cstdint>

#include "sim/core/hd.h"

namespace kvb {

// Binary search; equal to counting t[i] < x over all i for ascending t (NaN -> 0).
KVB_HD int codebook_index(float x, const float* thresholds, int levels) {
  int lo = 0, hi = levels - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (thresholds[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The QLoRA NormalFloat4 codebook (bitsandbytes' NF4 table, fp32).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline constexpr float kNf4Values[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f};

// Midpoints of consecutive kNf4Values, rounded to fp32 (bitsandbytes' thresholds).
KVB_HD float nf4_threshold(int i) {
  return static_cast<float>((static_cast<double>(kNf4Values[i]) + static_cast<double>(kNf4Values[i + 1])) / 2.0);
}

}  // namespace kvb
