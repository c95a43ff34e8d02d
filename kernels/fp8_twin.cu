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

constexpr int kThreads = 256;              // per block: 256 quads (span kernel), 8 to 32 rows (row kernels)
constexpr int kRegisterQuads = 4;          // rows of up to 512 values stay in registers
constexpr int kSpanQuads = 4;              // quads (single values when !vec4) per thread of the span kernel

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


// max over the kLanes lanes of each aligned group of kLanes lanes (all 32 lanes call it).
template <int kLanes>
__device__ __forceinline__ float lanes_max(float m) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) {
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
// grid (y: spans, x: the span's quads, or single elements when !vec4), kSpanQuads quads
// per thread (kThreads apart, so that each step of a warp is coalesced; all of a
// thread's loads in flight at once), as lean as a copy; the scale's divisor is made
// once per thread and span.
template <Fp8Out kOut, bool kE5M2>
__global__ void __launch_bounds__(kThreads)
    fp8_span_kernel(const float* __restrict__ x, int64_t spans, int64_t span_elems, Fp8KernelSpec ks, bool vec4,
                    const float* __restrict__ span_scales, uint8_t* __restrict__ codes, float* __restrict__ out) {
  const MinifloatSpec fs = fp8_minifloat(kE5M2);
  // First quad (or element) of this thread in each span; then + k kThreads.
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * (kThreads * kSpanQuads) + threadIdx.x;
  const int64_t units = vec4 ? span_elems / 4 : span_elems;  // vec4: span_elems % 4 == 0
  if (i0 >= units) return;  // no block-wide synchronisation below
  for (int64_t span = blockIdx.y; span < spans; span += gridDim.y) {
    const ScaleDivisor scale = scale_divisor(ks.mode == Fp8Scale::Static ? ks.static_scale : span_scales[span]);
    const int64_t base = span * span_elems;
    if (vec4) {
      float4 v[kSpanQuads];
#pragma unroll
      for (int k = 0; k < kSpanQuads; ++k) {
        const int64_t i = i0 + k * kThreads;
        v[k] = i < units ? reinterpret_cast<const float4*>(x + base)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kSpanQuads; ++k) {
        const int64_t i = i0 + k * kThreads;
        if (i < units) put_quad<kOut>(v[k], scale, fs, base + 4 * i, codes, out);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kSpanQuads; ++k) {
        const int64_t i = i0 + k * kThreads;
        if (i < units) put_one<kOut>(x[base + i], scale, fs, base + i, codes, out);
      }
    }
  }
}

// Per-token scales: kLanes lanes per row (8, 16 or 32: the fewest that hold the row in
// kRegisterQuads float4s each when vec4, else 32), the row's max |x| by a reduction
// over those lanes (max |x| is the same in any order), then codes (4-byte stores, the
// scale to row_scales) or round-trip values (16-byte stores) of four values per lane and
// step. Fewer lanes per row spread the per-row work (reduction, scale, its reciprocal)
// over more values; lane l of a row takes quads l, l + kLanes, ..., so that the lanes of
// a row read 16 kLanes consecutive bytes per step.
template <Fp8Out kOut, bool kE5M2, int kLanes>
__global__ void __launch_bounds__(kThreads)
    fp8_token_rows_kernel(const float* __restrict__ x, int64_t total_rows, int cols, bool vec4,
                          uint8_t* __restrict__ codes, float* __restrict__ row_scales, float* __restrict__ out) {
  static_assert(kLanes == 8 || kLanes == 16 || kLanes == 32, "8, 16 or 32 lanes per row");
  const int lane = threadIdx.x & (kLanes - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
  // Lanes past the last row stay until the reduction (its shuffles take the whole warp).
  const bool valid = row < total_rows;
  const MinifloatSpec fs = fp8_minifloat(kE5M2);
  const float* xr = x + (valid ? row : 0) * cols;
  // The row's scale from its max |x|, stored (codes) by the row's first lane.
  auto token_scale = [&](float m) {
    const float s = fp8_scale_from_absmax(lanes_max<kLanes>(m), fs);
    if (kOut == Fp8Out::Codes && valid && lane == 0) row_scales[row] = s;
    return scale_divisor(s);
  };
  if (vec4 && cols <= 4 * kLanes * kRegisterQuads) {
    const int quads = valid ? cols / 4 : 0;
    float4 v[kRegisterQuads];
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < kRegisterQuads; ++k) {
      const int q = lane + kLanes * k;
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
      const int q = lane + kLanes * k;
      if (q < quads) put_quad<kOut>(v[k], scale, fs, row * cols + 4 * q, codes, out);
    }
    return;
  }
  if constexpr (kLanes == 32) {  // the launch picks 32 lanes whenever this path runs
    float m = 0.0f;
    if (valid)
      for (int c = lane; c < cols; c += 32) m = m < absf(xr[c]) ? absf(xr[c]) : m;
    const ScaleDivisor scale = token_scale(m);
    if (valid)
      for (int c = lane; c < cols; c += 32) put_one<kOut>(xr[c], scale, fs, row * cols + c, codes, out);
  }
}

// Dequantize: kLanes lanes per row as in the per-token kernel (fewest that take the
// row in kRegisterQuads steps when vec4), four codes per lane and step (4-byte loads,
// all of a lane's loads in flight before its 16-byte stores); else a warp per row.
template <bool kE5M2, int kLanes>
__global__ void __launch_bounds__(kThreads)
    fp8_dequantize_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales, int64_t total_rows,
                          int64_t rows_per_span, int cols, Fp8KernelSpec ks, bool vec4, float* __restrict__ out) {
  const int lane = threadIdx.x & (kLanes - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
  if (row >= total_rows) return;  // no shuffles below
  const MinifloatSpec fs = fp8_minifloat(kE5M2);
  const float scale = ks.mode == Fp8Scale::Static       ? ks.static_scale
                      : ks.mode == Fp8Scale::Calibrated ? scales[row / rows_per_span]
                                                        : scales[row];
  if (vec4 && cols <= 4 * kLanes * kRegisterQuads) {
    const int quads = cols / 4;
    uchar4 c[kRegisterQuads];
#pragma unroll
    for (int k = 0; k < kRegisterQuads; ++k) {
      const int q = lane + kLanes * k;
      c[k] = q < quads ? *reinterpret_cast<const uchar4*>(codes + row * cols + 4 * q) : make_uchar4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kRegisterQuads; ++k) {
      const int q = lane + kLanes * k;
      if (q < quads)
        *reinterpret_cast<float4*>(out + row * cols + 4 * q) =
            make_float4(fp8_decode_scaled(c[k].x, scale, fs), fp8_decode_scaled(c[k].y, scale, fs),
                        fp8_decode_scaled(c[k].z, scale, fs), fp8_decode_scaled(c[k].w, scale, fs));
    }
  } else if (vec4) {
    for (int q = lane; q < cols / 4; q += kLanes) {
      const int64_t at = row * cols + 4 * q;
      const uchar4 c = *reinterpret_cast<const uchar4*>(codes + at);
      *reinterpret_cast<float4*>(out + at) =
          make_float4(fp8_decode_scaled(c.x, scale, fs), fp8_decode_scaled(c.y, scale, fs),
                      fp8_decode_scaled(c.z, scale, fs), fp8_decode_scaled(c.w, scale, fs));
    }
  } else {
    for (int c = lane; c < cols; c += kLanes) {
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
    if (b.cols > INT32_MAX / 2) throw Error("format '" + name() + "': head_dim too large for the CUDA twin");
    const int64_t total_rows = b.spans * b.rows;
    const bool vec4 = b.cols % 4 == 0 && tile::aligned(codes, 4) && tile::aligned(out, 16);
    const int lanes = lanes_per_row(b.cols, vec4);
    auto kernel = spec_.e5m2 ? (lanes == 8    ? fp8_dequantize_kernel<true, 8>
                                : lanes == 16 ? fp8_dequantize_kernel<true, 16>
                                              : fp8_dequantize_kernel<true, 32>)
                             : (lanes == 8    ? fp8_dequantize_kernel<false, 8>
                                : lanes == 16 ? fp8_dequantize_kernel<false, 16>
                                              : fp8_dequantize_kernel<false, 32>);
    kernel<<<grid(total_rows, lanes), kThreads, 0, stream>>>(static_cast<const uint8_t*>(codes),
                                                             static_cast<const float*>(meta), total_rows, b.rows,
                                                             static_cast<int>(b.cols), ks_, vec4, out);
    KVB_CUDA_CHECK_LAUNCH(fp8_dequantize_kernel);
  }

 private:
  // Lanes per row of the row kernels: the fewest of 8, 16, 32 whose kRegisterQuads
  // float4s each hold a row (vec4), else 32.
  static int lanes_per_row(int64_t cols, bool vec4) {
    if (vec4 && cols <= 4 * 8 * kRegisterQuads) return 8;
    if (vec4 && cols <= 4 * 16 * kRegisterQuads) return 16;
    return 32;
  }
  unsigned grid(int64_t rows, int lanes) const {
    const int64_t rows_per_block = kThreads / lanes;
    const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (blocks > INT32_MAX) throw Error("format '" + name() + "': too many rows for the CUDA twin");
    return static_cast<unsigned>(blocks);
  }

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
      const int lanes = lanes_per_row(b.cols, vec4);
      auto kernel = spec_.e5m2 ? (lanes == 8    ? fp8_token_rows_kernel<kOut, true, 8>
                                  : lanes == 16 ? fp8_token_rows_kernel<kOut, true, 16>
                                                : fp8_token_rows_kernel<kOut, true, 32>)
                               : (lanes == 8    ? fp8_token_rows_kernel<kOut, false, 8>
                                  : lanes == 16 ? fp8_token_rows_kernel<kOut, false, 16>
                                                : fp8_token_rows_kernel<kOut, false, 32>);
      kernel<<<grid(total_rows, lanes), kThreads, 0, stream>>>(x, total_rows, static_cast<int>(b.cols), vec4, codes,
                                                               row_scales, out);
      KVB_CUDA_CHECK_LAUNCH(fp8_token_rows_kernel);
      return;
    }
    const int64_t span_elems = b.rows * b.cols;
    const int64_t per_thread = (vec4 ? 4 : 1) * kSpanQuads;
    const int64_t blocks = (span_elems + per_thread * kThreads - 1) / (per_thread * kThreads);
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
