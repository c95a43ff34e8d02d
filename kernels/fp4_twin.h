// CUDA twin of mxfp4 and nvfp4 (sim/formats/fp4_format.h): every block of 32 (MX, E8M0
// scale) or 16 (NV, E4M3 scale) values is quantized, dequantized and round-tripped by
// sim/formats/fp_blocks.h, the header the CPU format runs; NVFP4's per-span tensor
// scale comes from the span's max |x| (exact in any order) and nvfp4_tensor_scale.
//
// Layout of a quantized batch (FormatTwin::quantize), B = 32 (mxfp4) or 16 (nvfp4):
//   codes: [spans, rows, cols / 2] bytes, the E2M1 code of flat element 2i in the low
//          nibble of byte i, of element 2i + 1 in the high nibble (as Fp4Format::encode
//          packs each block);
//   meta:  mxfp4: [spans, rows, cols / 32] E8M0 scale bytes;
//          nvfp4: [spans] fp32 tensor scales (little-endian), then [spans, rows, cols / 16]
//          E4M3 block-scale bytes. meta must be 4-byte aligned.
#pragma once
#include <memory>

#include "kernels/format_twin.h"

namespace kvb::cuda {

// nullptr unless `format` is an Fp4Format.
std::unique_ptr<FormatTwin> make_fp4_twin(const Format& format);

}  // namespace kvb::cuda
