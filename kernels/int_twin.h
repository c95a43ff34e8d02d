// CUDA twin of the integer formats (sim/formats/int_format.h): every grouping (g<G>,
// tok, ch<G>, ch), symmetric and asymmetric, 1..8 bits, every scale/zero dtype. The
// statistics, parameters, codes and decoded values come from sim/formats/int_block.h,
// the header the CPU format runs, fed in the same element order.
//
// Layout of a quantized batch (FormatTwin::quantize), per span, identical to IntCodes
// (IntFormat::quantize) of that span:
//   codes: [rows, cols] uint8, int_stored_code of each element;
//   meta:  IntGroupParams (fp32 stored scale, fp32 stored zero; 8 bytes) per group,
//          g<G>/tok: [rows, ceil(cols / G)], ch<G>/ch: [ceil(rows / G), cols].
#pragma once
#include <memory>

#include "kernels/format_twin.h"

namespace kvb::cuda {

// nullptr unless `format` is an IntFormat.
std::unique_ptr<FormatTwin> make_int_twin(const Format& format);

}  // namespace kvb::cuda
