// Unnormalised fast Walsh-Hadamard transform, shared by CPU and CUDA code.
// H_n (entries ±1) satisfies H_n H_n = n I, so H_n / n inverts it.
#pragma once
#include "sim/core/hd_math.h"

namespace kvb {

KVB_HD bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// In place on n = 2^k values: butterflies (a, b) -> (a + b, a - b) with half-length
// h = 1, 2, 4, ..., n/2, in this order (the order fixes the rounding).
KVB_HD void fwht(float* v, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = add_rn(a, b);
        v[j + h] = add_rn(a, -b);
      }
}

}  // namespace kvb
