// Per-group arithmetic of the integer quantizers (methods.md §2), shared verbatim by
// the CPU formats (int_format.cpp) and their CUDA twins (kernels/): the same inputs
// give the same codes and the same dequantized floats on both.
//
// A group is G values that share one scale (and, asymmetric, one zero/min).
// Decoding is x̂ = code * scale + zero with both products rounded separately.
#pragma once
#include <cstdint>

#include "sim/core/hd.h"
#include "sim/core/store_dtype.h"

namespace kvb {

struct IntGroupParams {
  float scale = 0;  // as stored (rounded to the scale dtype)
  float zero = 0;   // asymmetric: the group minimum as stored; symmetric: 0
};

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

KVB_HD int int_encode(float x, IntGroupParams p, int bits, bool symmetric) {
  return symmetric ? int_sym_encode(x, p, bits) : int_asym_encode(x, p, bits);
}

// A code as stored, in 0..2^b-1: asymmetric codes as they are; symmetric codes offset
// by qmax; b = 1 symmetric: 1 for +s, 0 for -s.
KVB_HD uint8_t int_stored_code(int code, int bits, bool symmetric) {
  if (!symmetric) return static_cast<uint8_t>(code);
  return static_cast<uint8_t>(bits == 1 ? (code > 0 ? 1 : 0) : code + int_sym_qmax(bits));
}

KVB_HD int int_code_of_stored(uint8_t stored, int bits, bool symmetric) {
  if (!symmetric) return stored;
  return bits == 1 ? (stored ? 1 : -1) : static_cast<int>(stored) - int_sym_qmax(bits);
}

// The statistic a group's parameters come from: min and max (asymmetric), max|x|
// (symmetric, b >= 2) or mean|x| (symmetric, b = 1).
enum class IntStatKind : uint8_t { MinMax, AbsMax, AbsMean };

KVB_HD IntStatKind int_stat_kind(bool symmetric, int bits) {
  return !symmetric ? IntStatKind::MinMax : (bits == 1 ? IntStatKind::AbsMean : IntStatKind::AbsMax);
}

KVB_HD float int_abs(float x) { return bits_float(float_bits(x) & 0x7fffffffu); }  // exact, -0 -> +0

// Statistics of one group, fed its elements in group order (channel order, or token
// order for groups along tokens). Min and max keep the earliest of equal values
// (-0 vs +0), as std::min / std::max folds do; the b = 1 mean sums |x| in double in
// element order, so it is reproducible only in that order.
struct IntGroupStats {
  float lo = 0, hi = 0;  // MinMax: min and max
  float absmax = 0;      // AbsMax: max |x|
  double abssum = 0;     // AbsMean: sum of |x|
  int64_t n = 0;         // elements seen
};

KVB_HD void int_stats_add(IntGroupStats& s, float x, IntStatKind kind) {
  switch (kind) {
    case IntStatKind::MinMax:
      if (s.n == 0) {
        s.lo = x;
        s.hi = x;
      } else {
        s.lo = x < s.lo ? x : s.lo;
        s.hi = s.hi < x ? x : s.hi;
      }
      break;
    case IntStatKind::AbsMax: {
      const float a = int_abs(x);
      s.absmax = s.absmax < a ? a : s.absmax;
      break;
    }
    case IntStatKind::AbsMean: s.abssum += static_cast<double>(int_abs(x)); break;
  }
  ++s.n;
}

// Statistics of elements [0, m) merged with those of [m, n) (`later`), equal to
// feeding all n in order: min/max keep the earlier of equal values, exactly as the
// fold does. Not exact for AbsMean (a double sum depends on its order): callers
// merge only MinMax and AbsMax.
KVB_HD IntGroupStats int_stats_merge(IntGroupStats earlier, IntGroupStats later) {
  if (earlier.n == 0) return later;
  if (later.n == 0) return earlier;
  IntGroupStats s = earlier;
  s.lo = later.lo < earlier.lo ? later.lo : earlier.lo;
  s.hi = earlier.hi < later.hi ? later.hi : earlier.hi;
  s.absmax = earlier.absmax < later.absmax ? later.absmax : earlier.absmax;
  s.abssum = earlier.abssum + later.abssum;
  s.n = earlier.n + later.n;
  return s;
}

// The stored parameters of a group from its statistics.
KVB_HD IntGroupParams int_group_params(const IntGroupStats& s, IntStatKind kind, int bits, StoreDtype scale_dt,
                                       StoreDtype zero_dt) {
  switch (kind) {
    case IntStatKind::MinMax: return int_asym_params(s.lo, s.hi, bits, scale_dt, zero_dt);
    case IntStatKind::AbsMax: return int_sym_params(s.absmax, bits, scale_dt);
    default:
      return int_sym_params(static_cast<float>(s.abssum / static_cast<double>(s.n)), bits, scale_dt);
  }
}

}  // namespace kvb
