// Per-group arithmetic of the integer quantizers (methods.md §2), shared verbatim by
// the CPU formats (int_format.cpp) and their CUDA twins (kernels/): the same inputs
// give the same codes and the same dequantized floats on both.
//
// A group is G values that share one scale (and, asymmetric, one zero/min).
// Decoding is x̂ = code * scale + zero with both products rounded separately.
#pragma once
#include <cstdint>

#include "sim/core/half.h"
#include "sim/core/hd.h"

namespace kvb {

struct IntGroupParams {
  float scale = 0;  // as stored (rounded to the scale dtype)
  float zero = 0;   // asymmetric: the group minimum as stored; symmetric: 0
};

// Largest finite value of a storage dtype; scales and zeros saturate there instead of
// becoming infinite (only reachable with |x| beyond ~6e4 and fp16 metadata).
KVB_HD float store_dtype_max(StoreDtype d) {
  return d == StoreDtype::F16 ? 65504.0f : 3.4028234663852886e38f;
}

KVB_HD float store_saturating(float v, StoreDtype d) {
  const float m = store_dtype_max(d);
  return round_to_store(clampf(v, -m, m), d);
}

// Asymmetric (min-max): s = (max - min)/(2^b - 1), codes 0..2^b-1.
KVB_HD IntGroupParams int_asym_params(float lo, float hi, int bits, StoreDtype scale_dt, StoreDtype zero_dt) {
  const float levels = static_cast<float>((1u << bits) - 1u);
  IntGroupParams p;
  p.zero = store_saturating(lo, zero_dt);
  p.scale = store_saturating(div_rn(add_rn(hi, -lo), levels), scale_dt);
  return p;
}

KVB_HD int int_asym_encode(float x, IntGroupParams p, int bits) {
  if (!(p.scale > 0.0f)) return 0;  // constant group (or scale underflow): all codes 0
  const float levels = static_cast<float>((1u << bits) - 1u);
  return static_cast<int>(clampf(round_even(div_rn(add_rn(x, -p.zero), p.scale)), 0.0f, levels));
}

// Symmetric (absmax), b >= 2: s = max|x| / (2^(b-1) - 1), codes -(2^(b-1)-1)..2^(b-1)-1.
// b == 1 is the sign quantizer: s = mean|x| (the MSE-optimal sign scale), codes {-1, +1}.
KVB_HD int int_sym_qmax(int bits) { return bits == 1 ? 1 : (1 << (bits - 1)) - 1; }

KVB_HD IntGroupParams int_sym_params(float absmax_or_meanabs, int bits, StoreDtype scale_dt) {
  IntGroupParams p;
  const float qmax = static_cast<float>(int_sym_qmax(bits));
  p.scale = store_saturating(bits == 1 ? absmax_or_meanabs : div_rn(absmax_or_meanabs, qmax), scale_dt);
  p.zero = 0.0f;
  return p;
}

KVB_HD int int_sym_encode(float x, IntGroupParams p, int bits) {
  if (bits == 1) return x < 0.0f ? -1 : 1;
  if (!(p.scale > 0.0f)) return 0;
  const float qmax = static_cast<float>(int_sym_qmax(bits));
  return static_cast<int>(clampf(round_even(div_rn(x, p.scale)), -qmax, qmax));
}

KVB_HD float int_decode(int code, IntGroupParams p) {
  return add_rn(mul_rn(static_cast<float>(code), p.scale), p.zero);
}

}  // namespace kvb
