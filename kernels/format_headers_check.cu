// Compile check: the per-element/per-block headers of sim/formats/ that no CUDA twin
// uses yet must still build with nvcc (C++17, host+device). Nothing here runs; the
// kernel only instantiates each shared function once. (ggml_blocks.h, fp_blocks.h,
// minifloat.h and nf4_block.h are compiled by their twins.)
#include "sim/formats/codebook.h"
#include "sim/formats/qjl_block.h"
#include "sim/formats/seeded.h"
#include "sim/formats/turbo_block.h"

namespace kvb::cuda {

__global__ void format_headers_compile_check(const float* x, float* y, const float* t, const float* c,
                                             const float* s, const float* S) {
  uint8_t codes[32];
  float work[32];
  const uint16_t norm = turbo_encode(x, 32, s, t, 8, work, codes);
  turbo_decode(codes, 32, norm, s, c, y);
  y[1] = static_cast<float>(qjl_sign_bit(S, x, 32)) + qjl_estimator_scale(qjl_norm_bits(x, 32), 64);
  y[2] = static_cast<float>(codebook_index(x[3], t, 16));
  y[3] = stream_sign(unit_stream(1, 2, 3, true, 4), 5);
}

}  // namespace kvb::cuda
