#include "kernels/nf4_twin.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/block_tile.cuh"
#include "kernels/cuda_check.h"
#include "sim/core/error.h"
#include "sim/formats/nf4_block.h"
#include "sim/formats/nf4_format.h"

namespace kvb::cuda {

namespace {

using tile::kThreads;
constexpr int kTileFloats = 8192;  // values of x per tile (at least two groups)

struct Nf4KernelSpec {
  int G = 64;
  StoreDtype dt = StoreDtype::F16;
  float thresholds[15];  // nf4_threshold(0..14)
};

enum class Nf4Out { Codes, Values };

// Groups per tile: whole groups, an even number (so that a tile starts on a byte of
// the nibble-packed codes even for odd G).
int tile_groups_for(int G) { return std::max(2, kTileFloats / G / 2 * 2); }

size_t quantize_smem(int G, int tile_groups) {
  return static_cast<size_t>(tile_groups) * (G + 1) * sizeof(float) + 2 * static_cast<size_t>(tile_groups) * sizeof(float) +
         16 * sizeof(float);
}

__device__ __forceinline__ void store_scale(void* meta, int64_t g, float s, StoreDtype dt) {
  if (dt == StoreDtype::F32) static_cast<uint32_t*>(meta)[g] = store_bits(s, dt);
  else static_cast<uint16_t*>(meta)[g] = static_cast<uint16_t>(store_bits(s, dt));
}
__device__ __forceinline__ float load_scale(const void* meta, int64_t g, StoreDtype dt) {
  if (dt == StoreDtype::F32) return store_bits_value(static_cast<const uint32_t*>(meta)[g], dt);
  return store_bits_value(static_cast<const uint16_t*>(meta)[g], dt);
}

// Quantize or round trip a tile of groups: the tile is staged in shared memory (one
// pad float per group, so a group is G contiguous floats), one thread per group
// computes its stored scale (nf4_group_scale, channel order) and 1/scale, then one
// thread per four values (G % 4 == 0) or per two values (otherwise) writes their
// packed indices (coalesced 2- or 1-byte stores) or decoded values (16-byte stores).
// Codes come from nf4_encode's search over a shared copy of the thresholds, the round
// trip's from nf4_encode_counted (the same codes): measured on an H100, counting is the
// faster of the two for the round trip and the slower for quantize (57 % of copy
// bandwidth against the search's 77 %).
template <Nf4Out kOut>
__global__ void __launch_bounds__(kThreads)
    nf4_quantize_kernel(const float* __restrict__ x, int64_t total_groups, int tile_groups, bool vec4,
                        Nf4KernelSpec spec, uint8_t* __restrict__ codes, void* __restrict__ meta,
                        float* __restrict__ out) {
  extern __shared__ __align__(16) float smem[];
  const int G = spec.G;
  float* tile_x = smem;
  float* scale = tile_x + tile_groups * (G + 1);
  float* inv = scale + tile_groups;
  // The thresholds, read at constant indices only (any other index would copy the whole
  // spec to local memory in every thread): into registers for nf4_encode_counted, and
  // by thread 0 into shared memory for nf4_encode's search.
  float thr_regs[15];
#pragma unroll
  for (int i = 0; i < 15; ++i) thr_regs[i] = spec.thresholds[i];
  float* thr = inv + tile_groups;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 15; ++i) thr[i] = thr_regs[i];
  }
  const int64_t g0 = static_cast<int64_t>(blockIdx.x) * tile_groups;
  const int ng = static_cast<int>(min(static_cast<int64_t>(tile_groups), total_groups - g0));
  const int n = ng * G;
  const int64_t e0 = g0 * G;  // first element of the tile (even)
  const bool quads = vec4 && G % 4 == 0;
  tile::load_tile(x + e0, n, G, quads, tile_x);
  __syncthreads();
  for (int i = threadIdx.x; i < ng; i += blockDim.x) {
    const float s = nf4_group_scale(tile_x + i * (G + 1), G, spec.dt);
    scale[i] = s;
    inv[i] = nf4_inverse_scale(s);
    if (kOut == Nf4Out::Codes) store_scale(meta, g0 + i, s, spec.dt);
  }
  __syncthreads();
  if (quads) {
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x) {
      const int gi = 4 * q / G;
      const float* t = tile_x + tile::padded(4 * q, G);
      const float iv = inv[gi];
      int c[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        c[k] = kOut == Nf4Out::Codes ? nf4_encode(t[k], iv, thr) : nf4_encode_counted(t[k], iv, thr_regs);
      if (kOut == Nf4Out::Codes) {
        reinterpret_cast<uint16_t*>(codes + e0 / 2)[q] = static_cast<uint16_t>(c[0] | (c[1] << 4) | (c[2] << 8) | (c[3] << 12));
      } else {
        const float s = scale[gi];
        reinterpret_cast<float4*>(out + e0)[q] =
            make_float4(nf4_decode(c[0], s), nf4_decode(c[1], s), nf4_decode(c[2], s), nf4_decode(c[3], s));
      }
    }
  } else {
    for (int k = threadIdx.x; k < (n + 1) / 2; k += blockDim.x) {
      int byte = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 2 * k + h;
        if (e >= n) break;
        const int gi = e / G;
        const int c = nf4_encode(tile_x[tile::padded(e, G)], inv[gi], thr);
        byte |= c << (4 * h);
        if (kOut == Nf4Out::Values) out[e0 + e] = nf4_decode(c, scale[gi]);
      }
      if (kOut == Nf4Out::Codes) codes[e0 / 2 + k] = static_cast<uint8_t>(byte);
    }
  }
}

// Dequantize a tile of groups: the tile's scales into shared memory, then one thread
// per four values (2-byte code loads, 16-byte stores) or per value.
__global__ void __launch_bounds__(kThreads)
    nf4_dequantize_kernel(const uint8_t* __restrict__ codes, const void* __restrict__ meta, int64_t total_groups,
                          int tile_groups, bool vec4, Nf4KernelSpec spec, float* __restrict__ out) {
  extern __shared__ __align__(16) float scale[];
  const int G = spec.G;
  const int64_t g0 = static_cast<int64_t>(blockIdx.x) * tile_groups;
  const int ng = static_cast<int>(min(static_cast<int64_t>(tile_groups), total_groups - g0));
  const int n = ng * G;
  const int64_t e0 = g0 * G;
  for (int i = threadIdx.x; i < ng; i += blockDim.x) scale[i] = load_scale(meta, g0 + i, spec.dt);
  __syncthreads();
  if (vec4 && G % 4 == 0) {
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x) {
      const uint32_t cw = reinterpret_cast<const uint16_t*>(codes + e0 / 2)[q];
      const float s = scale[4 * q / G];
      reinterpret_cast<float4*>(out + e0)[q] = make_float4(nf4_decode(cw & 15u, s), nf4_decode((cw >> 4) & 15u, s),
                                                           nf4_decode((cw >> 8) & 15u, s), nf4_decode(cw >> 12, s));
    }
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      const int c = (codes[(e0 + e) / 2] >> (4 * ((e0 + e) & 1))) & 15;
      out[e0 + e] = nf4_decode(c, scale[e / G]);
    }
  }
}

class Nf4Twin final : public FormatTwin {
 public:
  Nf4Twin(int64_t group, StoreDtype dt, std::string name) : name_(std::move(name)) {
    if (group > 16384) throw Error("format '" + name_ + "': group too large for the CUDA twin");
    spec_.G = static_cast<int>(group);
    spec_.dt = dt;
    for (int i = 0; i < 15; ++i) spec_.thresholds[i] = nf4_threshold(i);
  }

  std::string name() const override { return name_; }

  CodeBytes code_bytes(SpanBatch b) const override {
    return {static_cast<size_t>((b.elements() + 1) / 2),
            static_cast<size_t>(groups(b)) * static_cast<size_t>(store_dtype_bits(spec_.dt) / 8)};
  }

  void quantize(const float* x, SpanBatch b, void* codes, void* meta, cudaStream_t stream) const override {
    run<Nf4Out::Codes>(x, b, static_cast<uint8_t*>(codes), meta, nullptr, stream);
  }

  void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const override {
    run<Nf4Out::Values>(x, b, nullptr, nullptr, out, stream);
  }

  void dequantize(const void* codes, const void* meta, SpanBatch b, float* out, cudaStream_t stream) const override {
    const int64_t ng = groups(b);
    if (ng == 0) return;
    const int tg = tile_groups_for(spec_.G);
    const bool vec4 = tile::aligned(out, 16) && tile::aligned(codes, 2);
    nf4_dequantize_kernel<<<grid(ng, tg), kThreads, static_cast<size_t>(tg) * sizeof(float), stream>>>(
        static_cast<const uint8_t*>(codes), meta, ng, tg, vec4, spec_, out);
    KVB_CUDA_CHECK_LAUNCH(nf4_dequantize_kernel);
  }

 private:
  int64_t groups(SpanBatch b) const {
    if (b.cols % spec_.G != 0)
      throw Error("format '" + name_ + "': group size " + std::to_string(spec_.G) + " does not divide head_dim " +
                  std::to_string(b.cols));
    return b.elements() / spec_.G;
  }
  static unsigned grid(int64_t ng, int tg) { return static_cast<unsigned>((ng + tg - 1) / tg); }

  template <Nf4Out kOut>
  void run(const float* x, SpanBatch b, uint8_t* codes, void* meta, float* out, cudaStream_t stream) const {
    const int64_t ng = groups(b);
    if (ng == 0) return;
    const int tg = tile_groups_for(spec_.G);
    const size_t smem = quantize_smem(spec_.G, tg);
    const bool vec4 = tile::aligned(x, 16) && (kOut == Nf4Out::Codes ? tile::aligned(codes, 2) : tile::aligned(out, 16));
    auto kernel = nf4_quantize_kernel<kOut>;
    tile::allow_smem(kernel, smem);
    kernel<<<grid(ng, tg), kThreads, smem, stream>>>(x, ng, tg, vec4, spec_, codes, meta, out);
    KVB_CUDA_CHECK_LAUNCH(nf4_quantize_kernel);
  }

  std::string name_;
  Nf4KernelSpec spec_;
};

}  // namespace

std::unique_ptr<FormatTwin> make_nf4_twin(const Format& format) {
  const auto* f = dynamic_cast<const Nf4Format*>(&format);
  if (!f) return nullptr;
  return std::make_unique<Nf4Twin>(f->group(), f->scale_dtype(), f->name());
}

}  // namespace kvb::cuda
