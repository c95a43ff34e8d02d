#include "kernels/fp8_twin.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/block_tile.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "sim/formats/fp8_format.h"
#include "sim/formats/fp_blocks.h"

namespace kvb::cuda {

namespace {

constexpr int kThreads = 256;              // per block: 256 quads (span kernel), 8 rows (per-token kernel)
constexpr int kRegisterQuads = 4;          // rows of up to 512 values stay in registers

// The element format is a template parameter of the kernels (kE5M2), so that the
// minifloat arithmetic folds to constants; the kernel spec holds the rest.
struct Fp8KernelSpec {
  Fp8Scale mode = Fp8Scale::Static;
  float static_scale = 1.0f;
};

struct Fp8ScaleRule {
  MinifloatSpec fs;
  __device__ float operator()(float amax) const { return fp8_scale_from_absmax(amax, fs); }
};

enum class Fp8Out { Codes, Values };


__device__ __forceinline__ float warp_max(float m) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, m, off);
    m = m < o ? o : m;
  }
  return m;
}

// Four values at element `at`: codes (one 4-byte store) or round-trip values (16 bytes).
template <Fp8Out kOut>
__device__ __forceinline__ void put_quad(float4 v, ScaleDivisor scale, MinifloatSpec fs, int64_t at,
                                         uint8_t* __restrict__ codes, float* __restrict__ out) {
  if (kOut == Fp8Out::Codes)
    *reinterpret_cast<uchar4*>(codes + at) =
        make_uchar4(fp8_encode_scaled(v.x, scale, fs), fp8_encode_scaled(v.y, scale, fs),
                    fp8_encode_scaled(v.z, scale, fs), fp8_encode_scaled(v.w, scale, fs));
  else
    *reinterpret_cast<float4*>(out + at) =
        make_float4(fp8_roundtrip_scaled(v.x, scale, fs), fp8_roundtrip_scaled(v.y, scale, fs),
                    fp8_roundtrip_scaled(v.z, scale, fs), fp8_roundtrip_scaled(v.w, scale, fs));
}

// One value at element `at`.
template <Fp8Out kOut>
__device__ __forceinline__ void put_one(float x, ScaleDivisor scale, MinifloatSpec fs, int64_t at,
                                        uint8_t* __restrict__ codes, float* __restrict__ out) {
  if (kOut == Fp8Out::Codes) codes[at] = fp8_encode_scaled(x, scale, fs);
  else out[at] = fp8_roundtrip_scaled(x, scale, fs);
}

// Static and calibrated scales: one scale per span, so quantizing is elementwise. A 2-D
// grid (y: spans, x: the span's quads, or single elements when !vec4), one quad per
// thread, as lean as a copy.
template <Fp8Out kOut, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    fp8_span_kernel(const float* __restrict__ x, int64_t spans, int64_t span_elems, Fp8KernelSpec ks, bool vec4,
                    const float* __restrict__ span_scales, uint8_t* __restrict__ codes, float* __restrict__ out) {
  const MinifloatSpec fs = fp8_minifloat(kE5M2);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;  // quad or element of the span
  for (int64_t span = blockIdx.y; span < spans; span += gridDim.y) {
    const ScaleDivisor scale = scale_divisor(ks.mode == Fp8Scale::Static ? ks.static_scale : span_scales[span]);
    const int64_t base = span * span_elems;
    if (vec4) {
      if (4 * i >= span_elems) return;
      put_quad<kOut>(reinterpret_cast<const float4*>(x + base)[i], scale, fs, base + 4 * i, codes, out);
    } else {
      if (i >= span_elems) return;
      put_one<kOut>(x[base + i], scale, fs, base + i, codes, out);
    }
  }
}

// Per-token scales: one warp per row, the row's max |x| by a warp reduction, then codes
// (4-byte stores, the scale to row_scales) or round-trip values (16-byte stores) of four
// values per lane. vec4: the row is read once into registers when it has at most 512 values.
template <Fp8Out kOut, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    fp8_token_rows_kernel(const float* __restrict__ x, int64_t total_rows, int cols, bool vec4,
                          uint8_t* __restrict__ codes, float* __restrict__ row_scales, float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= total_rows) return;
  const MinifloatSpec fs = fp8_minifloat(kE5M2);
  const float* xr = x + row * cols;
  // The row's scale from its max |x|, stored (codes) by lane 0.
  auto token_scale = [&](float m) {
    const float s = fp8_scale_from_absmax(warp_max(m), fs);
    if (kOut == Fp8Out::Codes && lane == 0) row_scales[row] = s;
    return scale_divisor(s);
  };
  if (vec4 && cols <= 4 * 32 * kRegisterQuads) {
    const int quads = cols / 4;
    float4 v[kRegisterQuads];
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < kRegisterQuads; ++k) {
      const int q = lane + 32 * k;
      if (q < quads) {
        v[k] = reinterpret_cast<const float4*>(xr)[q];
        m = m < absf(v[k].x) ? absf(v[k].x) : m;
        m = m < absf(v[k].y) ? absf(v[k].y) : m;
        m = m < absf(v[k].z) ? absf(v[k].z) : m;
        m = m < absf(v[k].w) ? absf(v[k].w) : m;
      }
    }
    const ScaleDivisor scale = token_scale(m);
#pragma unroll
    for (int k = 0; k < kRegisterQuads; ++k) {
      const int q = lane + 32 * k;
      if (q < quads) put_quad<kOut>(v[k], scale, fs, row * cols + 4 * q, codes, out);
    }
    return;
  }
  float m = 0.0f;
  for (int c = lane; c < cols; c += 32) m = m < absf(xr[c]) ? absf(xr[c]) : m;
  const ScaleDivisor scale = token_scale(m);
  for (int c = lane; c < cols; c += 32) put_one<kOut>(xr[c], scale, fs, row * cols + c, codes, out);
}

// Dequantize: one warp per row, four codes per lane (4-byte loads, 16-byte stores).
template <bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    fp8_dequantize_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales, int64_t total_rows,
                          int64_t rows_per_span, int cols, Fp8KernelSpec ks, bool vec4, float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= total_rows) return;
  const MinifloatSpec fs = fp8_minifloat(kE5M2);
  const float scale = ks.mode == Fp8Scale::Static       ? ks.static_scale
                      : ks.mode == Fp8Scale::Calibrated ? scales[row / rows_per_span]
                                                        : scales[row];
  if (vec4) {
    for (int q = lane; q < cols / 4; q += 32) {
      const int64_t at = row * cols + 4 * q;
      const uchar4 c = *reinterpret_cast<const uchar4*>(codes + at);
      *reinterpret_cast<float4*>(out + at) =
          make_float4(fp8_decode_scaled(c.x, scale, fs), fp8_decode_scaled(c.y, scale, fs),
                      fp8_decode_scaled(c.z, scale, fs), fp8_decode_scaled(c.w, scale, fs));
    }
  } else {
    for (int c = lane; c < cols; c += 32) {
      const int64_t at = row * cols + c;
      out[at] = fp8_decode_scaled(codes[at], scale, fs);
    }
  }
}

class Fp8Twin final : public FormatTwin {
 public:
  explicit Fp8Twin(const Fp8Spec& spec) : spec_(spec) {
    ks_.mode = spec.scale;
    ks_.static_scale = spec.static_scale;
  }

  std::string name() const override { return spec_.name(); }

  CodeBytes code_bytes(SpanBatch b) const override {
    size_t meta = 0;
    if (spec_.scale == Fp8Scale::Calibrated) meta = static_cast<size_t>(b.spans) * sizeof(float);
    if (spec_.scale == Fp8Scale::PerToken) meta = static_cast<size_t>(b.spans * b.rows) * sizeof(float);
    return {static_cast<size_t>(b.elements()), meta};
  }

  void quantize(const float* x, SpanBatch b, void* codes, void* meta, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    float* scales = static_cast<float*>(meta);
    if (spec_.scale == Fp8Scale::Calibrated) span_scales(x, b, scales, stream);
    launch<Fp8Out::Codes>(x, b, scales, static_cast<uint8_t*>(codes), scales, nullptr, stream);
  }

  void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    float* scales = nullptr;
    if (spec_.scale == Fp8Scale::Calibrated) {
      scratch_.reserve(static_cast<size_t>(b.spans));
      scales = scratch_.data();
      span_scales(x, b, scales, stream);
    }
    launch<Fp8Out::Values>(x, b, scales, nullptr, nullptr, out, stream);
  }

  void dequantize(const void* codes, const void* meta, SpanBatch b, float* out, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    const int64_t total_rows = b.spans * b.rows;
    const bool vec4 = b.cols % 4 == 0 && tile::aligned(codes, 4) && tile::aligned(out, 16);
    auto kernel = spec_.e5m2 ? fp8_dequantize_kernel<true> : fp8_dequantize_kernel<false>;
    kernel<<<grid(total_rows), kThreads, 0, stream>>>(static_cast<const uint8_t*>(codes),
                                                      static_cast<const float*>(meta), total_rows, b.rows,
                                                      static_cast<int>(b.cols), ks_, vec4, out);
    KVB_CUDA_CHECK_LAUNCH(fp8_dequantize_kernel);
  }

 private:
  static unsigned grid(int64_t rows) { return static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32)); }

  // -cal<N>: each span's scale from the max |x| of its first min(rows, N) rows.
  void span_scales(const float* x, SpanBatch b, float* scales, cudaStream_t stream) const {
    amax_.reserve(static_cast<size_t>(b.spans));
    const int64_t count = std::min(b.rows, spec_.calibration_tokens) * b.cols;
    tile::launch_span_scales(x, b.spans, b.rows * b.cols, count, Fp8ScaleRule{fp8_minifloat(spec_.e5m2)}, amax_.data(),
                             scales, stream);
  }

  template <Fp8Out kOut>
  void launch(const float* x, SpanBatch b, const float* span_scales, uint8_t* codes, float* row_scales, float* out,
              cudaStream_t stream) const {
    if (b.cols > INT32_MAX / 2) throw Error("format '" + name() + "': head_dim too large for the CUDA twin");
    const bool vec4 = b.cols % 4 == 0 && tile::aligned(x, 16) &&
                      (kOut == Fp8Out::Codes ? tile::aligned(codes, 4) : tile::aligned(out, 16));
    if (spec_.scale == Fp8Scale::PerToken) {
      const int64_t total_rows = b.spans * b.rows;
      auto kernel = spec_.e5m2 ? fp8_token_rows_kernel<kOut, true> : fp8_token_rows_kernel<kOut, false>;
      kernel<<<grid(total_rows), kThreads, 0, stream>>>(x, total_rows, static_cast<int>(b.cols), vec4, codes,
                                                        row_scales, out);
      KVB_CUDA_CHECK_LAUNCH(fp8_token_rows_kernel);
      return;
    }
    const int64_t span_elems = b.rows * b.cols;
    const int64_t per_thread = vec4 ? 4 : 1;
    const int64_t blocks = (span_elems / per_thread + kThreads - 1) / kThreads;
    if (blocks > INT32_MAX) throw Error("format '" + name() + "': span too large for the CUDA twin");
    const dim3 span_grid(static_cast<unsigned>(blocks), static_cast<unsigned>(std::min<int64_t>(b.spans, 65535)));
    auto kernel = spec_.e5m2 ? fp8_span_kernel<kOut, true> : fp8_span_kernel<kOut, false>;
    kernel<<<span_grid, kThreads, 0, stream>>>(x, b.spans, span_elems, ks_, vec4, span_scales, codes, out);
    KVB_CUDA_CHECK_LAUNCH(fp8_span_kernel);
  }

  Fp8Spec spec_;
  Fp8KernelSpec ks_;
  mutable DeviceBuffer<unsigned> amax_;   // per-span max |x| bits (-cal)
  mutable DeviceBuffer<float> scratch_;   // span scales of a round trip (-cal)
};

}  // namespace

std::unique_ptr<FormatTwin> make_fp8_twin(const Format& format) {
  const auto* f = dynamic_cast<const Fp8Format*>(&format);
  if (!f) return nullptr;
  return std::make_unique<Fp8Twin>(f->spec());
}

}  // namespace kvb::cuda
