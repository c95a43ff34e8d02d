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
#include "sim/formats/hd_util.h"

namespace kvb {

// The number of thresholds t[i] < x (NaN -> 0) for ascending t and levels a power of
// two, by a branch-free binary search (no mispredicted branches on random data).
KVB_HD int codebook_index(float x, const float* thresholds, int levels) {
  int idx = 0;
  for (int step = levels >> 1; step > 0; step >>= 1) idx += thresholds[idx + step - 1] < x ? step : 0;
  return idx;
}

// codebook_index by counting: every threshold compared, none loaded at a data-dependent
// index (so a GPU keeps them in registers or constant memory). The same result for
// ascending thresholds, NaN included (no comparison holds).
KVB_HD int codebook_count_below(float x, const float* thresholds, int levels) {
  int idx = 0;
  for (int k = 0; k + 1 < levels; ++k) idx += thresholds[k] < x ? 1 : 0;
  return idx;
}

// codebook_index of n values at once. Small codebooks (<= 16 levels) count the
// thresholds below each value in a loop over values that the compiler vectorizes;
// larger ones search each value.
KVB_HD void codebook_indices(const float* v, int n, const float* thresholds, int levels, uint8_t* codes) {
  if (levels <= 16) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    for (int k = 0; k + 1 < levels; ++k) {
      const float t = thresholds[k];
      for (int i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(codes[i] + (t < v[i] ? 1 : 0));
    }
  } else {
    for (int i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(codebook_index(v[i], thresholds, levels));
  }
}

// The QLoRA NormalFloat4 codebook (bitsandbytes' NF4 table, fp32), entry i.
KVB_HD float nf4_value(int i) {
  constexpr float kValues[16] = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
      1.0f};
  return table16(kValues, i);
}

// Midpoints of consecutive NF4 values, rounded to fp32 (bitsandbytes' thresholds).
KVB_HD float nf4_threshold(int i) {
  return static_cast<float>((static_cast<double>(nf4_value(i)) + static_cast<double>(nf4_value(i + 1))) / 2.0);
}

}  // namespace kvb
