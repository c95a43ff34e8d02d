#include "kernels/ggml_twin.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/block_tile.cuh"
#include "kernels/cuda_check.h"
#include "sim/core/error.h"
#include "sim/formats/ggml_blocks.h"
#include "sim/formats/ggml_format.h"

namespace kvb::cuda {

namespace {

using tile::kThreads;
constexpr int kB = kGgmlBlock;       // 32 values per block
constexpr int kTileBlocks = kThreads;  // one block of 32 per thread: 8192 floats per tile

// The block functions of ggml_blocks.h by block type.
template <class Block>
struct GgmlOps;
template <>
struct GgmlOps<GgmlBlockQ4_0> {
  __device__ static void quantize(const float* x, GgmlBlockQ4_0& b, int) { ggml_quantize_q4_0(x, b); }
  __device__ static void dequantize(const GgmlBlockQ4_0& b, float* y) { ggml_dequantize_q4_0(b, y); }
};
template <>
struct GgmlOps<GgmlBlockQ4_1> {
  __device__ static void quantize(const float* x, GgmlBlockQ4_1& b, int) { ggml_quantize_q4_1(x, b); }
  __device__ static void dequantize(const GgmlBlockQ4_1& b, float* y) { ggml_dequantize_q4_1(b, y); }
};
template <>
struct GgmlOps<GgmlBlockQ5_0> {
  __device__ static void quantize(const float* x, GgmlBlockQ5_0& b, int) { ggml_quantize_q5_0(x, b); }
  __device__ static void dequantize(const GgmlBlockQ5_0& b, float* y) { ggml_dequantize_q5_0(b, y); }
};
template <>
struct GgmlOps<GgmlBlockQ5_1> {
  __device__ static void quantize(const float* x, GgmlBlockQ5_1& b, int) { ggml_quantize_q5_1(x, b); }
  __device__ static void dequantize(const GgmlBlockQ5_1& b, float* y) { ggml_dequantize_q5_1(b, y); }
};
template <>
struct GgmlOps<GgmlBlockQ8_0> {
  __device__ static void quantize(const float* x, GgmlBlockQ8_0& b, int) { ggml_quantize_q8_0(x, b); }
  __device__ static void dequantize(const GgmlBlockQ8_0& b, float* y) { ggml_dequantize_q8_0(b, y); }
};
template <>
struct GgmlOps<GgmlBlockIQ4NL> {
  __device__ static void quantize(const float* x, GgmlBlockIQ4NL& b, int ntry) { ggml_quantize_iq4_nl(x, b, ntry); }
  __device__ static void dequantize(const GgmlBlockIQ4NL& b, float* y) { ggml_dequantize_iq4_nl(b, y); }
};

// Shared memory of a tile: the block bytes (16-byte aligned), then the padded floats.
template <class Block>
constexpr size_t block_bytes_smem() {
  return (static_cast<size_t>(kTileBlocks) * sizeof(Block) + 15) / 16 * 16;
}
template <class Block>
constexpr size_t tile_smem() {
  return block_bytes_smem<Block>() + static_cast<size_t>(kTileBlocks) * (kB + 1) * sizeof(float);
}

enum class GgmlOut { Codes, Values };

// Quantize (codes: the tile's blocks staged in shared memory, then copied out with
// 16-byte stores) or round trip (values: dequantized in place in the tile, then
// stored with 16-byte stores). One thread per block of 32 reads it from the padded
// tile (conflict-free: block i starts at float 33 i).
template <class Block, GgmlOut kOut>
__global__ void __launch_bounds__(kThreads)
    ggml_quantize_kernel(const float* __restrict__ x, int64_t total_blocks, bool vec4, int ntry,
                         uint8_t* __restrict__ codes, float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sblocks = smem;
  float* tile_x = reinterpret_cast<float*>(smem + block_bytes_smem<Block>());
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kTileBlocks;
  const int nb = static_cast<int>(min(static_cast<int64_t>(kTileBlocks), total_blocks - b0));
  const int n = nb * kB;
  tile::load_tile(x + b0 * kB, n, kB, vec4, tile_x);
  __syncthreads();
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    float* xs = tile_x + i * (kB + 1);
    Block blk;
    GgmlOps<Block>::quantize(xs, blk, ntry);
    if (kOut == GgmlOut::Codes) *reinterpret_cast<Block*>(sblocks + i * sizeof(Block)) = blk;
    else GgmlOps<Block>::dequantize(blk, xs);
  }
  __syncthreads();
  if (kOut == GgmlOut::Codes) tile::copy_bytes(sblocks, codes + b0 * static_cast<int64_t>(sizeof(Block)), nb * sizeof(Block));
  else tile::store_tile(tile_x, n, kB, vec4, out + b0 * kB);
}

// Dequantize: the tile's blocks copied in (16-byte loads), one thread per block
// decodes into the padded tile, then 16-byte stores.
template <class Block>
__global__ void __launch_bounds__(kThreads)
    ggml_dequantize_kernel(const uint8_t* __restrict__ codes, int64_t total_blocks, bool vec4, float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sblocks = smem;
  float* tile_x = reinterpret_cast<float*>(smem + block_bytes_smem<Block>());
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kTileBlocks;
  const int nb = static_cast<int>(min(static_cast<int64_t>(kTileBlocks), total_blocks - b0));
  tile::copy_bytes(codes + b0 * static_cast<int64_t>(sizeof(Block)), sblocks, nb * sizeof(Block));
  __syncthreads();
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    const Block blk = *reinterpret_cast<const Block*>(sblocks + i * sizeof(Block));
    GgmlOps<Block>::dequantize(blk, tile_x + i * (kB + 1));
  }
  __syncthreads();
  tile::store_tile(tile_x, nb * kB, kB, vec4, out + b0 * kB);
}

class GgmlTwin final : public FormatTwin {
 public:
  GgmlTwin(GgmlType type, int ntry, std::string name) : type_(type), ntry_(ntry), name_(std::move(name)) {}

  std::string name() const override { return name_; }

  CodeBytes code_bytes(SpanBatch b) const override {
    return {static_cast<size_t>(blocks(b)) * static_cast<size_t>(ggml_block_bytes(type_)), 0};
  }

  void quantize(const float* x, SpanBatch b, void* codes, void*, cudaStream_t stream) const override {
    dispatch([&](auto tag) { run<decltype(tag), GgmlOut::Codes>(x, b, static_cast<uint8_t*>(codes), nullptr, stream); });
  }

  void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const override {
    dispatch([&](auto tag) { run<decltype(tag), GgmlOut::Values>(x, b, nullptr, out, stream); });
  }

  void dequantize(const void* codes, const void*, SpanBatch b, float* out, cudaStream_t stream) const override {
    dispatch([&](auto tag) {
      using Block = decltype(tag);
      const int64_t nb = blocks(b);
      if (nb == 0) return;
      auto kernel = ggml_dequantize_kernel<Block>;
      tile::allow_smem(kernel, tile_smem<Block>());
      kernel<<<grid(nb), kThreads, tile_smem<Block>(), stream>>>(static_cast<const uint8_t*>(codes), nb,
                                                                 tile::aligned(out, 16), out);
      KVB_CUDA_CHECK_LAUNCH(ggml_dequantize_kernel);
    });
  }

 private:
  int64_t blocks(SpanBatch b) const {
    if (b.cols % kB != 0) throw Error("format '" + name_ + "': ggml blocks of 32 do not divide head_dim " + std::to_string(b.cols));
    return b.elements() / kB;
  }
  static unsigned grid(int64_t nb) { return static_cast<unsigned>((nb + kTileBlocks - 1) / kTileBlocks); }

  template <class F>
  void dispatch(F&& f) const {
    switch (type_) {
      case GgmlType::Q4_0: f(GgmlBlockQ4_0{}); break;
      case GgmlType::Q4_1: f(GgmlBlockQ4_1{}); break;
      case GgmlType::Q5_0: f(GgmlBlockQ5_0{}); break;
      case GgmlType::Q5_1: f(GgmlBlockQ5_1{}); break;
      case GgmlType::Q8_0: f(GgmlBlockQ8_0{}); break;
      case GgmlType::IQ4_NL: f(GgmlBlockIQ4NL{}); break;
    }
  }

  template <class Block, GgmlOut kOut>
  void run(const float* x, SpanBatch b, uint8_t* codes, float* out, cudaStream_t stream) const {
    const int64_t nb = blocks(b);
    if (nb == 0) return;
    const bool vec4 = tile::aligned(x, 16) && (kOut == GgmlOut::Codes || tile::aligned(out, 16));
    auto kernel = ggml_quantize_kernel<Block, kOut>;
    tile::allow_smem(kernel, tile_smem<Block>());
    kernel<<<grid(nb), kThreads, tile_smem<Block>(), stream>>>(x, nb, vec4, ntry_, codes, out);
    KVB_CUDA_CHECK_LAUNCH(ggml_quantize_kernel);
  }

  GgmlType type_;
  int ntry_;
  std::string name_;
};

}  // namespace

std::unique_ptr<FormatTwin> make_ggml_twin(const Format& format) {
  const auto* f = dynamic_cast<const GgmlFormat*>(&format);
  if (!f) return nullptr;
  return std::make_unique<GgmlTwin>(f->type(), f->ntry(), f->name());
}

}  // namespace kvb::cuda
