// CUDA twin of fp8-<e4m3|e5m2>[-s<scale>|-cal<N>|-tok] (sim/formats/fp8_format.h): every
// value is encoded, decoded and round-tripped by sim/formats/fp_blocks.h
// (fp8_encode_scaled, fp8_decode_scaled, fp8_roundtrip_scaled over minifloat.h), the
// header the CPU format runs; calibrated and per-token scales are
// fp8_scale_from_absmax of the max |x| of the span's first N tokens or of the token
// (a maximum, exact in any order).
//
// Layout of a quantized batch (FormatTwin::quantize):
//   codes: [spans, rows, cols] fp8 bytes;
//   meta:  static scale: none; -cal<N>: [spans] fp32 scales; -tok: [spans, rows] fp32
//          scales (little-endian; meta must be 4-byte aligned).
#pragma once
#include <memory>

#include "kernels/format_twin.h"

namespace kvb::cuda {

// nullptr unless `format` is an Fp8Format.
std::unique_ptr<FormatTwin> make_fp8_twin(const Format& format);

}  // namespace kvb::cuda
