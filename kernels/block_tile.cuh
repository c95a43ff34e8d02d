// Device helpers shared by the twins of block formats (ggml, fp4, nf4, fp8): staging
// tiles of consecutive blocks in shared memory, byte copies with the widest aligned
// accesses, and per-span absolute maxima. CUDA-only header (included by .cu files).
//
// A batch [spans, rows, cols] whose blocks of B consecutive elements never leave a row
// (B divides cols) is a flat sequence of blocks in row order: block k covers elements
// [k B, (k + 1) B), exactly the order in which the CPU formats walk rows and blocks.
// A tile is `tile_blocks` consecutive blocks; in shared memory block i of a tile starts
// at float i (B + 1) (one pad float per block), so that the block functions of the
// KVB_HD headers read it as B contiguous floats and one thread per block hits
// distinct banks whenever B + 1 is odd.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "sim/core/hd_math.h"
#include "sim/formats/hd_util.h"

namespace kvb::cuda::tile {

constexpr int kThreads = 256;

inline bool aligned(const void* p, unsigned bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1u)) == 0; }

// Tile element e (block e / B, position e % B) in shared memory.
__device__ __forceinline__ int padded(int e, int B) { return e + e / B; }

// n floats of global memory into the tile. vec4: xt 16-byte aligned, n % 4 == 0 and
// B % 4 == 0 (a quad never straddles a pad), so that loads are 16 bytes.
__device__ __forceinline__ void load_tile(const float* __restrict__ xt, int n, int B, bool vec4, float* tile) {
  if (vec4) {
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(xt)[q];
      float* t = tile + padded(4 * q, B);
      t[0] = v.x;
      t[1] = v.y;
      t[2] = v.z;
      t[3] = v.w;
    }
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) tile[padded(e, B)] = xt[e];
  }
}

// The tile back to n floats of global memory (the same conditions for vec4).
__device__ __forceinline__ void store_tile(const float* tile, int n, int B, bool vec4, float* __restrict__ out) {
  if (vec4) {
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x) {
      const float* t = tile + padded(4 * q, B);
      reinterpret_cast<float4*>(out)[q] = make_float4(t[0], t[1], t[2], t[3]);
    }
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) out[e] = tile[padded(e, B)];
  }
}

// n bytes from src to dst by the whole block, 16-, 4- or 1-byte accesses, the widest
// that both addresses and n allow. (Shared-memory buffers are 16-byte aligned.)
__device__ __forceinline__ void copy_bytes(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(n);
  if ((a & 15u) == 0) {
    for (int i = threadIdx.x; i < n / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else if ((a & 3u) == 0) {
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x)
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

// Packs N one-byte 4-bit codes into N / 2 bytes at dst, element 2i in the low nibble
// of byte i (16- or 8-byte stores when dst allows).
template <int N>
__device__ __forceinline__ void store_nibbles(const uint8_t* codes, uint8_t* dst) {
  static_assert(N == 16 || N == 32, "blocks of 16 or 32 codes");
  constexpr int W = N / 8;  // 32-bit words
  uint32_t w[W];
#pragma unroll
  for (int k = 0; k < W; ++k) {
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v |= static_cast<uint32_t>(codes[8 * k + i] & 0x0fu) << (4 * i);
    w[k] = v;
  }
  if constexpr (W == 4) {
    if ((reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      return;
    }
  }
  if ((reinterpret_cast<uintptr_t>(dst) & 7u) == 0) {
#pragma unroll
    for (int k = 0; k < W; k += 2) *reinterpret_cast<uint2*>(dst + 4 * k) = make_uint2(w[k], w[k + 1]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k)
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[4 * k + i] = static_cast<uint8_t>(w[k] >> (8 * i));
  }
}

// The inverse: N / 2 bytes at src into N one-byte codes.
template <int N>
__device__ __forceinline__ void load_nibbles(const uint8_t* src, uint8_t* codes) {
  static_assert(N == 16 || N == 32, "blocks of 16 or 32 codes");
  constexpr int W = N / 8;
  uint32_t w[W];
  bool done = false;
  if constexpr (W == 4) {
    if ((reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      w[0] = v.x;
      w[1] = v.y;
      w[2] = v.z;
      w[3] = v.w;
      done = true;
    }
  }
  if (!done) {
    if ((reinterpret_cast<uintptr_t>(src) & 7u) == 0) {
#pragma unroll
      for (int k = 0; k < W; k += 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(src + 4 * k);
        w[k] = v.x;
        w[k + 1] = v.y;
      }
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k)
        w[k] = static_cast<uint32_t>(src[4 * k]) | (static_cast<uint32_t>(src[4 * k + 1]) << 8) |
               (static_cast<uint32_t>(src[4 * k + 2]) << 16) | (static_cast<uint32_t>(src[4 * k + 3]) << 24);
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k)
#pragma unroll
    for (int i = 0; i < 8; ++i) codes[8 * k + i] = static_cast<uint8_t>((w[k] >> (4 * i)) & 0x0fu);
}

namespace {  // kernels: one copy per translation unit

// ---------------------------------------------------------------------------
// Per-span absolute maxima: amax_bits[s] = the bits of max |x| over elements
// [0, count) of span s (spans `span_elems` apart). The maximum of non-negative floats
// is exact in any order, and their bits order as the values do, so blocks combine by
// atomicMax on the bits. amax_bits must be zero before the launch.
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads)
    span_absmax_kernel(const float* __restrict__ x, int64_t spans, int64_t span_elems, int64_t count, bool vec4,
                       unsigned* __restrict__ amax_bits) {
  __shared__ float warp_max[kThreads / 32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t quads = vec4 ? count / 4 : 0;
  for (int64_t span = blockIdx.y; span < spans; span += gridDim.y) {
    const float* xs = x + span * span_elems;
    float m = 0.0f;
    for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
      const float4 v = reinterpret_cast<const float4*>(xs)[q];
      m = m < absf(v.x) ? absf(v.x) : m;
      m = m < absf(v.y) ? absf(v.y) : m;
      m = m < absf(v.z) ? absf(v.z) : m;
      m = m < absf(v.w) ? absf(v.w) : m;
    }
    for (int64_t e = 4 * quads + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride)
      m = m < absf(xs[e]) ? absf(xs[e]) : m;
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, m, off);
      m = m < o ? o : m;
    }
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = m < warp_max[w] ? warp_max[w] : m;
      atomicMax(amax_bits + span, float_bits(m));
    }
    __syncthreads();  // warp_max is reused by the next span
  }
}

// scales[s] = rule(max |x| of span s), one thread per span.
template <class Rule>
__global__ void span_scales_kernel(const unsigned* __restrict__ amax_bits, int64_t spans, Rule rule,
                                   float* __restrict__ scales) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s < spans) scales[s] = rule(bits_float(amax_bits[s]));
}

}  // namespace

// Enqueues scales[s] = rule(max |x| over the first `count` elements of span s) for the
// `spans` spans of `span_elems` elements at x. amax_bits: `spans` words of scratch.
template <class Rule>
void launch_span_scales(const float* x, int64_t spans, int64_t span_elems, int64_t count, Rule rule,
                        unsigned* amax_bits, float* scales, cudaStream_t stream) {
  KVB_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, static_cast<size_t>(spans) * sizeof(unsigned), stream));
  if (count > 0) {
    const bool vec4 = aligned(x, 16) && span_elems % 4 == 0;
    const int64_t per_span = std::clamp<int64_t>((count / 4 + kThreads * 8 - 1) / (kThreads * 8), 1, 1024);
    const unsigned span_blocks = static_cast<unsigned>(std::min<int64_t>(spans, 65535));
    span_absmax_kernel<<<dim3(static_cast<unsigned>(per_span), span_blocks), kThreads, 0, stream>>>(
        x, spans, span_elems, count, vec4, amax_bits);
    KVB_CUDA_CHECK_LAUNCH(span_absmax_kernel);
  }
  span_scales_kernel<<<static_cast<unsigned>((spans + 127) / 128), 128, 0, stream>>>(amax_bits, spans, rule, scales);
  KVB_CUDA_CHECK_LAUNCH(span_scales_kernel);
}

// Dynamic shared memory above the default 48 KB needs an opt-in per kernel.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    KVB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace kvb::cuda::tile
