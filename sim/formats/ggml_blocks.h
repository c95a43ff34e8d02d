// ggml's block formats q4_0, q4_1, q5_0, q5_1, q8_0 and iq4_nl: the block structs
// (the byte layout of ggml-common.h) and the per-block quantize / dequantize
// arithmetic, shared by the CPU formats (ggml_format.cpp) and their CUDA twins.
//
// Semantics follow ggml's reference quantizers (quantize_row_*_ref and
// dequantize_row_* in ggml-quants.c) operation by operation, evaluated in IEEE
// binary32 with every multiply, add and divide rounded on its own (C's abstract
// machine without FMA contraction). In particular:
//  - the scale of q4_0/q5_0 is the *signed* value of largest magnitude (the first one
//    on ties) divided by -8 / -16, so that value maps to code 0;
//  - codes are computed with the unrounded fp32 scale d (through 1/d) and stored with
//    d rounded to fp16 (round-to-nearest-even); dequantization uses the fp16 value;
//  - q4_0/q4_1/q5_0 codes are (int8_t)(x/d + 8.5f) style truncations clamped with
//    MIN(); q5_1 has no clamp; q8_0 rounds half away from zero (roundf);
//  - values whose fp16 scale overflowed decode to ±∞ or NaN (0·∞, ∞ - ∞); NaNs are
//    x86's default NaN 0xffc00000, what the reference produces on x86-64, on the device
//    too (x86_nan, hd_util.h);
//  - iq4_nl follows quantize_row_iq4_nl_impl: best_index_int8 over ggml's kvalues
//    table, the weighted least-squares scale with weights x², and the scale search
//    over itry in [-ntry, ntry]. ggml's quantize_row_iq4_nl_ref (the KV-cache path)
//    uses ntry = -1 (no search; codes from max/-127); quantize_iq4_nl without an
//    importance matrix (llama-quantize) uses ntry = 7. Blocks with max|x| < 1e-15
//    get scale 0 and codes 0 (as in current ggml, which clears them; with ntry > 0
//    the codes are then re-derived from scale 0, giving index 8, as ggml does).
// A block covers 32 consecutive values (one row of head_dim holds head_dim/32 blocks).
#pragma once
#include <cstdint>

#include "sim/core/half.h"
#include "sim/formats/hd_util.h"

namespace kvb {

inline constexpr int kGgmlBlock = 32;  // QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = QK4_NL

// Block structs, field for field as in ggml-common.h. Multi-byte fields are
// little-endian (fp16 bits as uint16_t; qh is ggml's uint32 bit mask as 4 bytes).
struct GgmlBlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // nibbles: element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct GgmlBlockQ4_1 {
  uint16_t d;      // fp16 scale
  uint16_t m;      // fp16 minimum
  uint8_t qs[16];
};
struct GgmlBlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];   // fifth bit of element j at bit j of the little-endian uint32
  uint8_t qs[16];
};
struct GgmlBlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct GgmlBlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct GgmlBlockIQ4NL {
  uint16_t d;
  uint8_t qs[16];  // indices into ggml_iq4nl_value(), packed like q4_0
};
static_assert(sizeof(GgmlBlockQ4_0) == 18, "q4_0 block is 18 bytes");
static_assert(sizeof(GgmlBlockQ4_1) == 20, "q4_1 block is 20 bytes");
static_assert(sizeof(GgmlBlockQ5_0) == 22, "q5_0 block is 22 bytes");
static_assert(sizeof(GgmlBlockQ5_1) == 24, "q5_1 block is 24 bytes");
static_assert(sizeof(GgmlBlockQ8_0) == 34, "q8_0 block is 34 bytes");
static_assert(sizeof(GgmlBlockIQ4NL) == 18, "iq4_nl block is 18 bytes");

// ggml's non-linear 4-bit grid (kvalues_iq4nl), in units of the block scale.
// (A function, so that host and device code read the same table.)
KVB_HD int ggml_iq4nl_value(int i) {
  constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return table16(kValues, i);
}

KVB_HD uint32_t ggml_qh_get(const uint8_t qh[4]) {
  return static_cast<uint32_t>(qh[0]) | (static_cast<uint32_t>(qh[1]) << 8) | (static_cast<uint32_t>(qh[2]) << 16) |
         (static_cast<uint32_t>(qh[3]) << 24);
}
KVB_HD void ggml_qh_set(uint8_t qh[4], uint32_t v) {
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Signed value of largest magnitude (first on ties), as q4_0/q5_0 search it.
KVB_HD float ggml_signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kGgmlBlock; ++j) {
    if (amax < absf(x[j])) {
      amax = absf(x[j]);
      max = x[j];
    }
  }
  return max;
}

KVB_HD void ggml_min_max(const float* x, float& lo, float& hi) {
  lo = 3.40282347e38f;
  hi = -3.40282347e38f;
  for (int j = 0; j < kGgmlBlock; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
}

KVB_HD float ggml_inverse_or_zero(float d) { return d != 0.0f ? div_rn(1.0f, d) : 0.0f; }

// ---------------------------------------------------------------- q4_0
KVB_HD void ggml_quantize_q4_0(const float* x, GgmlBlockQ4_0& b) {
  const float d = div_rn(ggml_signed_absmax(x), -8.0f);
  const float id = ggml_inverse_or_zero(d);
  b.d = f32_to_f16_bits(d);
  for (int j = 0; j < 16; ++j) {
    const int xi0 = c_float_to_i8(add_rn(mul_rn(x[j], id), 8.5f));
    const int xi1 = c_float_to_i8(add_rn(mul_rn(x[j + 16], id), 8.5f));
    const uint8_t q0 = static_cast<uint8_t>(xi0 < 15 ? xi0 : 15);
    const uint8_t q1 = static_cast<uint8_t>(xi1 < 15 ? xi1 : 15);
    b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}
KVB_HD void ggml_dequantize_q4_0(const GgmlBlockQ4_0& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = x86_nan(mul_rn(static_cast<float>((b.qs[j] & 0x0f) - 8), d));
    y[j + 16] = x86_nan(mul_rn(static_cast<float>((b.qs[j] >> 4) - 8), d));
  }
}

// ---------------------------------------------------------------- q4_1
KVB_HD void ggml_quantize_q4_1(const float* x, GgmlBlockQ4_1& b) {
  float lo, hi;
  ggml_min_max(x, lo, hi);
  const float d = div_rn(add_rn(hi, -lo), 15.0f);
  const float id = ggml_inverse_or_zero(d);
  b.d = f32_to_f16_bits(d);
  b.m = f32_to_f16_bits(lo);
  for (int j = 0; j < 16; ++j) {
    const int xi0 = c_float_to_i8(add_rn(mul_rn(add_rn(x[j], -lo), id), 0.5f));
    const int xi1 = c_float_to_i8(add_rn(mul_rn(add_rn(x[j + 16], -lo), id), 0.5f));
    const uint8_t q0 = static_cast<uint8_t>(xi0 < 15 ? xi0 : 15);
    const uint8_t q1 = static_cast<uint8_t>(xi1 < 15 ? xi1 : 15);
    b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}
KVB_HD void ggml_dequantize_q4_1(const GgmlBlockQ4_1& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  const float m = f16_bits_to_f32(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = x86_nan(add_rn(mul_rn(static_cast<float>(b.qs[j] & 0x0f), d), m));
    y[j + 16] = x86_nan(add_rn(mul_rn(static_cast<float>(b.qs[j] >> 4), d), m));
  }
}

// ---------------------------------------------------------------- q5_0
KVB_HD void ggml_quantize_q5_0(const float* x, GgmlBlockQ5_0& b) {
  const float d = div_rn(ggml_signed_absmax(x), -16.0f);
  const float id = ggml_inverse_or_zero(d);
  b.d = f32_to_f16_bits(d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int xi0 = c_float_to_i8(add_rn(mul_rn(x[j], id), 16.5f));
    const int xi1 = c_float_to_i8(add_rn(mul_rn(x[j + 16], id), 16.5f));
    const uint8_t q0 = static_cast<uint8_t>(xi0 < 31 ? xi0 : 31);
    const uint8_t q1 = static_cast<uint8_t>(xi1 < 31 ? xi1 : 31);
    b.qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
    qh |= static_cast<uint32_t>((q0 & 0x10u) >> 4) << j;
    qh |= static_cast<uint32_t>((q1 & 0x10u) >> 4) << (j + 16);
  }
  ggml_qh_set(b.qh, qh);
}
KVB_HD void ggml_dequantize_q5_0(const GgmlBlockQ5_0& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  const uint32_t qh = ggml_qh_get(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10u);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10u);
    y[j] = x86_nan(mul_rn(static_cast<float>(((b.qs[j] & 0x0f) | h0) - 16), d));
    y[j + 16] = x86_nan(mul_rn(static_cast<float>(((b.qs[j] >> 4) | h1) - 16), d));
  }
}

// ---------------------------------------------------------------- q5_1
KVB_HD void ggml_quantize_q5_1(const float* x, GgmlBlockQ5_1& b) {
  float lo, hi;
  ggml_min_max(x, lo, hi);
  const float d = div_rn(add_rn(hi, -lo), 31.0f);
  const float id = ggml_inverse_or_zero(d);
  b.d = f32_to_f16_bits(d);
  b.m = f32_to_f16_bits(lo);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const uint8_t q0 = c_float_to_u8(add_rn(mul_rn(add_rn(x[j], -lo), id), 0.5f));
    const uint8_t q1 = c_float_to_u8(add_rn(mul_rn(add_rn(x[j + 16], -lo), id), 0.5f));
    b.qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
    qh |= static_cast<uint32_t>((q0 & 0x10u) >> 4) << j;
    qh |= static_cast<uint32_t>((q1 & 0x10u) >> 4) << (j + 16);
  }
  ggml_qh_set(b.qh, qh);
}
KVB_HD void ggml_dequantize_q5_1(const GgmlBlockQ5_1& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  const float m = f16_bits_to_f32(b.m);
  const uint32_t qh = ggml_qh_get(b.qh);
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10u);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10u);
    y[j] = x86_nan(add_rn(mul_rn(static_cast<float>((b.qs[j] & 0x0f) | h0), d), m));
    y[j + 16] = x86_nan(add_rn(mul_rn(static_cast<float>((b.qs[j] >> 4) | h1), d), m));
  }
}

// ---------------------------------------------------------------- q8_0
KVB_HD void ggml_quantize_q8_0(const float* x, GgmlBlockQ8_0& b) {
  float amax = 0.0f;
  for (int j = 0; j < kGgmlBlock; ++j) {
    const float a = absf(x[j]);
    amax = amax > a ? amax : a;
  }
  const float d = div_rn(amax, 127.0f);
  const float id = ggml_inverse_or_zero(d);
  b.d = f32_to_f16_bits(d);
  for (int j = 0; j < kGgmlBlock; ++j) b.qs[j] = c_float_to_i8(round_away(mul_rn(x[j], id)));
}
KVB_HD void ggml_dequantize_q8_0(const GgmlBlockQ8_0& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  for (int j = 0; j < kGgmlBlock; ++j) y[j] = x86_nan(mul_rn(static_cast<float>(b.qs[j]), d));
}

// ---------------------------------------------------------------- iq4_nl
// ggml's best_index_int8 over the 16-entry grid (binary search, then the nearer of
// the two neighbours, ties to the upper one) equals the number of grid midpoints
// (v[k] + v[k+1]) / 2 (exact half-integers) that are <= x: checked exhaustively over
// every non-NaN float. Counting is branch-free.
KVB_HD int ggml_iq4nl_best_index(float x) {
  int idx = 0;
  for (int k = 0; k < 15; ++k)
    idx += static_cast<float>(ggml_iq4nl_value(k) + ggml_iq4nl_value(k + 1)) * 0.5f <= x ? 1 : 0;
  return idx;
}

// The 32 grid indices of a block as nibbles of two words (element j at bits 4 (j % 16)
// of `low` for j < 16, of `high` otherwise): registers on a GPU, where an array indexed
// by the loop counter would live in local memory.
struct Iq4Codes {
  uint64_t low = 0, high = 0;
  KVB_HD void set(int j, int l) {
    if (j < 16) low |= static_cast<uint64_t>(l) << (4 * j);
    else high |= static_cast<uint64_t>(l) << (4 * (j - 16));
  }
  // Byte j of the block's qs: element j low, element j + 16 high (as q4_0).
  KVB_HD uint8_t packed(int j) const {
    return static_cast<uint8_t>(((low >> (4 * j)) & 0x0fu) | (((high >> (4 * j)) & 0x0fu) << 4));
  }
};

// Weighted least-squares fit of codes for the inverse scale id: accumulates
// sumqx = Σ w q x and sumq2 = Σ w q² (w = x²) in ggml's order; codes to *L if given.
KVB_HD void ggml_iq4nl_fit(const float* x, float id, float& sumqx, float& sumq2, Iq4Codes* L) {
  sumqx = 0.0f;
  sumq2 = 0.0f;
  for (int j = 0; j < kGgmlBlock; ++j) {
    const int l = ggml_iq4nl_best_index(mul_rn(id, x[j]));
    if (L) L->set(j, l);
    const float q = static_cast<float>(ggml_iq4nl_value(l));
    const float w = mul_rn(x[j], x[j]);
    sumqx = add_rn(sumqx, mul_rn(mul_rn(w, q), x[j]));
    sumq2 = add_rn(sumq2, mul_rn(mul_rn(w, q), q));
  }
}

KVB_HD void ggml_quantize_iq4_nl(const float* x, GgmlBlockIQ4NL& b, int ntry) {
  Iq4Codes L;  // all zero: the codes of a block below GROUP_MAX_EPS
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kGgmlBlock; ++j) {
    const float ax = absf(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  float scale = 0.0f;
  if (amax >= 1e-15f) {  // GROUP_MAX_EPS
    const float v0 = static_cast<float>(ggml_iq4nl_value(0));
    float d = ntry > 0 ? div_rn(-max, v0) : div_rn(max, v0);
    float sumqx, sumq2;
    ggml_iq4nl_fit(x, div_rn(1.0f, d), sumqx, sumq2, &L);
    d = sumq2 > 0.0f ? div_rn(sumqx, sumq2) : 0.0f;
    float best = mul_rn(d, sumqx);
    for (int itry = -ntry; itry <= ntry; ++itry) {
      ggml_iq4nl_fit(x, div_rn(static_cast<float>(itry + ggml_iq4nl_value(0)), max), sumqx, sumq2, nullptr);
      if (sumq2 > 0.0f && mul_rn(sumqx, sumqx) > mul_rn(best, sumq2)) {
        d = div_rn(sumqx, sumq2);
        best = mul_rn(d, sumqx);
      }
    }
    scale = x86_nan(d);  // NaN once the sums overflow (|x| ~ 1e19): x86's default NaN on both sides
  }
  b.d = f32_to_f16_bits(scale);
  if (ntry > 0) {
    const float id = scale != 0.0f ? div_rn(1.0f, scale) : 0.0f;
    L = Iq4Codes{};
    for (int j = 0; j < kGgmlBlock; ++j) L.set(j, ggml_iq4nl_best_index(mul_rn(id, x[j])));
  }
  for (int j = 0; j < 16; ++j) b.qs[j] = L.packed(j);
}
KVB_HD void ggml_dequantize_iq4_nl(const GgmlBlockIQ4NL& b, float* y) {
  const float d = f16_bits_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = x86_nan(mul_rn(d, static_cast<float>(ggml_iq4nl_value(b.qs[j] & 0x0f))));
    y[j + 16] = x86_nan(mul_rn(d, static_cast<float>(ggml_iq4nl_value(b.qs[j] >> 4))));
  }
}

}  // namespace kvb
