#include "kernels/fp4_twin.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/block_tile.cuh"
#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "sim/core/error.h"
#include "sim/formats/fp4_format.h"
#include "sim/formats/fp_blocks.h"

namespace kvb::cuda {

namespace {

using tile::kThreads;
constexpr int kTileBlocks = kThreads;  // one block per thread

enum class Fp4Out { Codes, Values };

struct NvTensorScale {
  __device__ float operator()(float span_amax) const { return nvfp4_tensor_scale(span_amax); }
};

// Span of block gb, for blocks of a tile starting at block b0.
__device__ __forceinline__ int64_t span_of(int64_t gb, int64_t b0, int64_t blocks_per_span) {
  if (blocks_per_span >= kTileBlocks) {  // a tile crosses at most one span boundary
    const int64_t s0 = b0 / blocks_per_span;
    return s0 + (gb >= (s0 + 1) * blocks_per_span ? 1 : 0);
  }
  return gb / blocks_per_span;
}

template <int B>
constexpr size_t tile_smem() {
  return static_cast<size_t>(kTileBlocks) * (B + 1) * sizeof(float);
}

// Quantize (each thread packs its block's codes into B / 2 bytes, one 16- or 8-byte
// store, and writes its scale byte) or round trip (in place in the tile, then 16-byte
// stores). One thread per block reads it from the padded tile. B = 32: mxfp4, 16: nvfp4
// (tensor_scales: one per span).
template <int B, Fp4Out kOut>
__global__ void __launch_bounds__(kThreads)
    fp4_quantize_kernel(const float* __restrict__ x, int64_t total_blocks, int64_t blocks_per_span, bool vec4,
                        const float* __restrict__ tensor_scales, uint8_t* __restrict__ codes,
                        uint8_t* __restrict__ scales, float* __restrict__ out) {
  extern __shared__ __align__(16) float tile_x[];
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kTileBlocks;
  const int nb = static_cast<int>(min(static_cast<int64_t>(kTileBlocks), total_blocks - b0));
  const int n = nb * B;
  tile::load_tile(x + b0 * B, n, B, vec4, tile_x);
  __syncthreads();
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    float* xs = tile_x + i * (B + 1);
    const int64_t gb = b0 + i;
    if constexpr (B == kMxfp4Block) {
      if constexpr (kOut == Fp4Out::Codes) {
        uint8_t e, c[B];
        mxfp4_quantize_block(xs, e, c);
        tile::store_nibbles<B>(c, codes + gb * (B / 2));
        scales[gb] = e;
      } else {
        mxfp4_roundtrip_block(xs, xs);
      }
    } else {
      const float g = tensor_scales[span_of(gb, b0, blocks_per_span)];
      if constexpr (kOut == Fp4Out::Codes) {
        uint8_t s, c[B];
        nvfp4_quantize_block(xs, g, s, c);
        tile::store_nibbles<B>(c, codes + gb * (B / 2));
        scales[gb] = s;
      } else {
        nvfp4_roundtrip_block(xs, g, xs);
      }
    }
  }
  if constexpr (kOut == Fp4Out::Values) {
    __syncthreads();
    tile::store_tile(tile_x, n, B, vec4, out + b0 * B);
  }
}

// Dequantize: one thread per block unpacks its codes (one 16- or 8-byte load) and
// decodes into the padded tile, then 16-byte stores.
template <int B>
__global__ void __launch_bounds__(kThreads)
    fp4_dequantize_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                          const float* __restrict__ tensor_scales, int64_t total_blocks, int64_t blocks_per_span,
                          bool vec4, float* __restrict__ out) {
  extern __shared__ __align__(16) float tile_x[];
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kTileBlocks;
  const int nb = static_cast<int>(min(static_cast<int64_t>(kTileBlocks), total_blocks - b0));
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    const int64_t gb = b0 + i;
    uint8_t c[B];
    tile::load_nibbles<B>(codes + gb * (B / 2), c);
    if constexpr (B == kMxfp4Block)
      mxfp4_dequantize_block(scales[gb], c, tile_x + i * (B + 1));
    else
      nvfp4_dequantize_block(scales[gb], tensor_scales[span_of(gb, b0, blocks_per_span)], c, tile_x + i * (B + 1));
  }
  __syncthreads();
  tile::store_tile(tile_x, nb * B, B, vec4, out + b0 * B);
}

class Fp4Twin final : public FormatTwin {
 public:
  explicit Fp4Twin(bool nv) : nv_(nv) {}

  std::string name() const override { return nv_ ? "nvfp4" : "mxfp4"; }

  CodeBytes code_bytes(SpanBatch b) const override {
    const int64_t nb = blocks(b);
    return {static_cast<size_t>(b.elements() / 2), static_cast<size_t>(nb) + (nv_ ? 4 * static_cast<size_t>(b.spans) : 0)};
  }

  void quantize(const float* x, SpanBatch b, void* codes, void* meta, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    uint8_t* m = static_cast<uint8_t*>(meta);
    if (nv_) {
      float* g = reinterpret_cast<float*>(m);
      tensor_scales(x, b, g, stream);
      launch<16, Fp4Out::Codes>(x, b, g, static_cast<uint8_t*>(codes), m + 4 * b.spans, nullptr, stream);
    } else {
      launch<32, Fp4Out::Codes>(x, b, nullptr, static_cast<uint8_t*>(codes), m, nullptr, stream);
    }
  }

  void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    if (nv_) {
      g_scratch_.reserve(static_cast<size_t>(b.spans));
      tensor_scales(x, b, g_scratch_.data(), stream);
      launch<16, Fp4Out::Values>(x, b, g_scratch_.data(), nullptr, nullptr, out, stream);
    } else {
      launch<32, Fp4Out::Values>(x, b, nullptr, nullptr, nullptr, out, stream);
    }
  }

  void dequantize(const void* codes, const void* meta, SpanBatch b, float* out, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    const uint8_t* m = static_cast<const uint8_t*>(meta);
    const int64_t nb = blocks(b);
    const int64_t per_span = nb / b.spans;
    const bool vec4 = tile::aligned(out, 16);
    const auto* c = static_cast<const uint8_t*>(codes);
    if (nv_) {
      fp4_dequantize_kernel<16><<<grid(nb), kThreads, tile_smem<16>(), stream>>>(
          c, m + 4 * b.spans, reinterpret_cast<const float*>(m), nb, per_span, vec4, out);
    } else {
      fp4_dequantize_kernel<32><<<grid(nb), kThreads, tile_smem<32>(), stream>>>(c, m, nullptr, nb, per_span, vec4, out);
    }
    KVB_CUDA_CHECK_LAUNCH(fp4_dequantize_kernel);
  }

 private:
  int block() const { return nv_ ? kNvfp4Block : kMxfp4Block; }
  int64_t blocks(SpanBatch b) const {
    if (b.cols % block() != 0)
      throw Error("format '" + name() + "': blocks of " + std::to_string(block()) + " do not divide head_dim " +
                  std::to_string(b.cols));
    return b.elements() / block();
  }
  static unsigned grid(int64_t nb) { return static_cast<unsigned>((nb + kTileBlocks - 1) / kTileBlocks); }

  // NVFP4's tensor scale of every span, from the span's max |x|.
  void tensor_scales(const float* x, SpanBatch b, float* g, cudaStream_t stream) const {
    amax_.reserve(static_cast<size_t>(b.spans));
    tile::launch_span_scales(x, b.spans, b.rows * b.cols, b.rows * b.cols, NvTensorScale{}, amax_.data(), g, stream);
  }

  template <int B, Fp4Out kOut>
  void launch(const float* x, SpanBatch b, const float* g, uint8_t* codes, uint8_t* scales, float* out,
              cudaStream_t stream) const {
    const int64_t nb = blocks(b);
    const bool vec4 = tile::aligned(x, 16) && (kOut == Fp4Out::Codes || tile::aligned(out, 16));
    fp4_quantize_kernel<B, kOut><<<grid(nb), kThreads, tile_smem<B>(), stream>>>(x, nb, nb / b.spans, vec4, g, codes,
                                                                                   scales, out);
    KVB_CUDA_CHECK_LAUNCH(fp4_quantize_kernel);
  }

  bool nv_;
  mutable DeviceBuffer<unsigned> amax_;     // per-span max |x| bits
  mutable DeviceBuffer<float> g_scratch_;   // NVFP4 tensor scales of a round trip
};

}  // namespace

std::unique_ptr<FormatTwin> make_fp4_twin(const Format& format) {
  const auto* f = dynamic_cast<const Fp4Format*>(&format);
  if (!f) return nullptr;
  return std::make_unique<Fp4Twin>(f->nv());
}

}  // namespace kvb::cuda
