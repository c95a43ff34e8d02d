// CUDA twin of the ggml block formats (sim/formats/ggml_format.h): q4_0, q4_1, q5_0,
// q5_1, q8_0, iq4_nl and iq4_nl-ntry<N>. Each block of 32 values is quantized and
// dequantized by sim/formats/ggml_blocks.h, the header the CPU format runs.
//
// Layout of a quantized batch (FormatTwin::quantize): codes are ggml's own block bytes,
// [spans, rows, cols / 32] blocks of sizeof(block_<type>) bytes (18, 20, 22, 24, 34, 18),
// byte for byte what GgmlFormat::encode writes for each span (and what ggml stores for
// a tensor with ne0 = head_dim); no separate metadata (the fp16 scales are in the blocks).
#pragma once
#include <memory>

#include "kernels/format_twin.h"

namespace kvb::cuda {

// nullptr unless `format` is a GgmlFormat.
std::unique_ptr<FormatTwin> make_ggml_twin(const Format& format);

}  // namespace kvb::cuda
