// CUDA twin of nf4-g<G>[-s<dtype>] (sim/formats/nf4_format.h): the absmax scale of every
// group of G consecutive channels and each value's NF4 index and decoded value come
// from sim/formats/nf4_block.h (nf4_group_scale, nf4_inverse_scale, nf4_encode,
// nf4_decode), the header the CPU format runs, fed the group's values in channel order.
//
// Layout of a quantized batch (FormatTwin::quantize):
//   codes: ceil(spans * rows * cols / 2) bytes, the 4-bit index of flat element 2i of
//          [spans, rows, cols] in the low nibble of byte i, of element 2i + 1 in the
//          high nibble;
//   meta:  [spans, rows, cols / G] stored scales, store_bits of the scale dtype (uint16
//          for fp16 / bf16, uint32 for fp32), little-endian.
#pragma once
#include <memory>

#include "kernels/format_twin.h"

namespace kvb::cuda {

// nullptr unless `format` is an Nf4Format.
std::unique_ptr<FormatTwin> make_nf4_twin(const Format& format);

}  // namespace kvb::cuda
