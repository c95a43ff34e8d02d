// Compile check: every per-element/per-block header of sim/formats/ that a CUDA twin
// will share must build with nvcc (C++17, host+device). Nothing here runs; the
// kernel only instantiates each shared function once. Replace by the real twins.
#include "sim/formats/ggml_blocks.h"
#include "sim/formats/fp_blocks.h"
#include "sim/formats/turbo_block.h"
#include "sim/formats/qjl_block.h"
#include "sim/formats/nf4_block.h"
#include "sim/formats/seeded.h"
#include "sim/formats/codebook.h"

namespace kvb::cuda {

__global__ void format_headers_compile_check(const float* x, float* y, const float* t, const float* c,
                                             const float* s, const float* S) {
  GgmlBlockQ4_0 b0;
  ggml_quantize_q4_0(x, b0);
  ggml_dequantize_q4_0(b0, y);
  GgmlBlockQ4_1 b1;
  ggml_quantize_q4_1(x, b1);
  ggml_dequantize_q4_1(b1, y);
  GgmlBlockQ5_0 b2;
  ggml_quantize_q5_0(x, b2);
  ggml_dequantize_q5_0(b2, y);
  GgmlBlockQ5_1 b3;
  ggml_quantize_q5_1(x, b3);
  ggml_dequantize_q5_1(b3, y);
  GgmlBlockQ8_0 b4;
  ggml_quantize_q8_0(x, b4);
  ggml_dequantize_q8_0(b4, y);
  GgmlBlockIQ4NL b5;
  ggml_quantize_iq4_nl(x, b5, 7);
  ggml_dequantize_iq4_nl(b5, y);
  uint8_t e, codes[32];
  mxfp4_quantize_block(x, e, codes);
  mxfp4_dequantize_block(e, codes, y);
  mxfp4_roundtrip_block(x, y);
  nvfp4_quantize_block(x, 1.0f, e, codes);
  nvfp4_dequantize_block(e, 1.0f, codes, y);
  nvfp4_roundtrip_block(x, 1.0f, y);
  y[0] = fp8_roundtrip_scaled(x[0], 2.0f, minifloat_e4m3()) +
         fp8_decode_scaled(fp8_encode_scaled(x[1], 1.0f, minifloat_e5m2()), 1.0f, minifloat_e5m2());
  float work[32];
  const uint16_t norm = turbo_encode(x, 32, s, t, 8, work, codes);
  turbo_decode(codes, 32, norm, s, c, y);
  y[1] = static_cast<float>(qjl_sign_bit(S, x, 32)) + qjl_estimator_scale(qjl_norm_bits(x, 32), 64);
  const float inv = nf4_inverse_scale(nf4_group_scale(x, 32, StoreDtype::F16));
  y[2] = nf4_decode(nf4_encode(x[3], inv, t), 1.0f) + nf4_threshold(3);
  y[3] = stream_sign(unit_stream(1, 2, 3, true, 4), 5);
}

}  // namespace kvb::cuda
