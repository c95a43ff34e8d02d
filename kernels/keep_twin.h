// CUDA twin of keep-<fp16|bf16|fp32> (sim/formats/keep_format.h): values stored at
// their precision with sim/core/half.h's conversions.
//
// Layout of a quantized batch: codes [spans, rows, cols] of store_bits(x, dtype), as
// uint16 (fp16, bf16) or uint32 (fp32); no metadata.
#pragma once
#include <memory>

#include "kernels/format_twin.h"

namespace kvb::cuda {

// nullptr unless `format` is a KeepFormat.
std::unique_ptr<FormatTwin> make_keep_twin(const Format& format);

}  // namespace kvb::cuda
