#include "kernels/int_twin.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/device_buffer.h"
#include "sim/formats/int_block.h"
#include "sim/formats/int_format.h"

namespace kvb::cuda {

namespace {

// IntFormatSpec as the kernels see it, with the group length resolved for a batch.
struct IntKernelSpec {
  int bits = 4;
  bool symmetric = false;
  IntStatKind kind = IntStatKind::MinMax;
  StoreDtype scale_dt = StoreDtype::F16;
  StoreDtype zero_dt = StoreDtype::F16;
  int64_t group = 32;  // elements per group along its axis (channels, or tokens)
};

enum class IntOut { Codes, Values };  // quantize (codes + params) or round trip (values)

constexpr int kThreads = 256;
constexpr int kTileFloats = 4096;   // elements of x staged in shared memory per block
constexpr int kChunkRows = 256;     // rows one thread folds before groups along tokens are split
constexpr int kTokenTileFloats = 16384;  // largest [G, cols] group tile staged in shared memory (66 KB)

// Shared-memory index of tile element e: one pad word per 32 floats, so that threads
// walking their groups' consecutive elements hit different banks.
__device__ __forceinline__ int padded(int e) { return e + (e >> 5); }

inline int padded_host(int e) { return e + (e >> 5); }

// Walks the quads q = first, first + stride, ... of a tile whose rows hold `per_row`
// quads (four consecutive elements), tracking (row, quad in row) without a division
// per step.
struct QuadWalk {
  int r, cq, dr, dcq, per_row;
  __device__ QuadWalk(int first, int stride, int per_row_)
      : r(first / per_row_), cq(first % per_row_), dr(stride / per_row_), dcq(stride % per_row_), per_row(per_row_) {}
  __device__ void next() {
    r += dr;
    cq += dcq;
    if (cq >= per_row) {
      cq -= per_row;
      ++r;
    }
  }
};

// quad_group[cq] = the group (within its row) of quad cq's four channels, or -1 when
// they straddle two groups (G not a multiple of 4).
__device__ void fill_quad_groups(int* quad_group, int quads_per_row, int G) {
  for (int cq = threadIdx.x; cq < quads_per_row; cq += blockDim.x) {
    const int g0 = (4 * cq) / G, g3 = (4 * cq + 3) / G;
    quad_group[cq] = g0 == g3 ? g0 : -1;
  }
}

__device__ __forceinline__ uint8_t encode_stored(float x, IntGroupParams p, const IntKernelSpec& s) {
  return int_stored_code(int_encode(x, p, s.bits, s.symmetric), s.bits, s.symmetric);
}

__device__ __forceinline__ float encode_decode(float x, IntGroupParams p, const IntKernelSpec& s) {
  return int_decode(int_encode(x, p, s.bits, s.symmetric), p);
}

// ---------------------------------------------------------------------------
// Groups of channels (g<G>, tok). A block stages `tile_rows` rows [tile_rows, cols]
// of x in shared memory (coalesced 16-byte loads), one thread per group folds the
// group's elements in channel order into its parameters, then one thread per four
// consecutive elements writes their codes or decoded values (coalesced).
// x, codes, out: [total_rows, cols] device; params: [total_rows, ceil(cols / G)].
// ---------------------------------------------------------------------------
template <IntOut kOut>
__global__ void __launch_bounds__(kThreads)
    int_channel_groups_kernel(const float* __restrict__ x, int64_t total_rows, int cols, IntKernelSpec spec,
                              int tile_rows, bool vec4, uint8_t* __restrict__ codes,
                              IntGroupParams* __restrict__ params, float* __restrict__ out) {
  extern __shared__ float tile[];  // [tile_rows, cols] padded, then params, then quad groups
  const int G = static_cast<int>(spec.group);
  const int gpr = (cols + G - 1) / G;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(tile_rows), total_rows - row0));
  const int n = rows_here * cols;
  IntGroupParams* tile_params = reinterpret_cast<IntGroupParams*>(tile + padded(tile_rows * cols) + 1);
  int* quad_group = reinterpret_cast<int*>(tile_params + tile_rows * gpr);
  const float* xt = x + row0 * cols;

  if (vec4) {  // cols % 4 == 0: a quad never leaves its row, nor its 32-float chunk
    fill_quad_groups(quad_group, cols / 4, G);
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(xt)[q];
      float* t = tile + padded(4 * q);
      t[0] = v.x;
      t[1] = v.y;
      t[2] = v.z;
      t[3] = v.w;
    }
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) tile[padded(e)] = xt[e];
  }
  __syncthreads();

  const int groups = rows_here * gpr;
  for (int gi = threadIdx.x; gi < groups; gi += blockDim.x) {
    const int r = gi / gpr;
    const int c0 = (gi - r * gpr) * G;
    const int c1 = min(cols, c0 + G);
    IntGroupStats st;
    for (int c = c0; c < c1; ++c) int_stats_add(st, tile[padded(r * cols + c)], spec.kind);
    const IntGroupParams p = int_group_params(st, spec.kind, spec.bits, spec.scale_dt, spec.zero_dt);
    tile_params[gi] = p;
    if (kOut == IntOut::Codes) params[row0 * gpr + gi] = p;
  }
  __syncthreads();

  if (vec4) {
    QuadWalk w(threadIdx.x, blockDim.x, cols / 4);
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x, w.next()) {
      const float* t = tile + padded(4 * q);
      const int gq = quad_group[w.cq];
      const IntGroupParams* rp = tile_params + w.r * gpr;
      uint8_t cd[4];
      float v[4];
      if (gq >= 0) {
        const IntGroupParams p = rp[gq];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (kOut == IntOut::Codes) cd[i] = encode_stored(t[i], p, spec);
          else v[i] = encode_decode(t[i], p, spec);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const IntGroupParams p = rp[(4 * w.cq + i) / G];
          if (kOut == IntOut::Codes) cd[i] = encode_stored(t[i], p, spec);
          else v[i] = encode_decode(t[i], p, spec);
        }
      }
      const int64_t at = row0 * cols + 4 * q;
      if (kOut == IntOut::Codes) *reinterpret_cast<uchar4*>(codes + at) = make_uchar4(cd[0], cd[1], cd[2], cd[3]);
      else *reinterpret_cast<float4*>(out + at) = make_float4(v[0], v[1], v[2], v[3]);
    }
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      const int r = e / cols;
      const int c = e - r * cols;
      const IntGroupParams p = tile_params[r * gpr + c / G];
      const int64_t at = row0 * cols + e;
      if (kOut == IntOut::Codes) codes[at] = encode_stored(tile[padded(e)], p, spec);
      else out[at] = encode_decode(tile[padded(e)], p, spec);
    }
  }
}

// ---------------------------------------------------------------------------
// Groups along tokens (ch<G>, ch): group q of channel c in span s is rows
// [q G, min((q + 1) G, rows)) of that channel. Threads of a warp take consecutive
// channels, so every row read is coalesced. params: [spans, ceil(rows / G), cols].
// ---------------------------------------------------------------------------

// Groups of few rows (G · cols <= kTokenTileFloats, cols % 4 == 0, aligned): one block
// per (span, group) stages the group's rows in padded shared memory (coalesced 16-byte
// loads), one thread per channel folds its column in row order, then one thread per
// quad writes codes or values (coalesced), as the channel-group kernel does.
template <IntOut kOut>
__global__ void __launch_bounds__(kThreads)
    int_token_groups_tile_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                 IntKernelSpec spec, uint8_t* __restrict__ codes, IntGroupParams* __restrict__ params,
                                 float* __restrict__ out) {
  extern __shared__ float tile[];  // [G, cols] padded, then cols params
  const int G = static_cast<int>(spec.group);
  const int64_t sq = blockIdx.x;  // span * groups_per_span + group
  const int64_t span = sq / groups_per_span;
  const int64_t r0 = (sq - span * groups_per_span) * G;
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(G), rows - r0));
  const int n = rows_here * cols;
  IntGroupParams* tile_params = reinterpret_cast<IntGroupParams*>(tile + padded(G * cols) + 1);
  const int64_t first = (span * rows + r0) * cols;  // first element of the group's rows
  for (int q = threadIdx.x; q < n / 4; q += blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(x + first)[q];
    float* t = tile + padded(4 * q);
    t[0] = v.x;
    t[1] = v.y;
    t[2] = v.z;
    t[3] = v.w;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    IntGroupStats st;
    for (int r = 0; r < rows_here; ++r) int_stats_add(st, tile[padded(r * cols + c)], spec.kind);
    const IntGroupParams p = int_group_params(st, spec.kind, spec.bits, spec.scale_dt, spec.zero_dt);
    tile_params[c] = p;
    if (kOut == IntOut::Codes) params[sq * cols + c] = p;
  }
  __syncthreads();
  QuadWalk w(threadIdx.x, blockDim.x, cols / 4);
  for (int q = threadIdx.x; q < n / 4; q += blockDim.x, w.next()) {
    const float* t = tile + padded(4 * q);
    const IntGroupParams* cp = tile_params + 4 * w.cq;
    const int64_t at = first + 4 * q;
    if (kOut == IntOut::Codes) {
      *reinterpret_cast<uchar4*>(codes + at) = make_uchar4(encode_stored(t[0], cp[0], spec), encode_stored(t[1], cp[1], spec),
                                                           encode_stored(t[2], cp[2], spec), encode_stored(t[3], cp[3], spec));
    } else {
      *reinterpret_cast<float4*>(out + at) = make_float4(encode_decode(t[0], cp[0], spec), encode_decode(t[1], cp[1], spec),
                                                         encode_decode(t[2], cp[2], spec), encode_decode(t[3], cp[3], spec));
    }
  }
}

// Small groups (G <= kChunkRows, or the b = 1 mean whose double sum must run in
// order): one thread per (span, group, channel) folds the group, then encodes it
// (the second pass reads what the first left in cache).
template <IntOut kOut>
__global__ void __launch_bounds__(128)
    int_token_groups_fused_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                  IntKernelSpec spec, uint8_t* __restrict__ codes,
                                  IntGroupParams* __restrict__ params, float* __restrict__ out) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t sq = blockIdx.x;  // span * groups_per_span + group
  const int64_t span = sq / groups_per_span;
  const int64_t r0 = (sq - span * groups_per_span) * spec.group;
  const int64_t r1 = min(rows, r0 + spec.group);
  const int64_t base = span * rows * cols + c;
  IntGroupStats st;
#pragma unroll 8
  for (int64_t r = r0; r < r1; ++r) int_stats_add(st, x[base + r * cols], spec.kind);
  const IntGroupParams p = int_group_params(st, spec.kind, spec.bits, spec.scale_dt, spec.zero_dt);
  if (kOut == IntOut::Codes) params[sq * cols + c] = p;
#pragma unroll 8
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = base + r * cols;
    if (kOut == IntOut::Codes) codes[at] = encode_stored(x[at], p, spec);
    else out[at] = encode_decode(x[at], p, spec);
  }
}

// Large groups (min/max or max|x|, which merge exactly): the group is cut into chunks
// of kChunkRows rows; one thread per (span, group, chunk, channel) folds its chunk...
__global__ void __launch_bounds__(128)
    int_token_chunk_stats_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                 int64_t chunks_per_group, IntKernelSpec spec, IntGroupStats* __restrict__ partial) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t sqk = blockIdx.x;  // (span * groups_per_span + group) * chunks_per_group + chunk
  const int64_t sq = sqk / chunks_per_group;
  const int64_t span = sq / groups_per_span;
  const int64_t g0 = (sq - span * groups_per_span) * spec.group;
  const int64_t r0 = g0 + (sqk - sq * chunks_per_group) * kChunkRows;
  const int64_t r1 = min(min(rows, g0 + spec.group), r0 + kChunkRows);
  const float* xc = x + span * rows * cols + c;
  IntGroupStats st;
#pragma unroll 8
  for (int64_t r = r0; r < r1; ++r) int_stats_add(st, xc[r * cols], spec.kind);
  partial[sqk * cols + c] = st;
}

// ...then one thread per (span, group, channel) merges the chunks in row order
// (int_stats_merge: equal to folding the whole group)...
__global__ void __launch_bounds__(128)
    int_token_chunk_params_kernel(const IntGroupStats* __restrict__ partial, int cols, int64_t groups,
                                  int64_t chunks_per_group, IntKernelSpec spec, IntGroupParams* __restrict__ params) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const int64_t sq = blockIdx.x;
  if (c >= cols || sq >= groups) return;
  IntGroupStats st;
  for (int64_t k = 0; k < chunks_per_group; ++k) st = int_stats_merge(st, partial[(sq * chunks_per_group + k) * cols + c]);
  params[sq * cols + c] = int_group_params(st, spec.kind, spec.bits, spec.scale_dt, spec.zero_dt);
}

// ...and one thread per (span, group, chunk, channel) encodes its chunk.
template <IntOut kOut>
__global__ void __launch_bounds__(128)
    int_token_chunk_apply_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                 int64_t chunks_per_group, IntKernelSpec spec, const IntGroupParams* __restrict__ params,
                                 uint8_t* __restrict__ codes, float* __restrict__ out) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t sqk = blockIdx.x;
  const int64_t sq = sqk / chunks_per_group;
  const int64_t span = sq / groups_per_span;
  const int64_t g0 = (sq - span * groups_per_span) * spec.group;
  const int64_t r0 = g0 + (sqk - sq * chunks_per_group) * kChunkRows;
  const int64_t r1 = min(min(rows, g0 + spec.group), r0 + kChunkRows);
  const IntGroupParams p = params[sq * cols + c];
  const int64_t base = span * rows * cols + c;
#pragma unroll 8
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = base + r * cols;
    if (kOut == IntOut::Codes) codes[at] = encode_stored(x[at], p, spec);
    else out[at] = encode_decode(x[at], p, spec);
  }
}

// ---------------------------------------------------------------------------
// Dequantize, any grouping: one thread per four consecutive elements of a tile of
// rows. codes, out: [spans * rows, cols]; params in the layout above. The group of
// (row r, channel c) is row_base[r] + (channel groups: c / G; token groups: c).
// ---------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads)
    int_dequantize_kernel(const uint8_t* __restrict__ codes, const IntGroupParams* __restrict__ params,
                          int64_t total_rows, int64_t rows, int cols, IntKernelSpec spec, bool along_channels,
                          int tile_rows, bool vec4, float* __restrict__ out) {
  extern __shared__ int64_t row_base[];  // [tile_rows], then quad groups [cols / 4]
  int* quad_group = reinterpret_cast<int*>(row_base + tile_rows);
  const int G = static_cast<int>(min(spec.group, static_cast<int64_t>(INT32_MAX)));
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(tile_rows), total_rows - row0));
  const int n = rows_here * cols;
  const int gpr = along_channels ? (cols + G - 1) / G : 0;
  const int64_t groups_per_span = along_channels ? 0 : (rows + spec.group - 1) / spec.group;
  for (int r = threadIdx.x; r < rows_here; r += blockDim.x) {
    const int64_t row = row0 + r;
    if (along_channels) {
      row_base[r] = row * gpr;
    } else {
      const int64_t span = row / rows;
      row_base[r] = (span * groups_per_span + (row - span * rows) / spec.group) * cols;
    }
  }
  if (vec4 && along_channels) fill_quad_groups(quad_group, cols / 4, G);
  __syncthreads();
  if (vec4) {
    QuadWalk w(threadIdx.x, blockDim.x, cols / 4);
    for (int q = threadIdx.x; q < n / 4; q += blockDim.x, w.next()) {
      const int64_t at = row0 * cols + 4 * q;
      const uchar4 cd = *reinterpret_cast<const uchar4*>(codes + at);
      const uint8_t cv[4] = {cd.x, cd.y, cd.z, cd.w};
      const IntGroupParams* rp = params + row_base[w.r];
      float v[4];
      const int gq = along_channels ? quad_group[w.cq] : -1;
      if (gq >= 0) {
        const IntGroupParams p = rp[gq];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = int_decode(int_code_of_stored(cv[i], spec.bits, spec.symmetric), p);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = 4 * w.cq + i;
          v[i] = int_decode(int_code_of_stored(cv[i], spec.bits, spec.symmetric), rp[along_channels ? c / G : c]);
        }
      }
      *reinterpret_cast<float4*>(out + at) = make_float4(v[0], v[1], v[2], v[3]);
    }
  } else {
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      const int r = e / cols;
      const int c = e - r * cols;
      const int64_t at = row0 * cols + e;
      out[at] = int_decode(int_code_of_stored(codes[at], spec.bits, spec.symmetric),
                           params[row_base[r] + (along_channels ? c / G : c)]);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

class IntTwin final : public FormatTwin {
 public:
  explicit IntTwin(const IntFormatSpec& spec) : spec_(spec) {}

  std::string name() const override { return spec_.name(); }

  CodeBytes code_bytes(SpanBatch b) const override {
    return {static_cast<size_t>(b.elements()), static_cast<size_t>(groups(b)) * sizeof(IntGroupParams)};
  }

  void quantize(const float* x, SpanBatch b, void* codes, void* meta, cudaStream_t stream) const override {
    run<IntOut::Codes>(x, b, static_cast<uint8_t*>(codes), static_cast<IntGroupParams*>(meta), nullptr, stream);
  }

  void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const override {
    run<IntOut::Values>(x, b, nullptr, nullptr, out, stream);
  }

  void dequantize(const void* codes, const void* meta, SpanBatch b, float* out, cudaStream_t stream) const override {
    if (b.elements() == 0) return;
    const IntKernelSpec ks = kernel_spec(b);
    const int cols = static_cast<int>(b.cols);
    const int tile_rows = std::max(1, kTileFloats / cols);
    const int64_t total_rows = b.spans * b.rows;
    const bool vec4 = cols % 4 == 0 && aligned16(out) && aligned4(codes);
    const int64_t blocks = (total_rows + tile_rows - 1) / tile_rows;
    const size_t smem = static_cast<size_t>(tile_rows) * sizeof(int64_t) + static_cast<size_t>(cols / 4 + 1) * sizeof(int);
    int_dequantize_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
        static_cast<const uint8_t*>(codes), static_cast<const IntGroupParams*>(meta), total_rows, b.rows, cols, ks,
        along_channels(), tile_rows, vec4, out);
    KVB_CUDA_CHECK_LAUNCH(int_dequantize_kernel);
  }

 private:
  bool along_channels() const {
    return spec_.grouping == IntGrouping::Channels || spec_.grouping == IntGrouping::PerToken;
  }
  int64_t groups(SpanBatch b) const {
    const int64_t g = spec_.group_len(b.rows, b.cols);
    if (b.rows == 0 || b.cols == 0) return 0;
    return along_channels() ? b.spans * b.rows * ((b.cols + g - 1) / g) : b.spans * ((b.rows + g - 1) / g) * b.cols;
  }
  IntKernelSpec kernel_spec(SpanBatch b) const {
    IntKernelSpec k;
    k.bits = spec_.bits;
    k.symmetric = spec_.symmetric;
    k.kind = int_stat_kind(spec_.symmetric, spec_.bits);
    k.scale_dt = spec_.scale_dtype;
    k.zero_dt = spec_.zero_dtype;
    k.group = spec_.group_len(b.rows, b.cols);
    return k;
  }

  template <IntOut kOut>
  void run(const float* x, SpanBatch b, uint8_t* codes, IntGroupParams* params, float* out,
           cudaStream_t stream) const {
    if (b.elements() == 0) return;
    if (b.cols > INT32_MAX / 2) throw Error("format '" + name() + "': head_dim too large for the CUDA twin");
    const IntKernelSpec ks = kernel_spec(b);
    const int cols = static_cast<int>(b.cols);
    if (along_channels()) {
      const int tile_rows = std::max(1, kTileFloats / cols);
      const int gpr = static_cast<int>((b.cols + ks.group - 1) / ks.group);
      const size_t smem = (static_cast<size_t>(padded_host(tile_rows * cols)) + 1) * sizeof(float) +
                          static_cast<size_t>(tile_rows) * gpr * sizeof(IntGroupParams) +
                          static_cast<size_t>(cols / 4 + 1) * sizeof(int);
      auto kernel = int_channel_groups_kernel<kOut>;
      if (smem > 48 * 1024)
        KVB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      const int64_t total_rows = b.spans * b.rows;
      const bool vec4 = cols % 4 == 0 && aligned16(x) && (kOut == IntOut::Codes ? aligned4(codes) : aligned16(out));
      const int64_t blocks = (total_rows + tile_rows - 1) / tile_rows;
      kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(x, total_rows, cols, ks, tile_rows, vec4,
                                                                          codes, params, out);
      KVB_CUDA_CHECK_LAUNCH(int_channel_groups_kernel);
      return;
    }
    const int64_t groups_per_span = (b.rows + ks.group - 1) / ks.group;
    const int64_t groups = b.spans * groups_per_span;
    const dim3 threads(128);
    const unsigned channel_blocks = static_cast<unsigned>((cols + 127) / 128);
    if (ks.group * cols <= kTokenTileFloats && cols % 4 == 0 && aligned16(x) &&
        (kOut == IntOut::Codes ? aligned4(codes) : aligned16(out))) {
      const size_t smem = (static_cast<size_t>(padded_host(static_cast<int>(ks.group) * cols)) + 1) * sizeof(float) +
                          static_cast<size_t>(cols) * sizeof(IntGroupParams);
      auto kernel = int_token_groups_tile_kernel<kOut>;
      if (smem > 48 * 1024)
        KVB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kernel<<<static_cast<unsigned>(groups), kThreads, smem, stream>>>(
          x, b.rows, cols, groups_per_span, ks, codes, params, out);
      KVB_CUDA_CHECK_LAUNCH(int_token_groups_tile_kernel);
      return;
    }
    if (ks.group <= kChunkRows || ks.kind == IntStatKind::AbsMean) {
      int_token_groups_fused_kernel<kOut><<<dim3(static_cast<unsigned>(groups), channel_blocks), threads, 0, stream>>>(
          x, b.rows, cols, groups_per_span, ks, codes, params, out);
      KVB_CUDA_CHECK_LAUNCH(int_token_groups_fused_kernel);
      return;
    }
    const int64_t chunks_per_group = (ks.group + kChunkRows - 1) / kChunkRows;
    partial_.reserve(static_cast<size_t>(groups * chunks_per_group * cols));
    IntGroupParams* group_params = params;
    if (kOut == IntOut::Values) {
      params_scratch_.reserve(static_cast<size_t>(groups * cols));
      group_params = params_scratch_.data();
    }
    const dim3 chunk_grid(static_cast<unsigned>(groups * chunks_per_group), channel_blocks);
    int_token_chunk_stats_kernel<<<chunk_grid, threads, 0, stream>>>(x, b.rows, cols, groups_per_span,
                                                                     chunks_per_group, ks, partial_.data());
    KVB_CUDA_CHECK_LAUNCH(int_token_chunk_stats_kernel);
    int_token_chunk_params_kernel<<<dim3(static_cast<unsigned>(groups), channel_blocks), threads, 0, stream>>>(
        partial_.data(), cols, groups, chunks_per_group, ks, group_params);
    KVB_CUDA_CHECK_LAUNCH(int_token_chunk_params_kernel);
    int_token_chunk_apply_kernel<kOut><<<chunk_grid, threads, 0, stream>>>(x, b.rows, cols, groups_per_span,
                                                                           chunks_per_group, ks, group_params, codes, out);
    KVB_CUDA_CHECK_LAUNCH(int_token_chunk_apply_kernel);
  }

  IntFormatSpec spec_;
  mutable DeviceBuffer<IntGroupStats> partial_;          // [groups, chunks, cols] chunk statistics
  mutable DeviceBuffer<IntGroupParams> params_scratch_;  // round trip of large token groups
};

}  // namespace

std::unique_ptr<FormatTwin> make_int_twin(const Format& format) {
  const auto* f = dynamic_cast<const IntFormat*>(&format);
  if (!f) return nullptr;
  return std::make_unique<IntTwin>(f->spec());
}

}  // namespace kvb::cuda
