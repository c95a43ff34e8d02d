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
constexpr int kChunkRows = 256;     // rows of one chunk of a token group longer than one block holds

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
// [q G, min((q + 1) G, rows)) of that channel. params: [spans, ceil(rows / G), cols].
//
// The vectorised kernels (cols % 4 == 0, 16-byte aligned rows) share one thread
// mapping: a block of kWarps warps covers a slice of kSliceChannels channels
// (blockIdx.y), lane l the four channels of quad l of the slice, so that one load
// instruction of a warp reads kSliceChannels consecutive floats of one row (512 bytes,
// coalesced) and each thread keeps whole float4s of its channels in registers.
// Statistics (min/max or max|x|, which int_stats_merge combines exactly) are folded by
// each warp over a contiguous run of rows, in row order, then merged across warps in
// warp order: the fold of the whole group in row order, as the CPU format runs it.
// ---------------------------------------------------------------------------
constexpr int kWarps = kThreads / 32;
constexpr int kSliceQuads = 32;  // one quad of channels per lane
constexpr int kSliceChannels = 4 * kSliceQuads;
constexpr int kMaxRowsPerWarp = 16;  // register-resident groups: G <= kWarps * kMaxRowsPerWarp
constexpr int kLoadBatch = 8;        // float4 loads one thread has in flight in the chunked kernels

// What a warp's statistics of one channel keep in shared memory: (min, max) for
// MinMax, (max|x|, 0) for AbsMax (the kinds the vectorised kernels run).
__device__ __forceinline__ float2 pack_stats(const IntGroupStats& s, IntStatKind kind) {
  return kind == IntStatKind::MinMax ? make_float2(s.lo, s.hi) : make_float2(s.absmax, 0.0f);
}

__device__ __forceinline__ IntGroupStats unpack_stats(float2 v, int64_t n, IntStatKind kind) {
  IntGroupStats s;
  if (kind == IntStatKind::MinMax) {
    s.lo = v.x;
    s.hi = v.y;
  } else {
    s.absmax = v.x;
  }
  s.n = n;
  return s;
}

// Statistics of `rows_here` rows of channel `ch` of the slice, from warp_stats[w][ch]:
// warp w folded rows [w L, min((w + 1) L, rows_here)). Merged in warp (= row) order.
__device__ __forceinline__ IntGroupStats merge_warp_stats(const float2 (*warp_stats)[kSliceChannels], int ch,
                                                          int rows_here, int rows_per_warp, IntStatKind kind) {
  IntGroupStats s;
  for (int w = 0; w < kWarps; ++w) {
    const int n = min(rows_per_warp, rows_here - w * rows_per_warp);
    if (n <= 0) break;
    s = int_stats_merge(s, unpack_stats(warp_stats[w][ch], n, kind));
  }
  return s;
}

__device__ __forceinline__ void stats_add4(IntGroupStats* st, float4 v, IntStatKind kind) {
  int_stats_add(st[0], v.x, kind);
  int_stats_add(st[1], v.y, kind);
  int_stats_add(st[2], v.z, kind);
  int_stats_add(st[3], v.w, kind);
}

// Codes (uchar4) or decoded values (float4) of one row's quad at element `at`.
template <IntOut kOut>
__device__ __forceinline__ void encode_quad(float4 v, const IntGroupParams* p, const IntKernelSpec& s, int64_t at,
                                            uint8_t* __restrict__ codes, float* __restrict__ out) {
  if (kOut == IntOut::Codes) {
    *reinterpret_cast<uchar4*>(codes + at) = make_uchar4(encode_stored(v.x, p[0], s), encode_stored(v.y, p[1], s),
                                                         encode_stored(v.z, p[2], s), encode_stored(v.w, p[3], s));
  } else {
    *reinterpret_cast<float4*>(out + at) = make_float4(encode_decode(v.x, p[0], s), encode_decode(v.y, p[1], s),
                                                       encode_decode(v.z, p[2], s), encode_decode(v.w, p[3], s));
  }
}

// Groups of at most kWarps · kRowsPerWarp rows (min/max or max|x|): one block per
// (span, group) and slice, one pass. Warp w loads rows [w kRowsPerWarp, ...) of the
// group into registers (all loads in flight at once), folds them, the warps' statistics
// merge in shared memory into the group's parameters, and each thread encodes the
// values it holds: x is read once.
template <IntOut kOut, int kRowsPerWarp>
__global__ void __launch_bounds__(kThreads)
    int_token_groups_reg_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                IntKernelSpec spec, uint8_t* __restrict__ codes, IntGroupParams* __restrict__ params,
                                float* __restrict__ out) {
  __shared__ float2 warp_stats[kWarps][kSliceChannels];
  __shared__ IntGroupParams slice_params[kSliceChannels];
  const int64_t sq = blockIdx.x;  // span * groups_per_span + group
  const int64_t span = blockIdx.x / static_cast<unsigned>(groups_per_span);  // both below 2^31
  const int64_t r0 = (sq - span * groups_per_span) * spec.group;
  const int rows_here = static_cast<int>(min(spec.group, rows - r0));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cq = static_cast<int>(blockIdx.y) * kSliceQuads + lane;  // quad of channels 4 cq .. 4 cq + 3
  const bool active = cq < cols / 4;
  const int wrows = max(0, min(kRowsPerWarp, rows_here - warp * kRowsPerWarp));
  const int64_t first = (span * rows + r0 + static_cast<int64_t>(warp) * kRowsPerWarp) * cols + 4 * cq;

  float4 v[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
    v[k] = active && k < wrows ? *reinterpret_cast<const float4*>(x + first + static_cast<int64_t>(k) * cols)
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  IntGroupStats st[4];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
    if (k < wrows) stats_add4(st, v[k], spec.kind);
  if (active && wrows > 0)
#pragma unroll
    for (int i = 0; i < 4; ++i) warp_stats[warp][4 * lane + i] = pack_stats(st[i], spec.kind);
  __syncthreads();

  if (threadIdx.x < kSliceChannels) {
    const int c = static_cast<int>(blockIdx.y) * kSliceChannels + static_cast<int>(threadIdx.x);
    if (c < cols) {
      const IntGroupStats s = merge_warp_stats(warp_stats, threadIdx.x, rows_here, kRowsPerWarp, spec.kind);
      const IntGroupParams p = int_group_params(s, spec.kind, spec.bits, spec.scale_dt, spec.zero_dt);
      slice_params[threadIdx.x] = p;
      if (kOut == IntOut::Codes) params[sq * cols + c] = p;
    }
  }
  __syncthreads();

  if (!active) return;
  const IntGroupParams p[4] = {slice_params[4 * lane], slice_params[4 * lane + 1], slice_params[4 * lane + 2],
                               slice_params[4 * lane + 3]};
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k)
    if (k < wrows) encode_quad<kOut>(v[k], p, spec, first + static_cast<int64_t>(k) * cols, codes, out);
}

// Where one block of the chunked token-group kernels works: chunk k of group q of span
// s (blockIdx.x = (s groups_per_span + q) chunks_per_group + k) is rows
// [row0, row0 + rows_here) of the batch, at most kChunkRows (possibly none).
struct TokenChunk {
  int64_t sq;         // span * groups_per_span + group
  int64_t row0;       // first row of the chunk in the whole batch [spans * rows]
  int rows_here;
  // sqk, chunks_per_group and groups_per_span are below 2^31 (a grid dimension), so
  // 32-bit divisions serve.
  __device__ TokenChunk(unsigned sqk, int64_t rows, int64_t groups_per_span, int64_t chunks_per_group, int64_t G) {
    sq = sqk / static_cast<unsigned>(chunks_per_group);
    const int64_t span = static_cast<unsigned>(sq) / static_cast<unsigned>(groups_per_span);
    const int64_t g0 = (sq - span * groups_per_span) * G;
    const int64_t c0 = g0 + (sqk - sq * chunks_per_group) * kChunkRows;
    // A span's last group can be shorter than G: its later chunks are empty.
    rows_here = static_cast<int>(max(static_cast<int64_t>(0), min(min(rows, g0 + G), c0 + kChunkRows) - c0));
    row0 = span * rows + c0;
  }
};

// Large groups (G > kWarps · kMaxRowsPerWarp; min/max or max|x|), three passes. First
// one block per (span, group, chunk) and slice folds the chunk: warp w its contiguous
// rows [w L, (w + 1) L), L = ceil(rows_here / kWarps), kLoadBatch loads in flight per
// thread; partial[(sq chunks_per_group + k) cols + c] = the chunk's statistics.
__global__ void __launch_bounds__(kThreads)
    int_token_chunk_stats_vec_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                     int64_t chunks_per_group, IntKernelSpec spec, IntGroupStats* __restrict__ partial) {
  __shared__ float2 warp_stats[kWarps][kSliceChannels];
  const TokenChunk ck(blockIdx.x, rows, groups_per_span, chunks_per_group, spec.group);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cq = static_cast<int>(blockIdx.y) * kSliceQuads + lane;
  const bool active = cq < cols / 4;
  const int per_warp = max(1, (ck.rows_here + kWarps - 1) / kWarps);
  const int wrows = max(0, min(per_warp, ck.rows_here - warp * per_warp));
  const float* xw = x + (ck.row0 + static_cast<int64_t>(warp) * per_warp) * cols + 4 * cq;
  if (active && wrows > 0) {
    IntGroupStats st[4];
    for (int k0 = 0; k0 < wrows; k0 += kLoadBatch) {
      float4 v[kLoadBatch];
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k)
        v[k] = k0 + k < wrows ? *reinterpret_cast<const float4*>(xw + static_cast<int64_t>(k0 + k) * cols)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k)
        if (k0 + k < wrows) stats_add4(st, v[k], spec.kind);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) warp_stats[warp][4 * lane + i] = pack_stats(st[i], spec.kind);
  }
  __syncthreads();
  if (threadIdx.x < kSliceChannels) {
    const int c = static_cast<int>(blockIdx.y) * kSliceChannels + static_cast<int>(threadIdx.x);
    if (c < cols)
      partial[static_cast<int64_t>(blockIdx.x) * cols + c] =
          merge_warp_stats(warp_stats, threadIdx.x, ck.rows_here, per_warp, spec.kind);
  }
}

// Rows warp, warp + kWarps, ... of a token chunk of `rows_here` rows, kLoadBatch loads in
// flight: load(r) -> T for a batch of rows, then use(r, loaded) for each.
template <class T, class Load, class Use>
__device__ __forceinline__ void for_chunk_rows(int rows_here, int warp, Load load, Use use) {
  for (int r0 = warp; r0 < rows_here; r0 += kWarps * kLoadBatch) {
    T v[kLoadBatch];
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const int r = r0 + k * kWarps;
      v[k] = r < rows_here ? load(r) : T{};
    }
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const int r = r0 + k * kWarps;
      if (r < rows_here) use(r, v[k]);
    }
  }
}

// ...then int_token_chunk_params_kernel merges the chunks, and one block per chunk and
// slice encodes it: each thread its quad's four parameters once, then rows warp,
// warp + kWarps, ... (kLoadBatch loads in flight).
template <IntOut kOut>
__global__ void __launch_bounds__(kThreads)
    int_token_chunk_apply_vec_kernel(const float* __restrict__ x, int64_t rows, int cols, int64_t groups_per_span,
                                     int64_t chunks_per_group, IntKernelSpec spec,
                                     const IntGroupParams* __restrict__ params, uint8_t* __restrict__ codes,
                                     float* __restrict__ out) {
  const TokenChunk ck(blockIdx.x, rows, groups_per_span, chunks_per_group, spec.group);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cq = static_cast<int>(blockIdx.y) * kSliceQuads + lane;
  if (cq >= cols / 4) return;
  const IntGroupParams* gp = params + ck.sq * cols + 4 * cq;
  const IntGroupParams p[4] = {gp[0], gp[1], gp[2], gp[3]};
  const int64_t first = ck.row0 * cols + 4 * cq;
  for_chunk_rows<float4>(
      ck.rows_here, warp,
      [&](int r) { return *reinterpret_cast<const float4*>(x + first + static_cast<int64_t>(r) * cols); },
      [&](int r, float4 v) { encode_quad<kOut>(v, p, spec, first + static_cast<int64_t>(r) * cols, codes, out); });
}

// Dequantize of token groups (any G, any statistic): one block per (span, group,
// chunk of kChunkRows rows) and slice; each thread reads its quad's four parameters
// once and decodes rows warp, warp + kWarps, ... of the chunk (uchar4 codes in,
// float4 values out, kLoadBatch loads in flight).
__global__ void __launch_bounds__(kThreads)
    int_token_dequantize_kernel(const uint8_t* __restrict__ codes, const IntGroupParams* __restrict__ params,
                                int64_t rows, int cols, int64_t groups_per_span, int64_t chunks_per_group,
                                IntKernelSpec spec, float* __restrict__ out) {
  const TokenChunk ck(blockIdx.x, rows, groups_per_span, chunks_per_group, spec.group);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cq = static_cast<int>(blockIdx.y) * kSliceQuads + lane;
  if (cq >= cols / 4) return;
  const IntGroupParams* gp = params + ck.sq * cols + 4 * cq;
  const IntGroupParams p[4] = {gp[0], gp[1], gp[2], gp[3]};
  const int64_t first = ck.row0 * cols + 4 * cq;
  for_chunk_rows<uchar4>(
      ck.rows_here, warp,
      [&](int r) { return *reinterpret_cast<const uchar4*>(codes + first + static_cast<int64_t>(r) * cols); },
      [&](int r, uchar4 cd) {
        *reinterpret_cast<float4*>(out + first + static_cast<int64_t>(r) * cols) =
            make_float4(int_decode(int_code_of_stored(cd.x, spec.bits, spec.symmetric), p[0]),
                        int_decode(int_code_of_stored(cd.y, spec.bits, spec.symmetric), p[1]),
                        int_decode(int_code_of_stored(cd.z, spec.bits, spec.symmetric), p[2]),
                        int_decode(int_code_of_stored(cd.w, spec.bits, spec.symmetric), p[3]));
      });
}

// The scalar kernels below serve what the vectorised ones do not: rows that are not
// 16-byte aligned or cols % 4 != 0, and the b = 1 mean (AbsMean), whose double sum
// must run in row order in one thread.

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
#pragma unroll 8
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

// ---------------------------------------------------------------------------
// Quantize of channel groups of G = 4 kLanes kQuadsPerLane channels (G divides cols;
// min/max or max|x|), without shared memory: group g of the batch is elements
// [g G, (g + 1) G) (params[g]), and kLanes consecutive lanes (a power of two, at most 32)
// take it, lane j the j-th run of kQuadsPerLane quads. Each lane loads its run with
// 16-byte loads (all in flight at once), folds it in element order, the group's lanes
// merge their statistics by shuffles, adjacent runs in order (int_stats_merge: the fold
// of the whole group, as the CPU runs it), each lane derives the group's parameters and
// stores its run's codes (16-byte stores when aligned; launched for G <= 32). One group per lane:
// no per-group work is repeated, and the staging, the synchronisation and the
// one-thread-per-group statistics phase of int_channel_groups_kernel are gone.
// ---------------------------------------------------------------------------
template <IntStatKind kKind, int kQuadsPerLane, int kLanes>
__global__ void __launch_bounds__(kThreads)
    int_channel_groups_quantize_kernel(const float* __restrict__ x, int64_t total_groups, IntKernelSpec spec,
                                       bool codes16, uint8_t* __restrict__ codes, IntGroupParams* __restrict__ params) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two of lanes per group");
  const int64_t lane_id = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t g = lane_id / kLanes;
  const int part = static_cast<int>(lane_id & (kLanes - 1));
  // Lanes past the last group stay until the shuffles (they take the whole warp).
  const bool in = g < total_groups;
  const int64_t q0 = (g * kLanes + part) * kQuadsPerLane;  // first quad of this lane's run
  float4 v[kQuadsPerLane];
#pragma unroll
  for (int k = 0; k < kQuadsPerLane; ++k)
    v[k] = in ? reinterpret_cast<const float4*>(x)[q0 + k] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  IntGroupStats st;
#pragma unroll
  for (int k = 0; k < kQuadsPerLane; ++k) {
    int_stats_add(st, v[k].x, kKind);
    int_stats_add(st, v[k].y, kKind);
    int_stats_add(st, v[k].z, kKind);
    int_stats_add(st, v[k].w, kKind);
  }
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) {  // runs of off lanes -> runs of 2 off lanes
    const float2 mine = pack_stats(st, kKind);
    const float2 other = make_float2(__shfl_xor_sync(0xffffffffu, mine.x, off), __shfl_xor_sync(0xffffffffu, mine.y, off));
    const bool earlier = (part & off) == 0;  // this lane's run comes first
    const int64_t n = static_cast<int64_t>(4 * kQuadsPerLane) * off;
    st = int_stats_merge(unpack_stats(earlier ? mine : other, n, kKind), unpack_stats(earlier ? other : mine, n, kKind));
  }
  if (!in) return;
  const IntGroupParams p = int_group_params(st, kKind, spec.bits, spec.scale_dt, spec.zero_dt);
  if (part == 0) params[g] = p;
  uint32_t w[kQuadsPerLane];  // four codes per word, element 4k + i in byte i of w[k]
#pragma unroll
  for (int k = 0; k < kQuadsPerLane; ++k)
    w[k] = static_cast<uint32_t>(encode_stored(v[k].x, p, spec)) |
           (static_cast<uint32_t>(encode_stored(v[k].y, p, spec)) << 8) |
           (static_cast<uint32_t>(encode_stored(v[k].z, p, spec)) << 16) |
           (static_cast<uint32_t>(encode_stored(v[k].w, p, spec)) << 24);
  uint8_t* dst = codes + 4 * q0;  // 16-byte aligned when codes16 and kQuadsPerLane % 4 == 0
  if constexpr (kQuadsPerLane % 4 == 0) {
    if (codes16) {
#pragma unroll
      for (int k = 0; k < kQuadsPerLane; k += 4)
        *reinterpret_cast<uint4*>(dst + 4 * k) = make_uint4(w[k], w[k + 1], w[k + 2], w[k + 3]);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < kQuadsPerLane; ++k) *reinterpret_cast<uint32_t*>(dst + 4 * k) = w[k];
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
    if (!along_channels() && token_vec4(b, out, codes, 4u)) {
      const int64_t groups_per_span = (b.rows + ks.group - 1) / ks.group;
      const int64_t chunks_per_group = (ks.group + kChunkRows - 1) / kChunkRows;
      if (b.spans * groups_per_span * chunks_per_group > INT32_MAX)
        throw Error("format '" + name() + "': too many token groups for the CUDA twin's grid");
      const dim3 grid(static_cast<unsigned>(b.spans * groups_per_span * chunks_per_group), slices(cols));
      int_token_dequantize_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(codes),
                                                                 static_cast<const IntGroupParams*>(meta), b.rows, cols,
                                                                 groups_per_span, chunks_per_group, ks, out);
      KVB_CUDA_CHECK_LAUNCH(int_token_dequantize_kernel);
      return;
    }
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
  // Whether the vectorised token-group kernels serve a batch: rows of whole float4s,
  // `floats` 16-byte aligned and `other` (codes or values) aligned to `other_align`.
  static bool token_vec4(SpanBatch b, const void* floats, const void* other, unsigned other_align) {
    return b.cols % 4 == 0 && aligned16(floats) && (reinterpret_cast<uintptr_t>(other) & (other_align - 1u)) == 0 &&
           (b.cols + kSliceChannels - 1) / kSliceChannels <= 65535;
  }
  static unsigned slices(int cols) { return static_cast<unsigned>((cols + kSliceChannels - 1) / kSliceChannels); }

  template <IntOut kOut, int kRowsPerWarp>
  static void launch_token_reg(dim3 grid, const float* x, SpanBatch b, int64_t groups_per_span, const IntKernelSpec& ks,
                               uint8_t* codes, IntGroupParams* params, float* out, cudaStream_t stream) {
    int_token_groups_reg_kernel<kOut, kRowsPerWarp><<<grid, kThreads, 0, stream>>>(
        x, b.rows, static_cast<int>(b.cols), groups_per_span, ks, codes, params, out);
    KVB_CUDA_CHECK_LAUNCH(int_token_groups_reg_kernel);
  }

  // Quantize of channel groups by int_channel_groups_quantize_kernel when it serves the
  // batch (G in 8, 16, 32 dividing cols, min/max or max|x|, 16-byte aligned x and
  // word-aligned codes); false when the caller must run int_channel_groups_kernel.
  bool launch_channel_quantize(const float* x, SpanBatch b, const IntKernelSpec& ks, uint8_t* codes,
                               IntGroupParams* params, cudaStream_t stream) const {
    if (ks.kind == IntStatKind::AbsMean || b.cols % ks.group != 0 || !aligned16(x) || !aligned4(codes)) return false;
    const int64_t total_groups = b.spans * b.rows * (b.cols / ks.group);
    const bool codes16 = aligned16(codes);
    switch (ks.group) {
      case 8: return launch_channel_quantize<2, 1>(x, total_groups, ks, codes16, codes, params, stream);
      case 16: return launch_channel_quantize<4, 1>(x, total_groups, ks, codes16, codes, params, stream);
      case 32: return launch_channel_quantize<8, 1>(x, total_groups, ks, codes16, codes, params, stream);
      // G = 64 and whole-row groups (tok, 128 and 256): the tiled kernel was faster on an
      // H100 (2337 and 2242 GB/s against 2071 and 1925: experiments/bench/RESULTS.md).
      default: return false;
    }
  }
  template <int kQuadsPerLane, int kLanes>
  bool launch_channel_quantize(const float* x, int64_t total_groups, const IntKernelSpec& ks, bool codes16,
                               uint8_t* codes, IntGroupParams* params, cudaStream_t stream) const {
    const int64_t blocks = (total_groups * kLanes + kThreads - 1) / kThreads;
    if (blocks > INT32_MAX) return false;
    auto kernel = ks.kind == IntStatKind::MinMax
                      ? int_channel_groups_quantize_kernel<IntStatKind::MinMax, kQuadsPerLane, kLanes>
                      : int_channel_groups_quantize_kernel<IntStatKind::AbsMax, kQuadsPerLane, kLanes>;
    kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, total_groups, ks, codes16, codes, params);
    KVB_CUDA_CHECK_LAUNCH(int_channel_groups_quantize_kernel);
    return true;
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
      if (kOut == IntOut::Codes && launch_channel_quantize(x, b, ks, codes, params, stream)) return;
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
    const int64_t chunks_per_group = (ks.group + kChunkRows - 1) / kChunkRows;
    if (groups * chunks_per_group > INT32_MAX)
      throw Error("format '" + name() + "': too many token groups for the CUDA twin's grid");
    if (ks.kind != IntStatKind::AbsMean && token_vec4(b, x, kOut == IntOut::Codes ? static_cast<const void*>(codes) : out,
                                                      kOut == IntOut::Codes ? 4u : 16u)) {
      const dim3 grid(static_cast<unsigned>(groups), slices(cols));
      if (ks.group <= kWarps) launch_token_reg<kOut, 1>(grid, x, b, groups_per_span, ks, codes, params, out, stream);
      else if (ks.group <= 2 * kWarps) launch_token_reg<kOut, 2>(grid, x, b, groups_per_span, ks, codes, params, out, stream);
      else if (ks.group <= 4 * kWarps) launch_token_reg<kOut, 4>(grid, x, b, groups_per_span, ks, codes, params, out, stream);
      else if (ks.group <= 8 * kWarps) launch_token_reg<kOut, 8>(grid, x, b, groups_per_span, ks, codes, params, out, stream);
      else if (ks.group <= kMaxRowsPerWarp * kWarps)
        launch_token_reg<kOut, kMaxRowsPerWarp>(grid, x, b, groups_per_span, ks, codes, params, out, stream);
      else {
        IntGroupParams* group_params = params;
        if (kOut == IntOut::Values) {
          params_scratch_.reserve(static_cast<size_t>(groups * cols));
          group_params = params_scratch_.data();
        }
        partial_.reserve(static_cast<size_t>(groups * chunks_per_group * cols));
        const dim3 chunk_grid(static_cast<unsigned>(groups * chunks_per_group), slices(cols));
        int_token_chunk_stats_vec_kernel<<<chunk_grid, kThreads, 0, stream>>>(x, b.rows, cols, groups_per_span,
                                                                              chunks_per_group, ks, partial_.data());
        KVB_CUDA_CHECK_LAUNCH(int_token_chunk_stats_vec_kernel);
        int_token_chunk_params_kernel<<<dim3(static_cast<unsigned>(groups), (cols + 127) / 128), 128, 0, stream>>>(
            partial_.data(), cols, groups, chunks_per_group, ks, group_params);
        KVB_CUDA_CHECK_LAUNCH(int_token_chunk_params_kernel);
        int_token_chunk_apply_vec_kernel<kOut><<<chunk_grid, kThreads, 0, stream>>>(
            x, b.rows, cols, groups_per_span, chunks_per_group, ks, group_params, codes, out);
        KVB_CUDA_CHECK_LAUNCH(int_token_chunk_apply_vec_kernel);
      }
      return;
    }
    const dim3 threads(128);
    const unsigned channel_blocks = static_cast<unsigned>((cols + 127) / 128);
    if (ks.group <= kChunkRows || ks.kind == IntStatKind::AbsMean) {
      int_token_groups_fused_kernel<kOut><<<dim3(static_cast<unsigned>(groups), channel_blocks), threads, 0, stream>>>(
          x, b.rows, cols, groups_per_span, ks, codes, params, out);
      KVB_CUDA_CHECK_LAUNCH(int_token_groups_fused_kernel);
      return;
    }
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
