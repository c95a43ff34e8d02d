// Storage dtypes of the scalars formats keep (scales, zero points, kept elements): the
// one table of their facts, host and device.
//
//  dtype  name   bits  saturates at (store_dtype_max)  rounding from fp32   stored bits <-> fp32
//  F32    fp32   32    3.4028235e38 (fp32's max)       none                 float_bits / bits_float
//  F16    fp16   16    65504                           to nearest even      f32_to_f16_bits / f16_bits_to_f32
//  BF16   bf16   16    3.4028235e38 (fp32's max) [*]   to nearest even      f32_to_bf16_bits / bf16_bits_to_f32
//
// [*] bf16's own largest finite value is 3.3895314e38; saturating at fp32's max lets a
//     value in (3.3961e38, fp32 max] round to bf16 infinity. Kept as it is so that
//     results do not change; no recording comes near it.
//
// Every switch over StoreDtype here lists every dtype and has no `default:`, and this
// header makes -Wswitch an error for them, so a dtype added to the enum does not compile
// until each of its facts is given; there is no silent fp32 fallback.
#pragma once
#include <cstdint>
#include <string_view>

#include "sim/core/half.h"
#include "sim/core/hd.h"
#include "sim/core/hd_math.h"

// A switch below that misses a dtype is an error (host compilers; nvcc's host pass too).
#if defined(__GNUC__) && !defined(__CUDA_ARCH__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
#endif

namespace kvb {

enum class StoreDtype : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

// Every dtype of the enum, in the order names are listed to users.
inline constexpr StoreDtype kStoreDtypes[] = {StoreDtype::F16, StoreDtype::BF16, StoreDtype::F32};

// Stored bits per value.
KVB_HD int store_dtype_bits(StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return 32;
    case StoreDtype::F16: return 16;
    case StoreDtype::BF16: return 16;
  }
  KVB_UNREACHABLE();
}

// Largest finite value a scale or zero of this dtype saturates at instead of becoming
// infinite (only reachable with |x| beyond ~6e4 and fp16 metadata).
KVB_HD float store_dtype_max(StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return 3.4028234663852886e38f;
    case StoreDtype::F16: return 65504.0f;
    case StoreDtype::BF16: return 3.4028234663852886e38f;  // [*] above
  }
  KVB_UNREACHABLE();
}

// The value a float becomes once stored at precision d.
KVB_HD float round_to_store(float f, StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return f;
    case StoreDtype::F16: return round_to_f16(f);
    case StoreDtype::BF16: return round_to_bf16(f);
  }
  KVB_UNREACHABLE();
}

// The bits a value is stored as at precision d (fp16 / bf16: the low 16 bits; fp32:
// its own bits), and back. store_bits_value(store_bits(f, d), d) == round_to_store(f, d).
KVB_HD uint32_t store_bits(float f, StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return float_bits(f);
    case StoreDtype::F16: return f32_to_f16_bits(f);
    case StoreDtype::BF16: return f32_to_bf16_bits(f);
  }
  KVB_UNREACHABLE();
}

KVB_HD float store_bits_value(uint32_t bits, StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return bits_float(bits);
    case StoreDtype::F16: return f16_bits_to_f32(static_cast<uint16_t>(bits));
    case StoreDtype::BF16: return bf16_bits_to_f32(static_cast<uint16_t>(bits));
  }
  KVB_UNREACHABLE();
}

// v clamped to ±store_dtype_max(d), then stored at precision d.
KVB_HD float store_saturating(float v, StoreDtype d) {
  const float m = store_dtype_max(d);
  return round_to_store(clampf(v, -m, m), d);
}

// The name in format names and layouts ("fp16", "bf16", "fp32"). Host only.
inline const char* store_dtype_name(StoreDtype d) {
  switch (d) {
    case StoreDtype::F32: return "fp32";
    case StoreDtype::F16: return "fp16";
    case StoreDtype::BF16: return "bf16";
  }
  KVB_UNREACHABLE();
}

// store_dtype_name() of a dtype, or the short spelling "f16" / "f32", into `out`;
// false (out unchanged) for anything else. Host only.
inline bool parse_store_dtype(std::string_view s, StoreDtype& out) {
  for (const StoreDtype d : kStoreDtypes)
    if (s == store_dtype_name(d)) {
      out = d;
      return true;
    }
  if (s == "f16") out = StoreDtype::F16;
  else if (s == "f32") out = StoreDtype::F32;
  else return false;
  return true;
}

}  // namespace kvb

#if defined(__GNUC__) && !defined(__CUDA_ARCH__)
#pragma GCC diagnostic pop
#endif
