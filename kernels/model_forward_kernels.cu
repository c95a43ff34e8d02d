#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/model_forward_kernels.h"

namespace kvb::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int per_block = kThreads) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 8 ? b : 65535 * 8);  // grid-stride loops cover the rest
}

__device__ __forceinline__ float weight_at(const void* w, WeightDtype dtype, int64_t i) {
  switch (dtype) {
    case WeightDtype::F16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(w)[i]));
    case WeightDtype::BF16: return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16);
    default: return static_cast<const float*>(w)[i];
  }
}

__global__ void weight_to_f32_kernel(const void* w, WeightDtype dtype, int64_t first, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = weight_at(w, dtype, first + i);
}

// 8 consecutive 16-bit weights (one 16-byte load) widened to fp32.
__device__ __forceinline__ void widen8(uint4 packed, WeightDtype dtype, float* out) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = static_cast<uint16_t>(words[i] & 0xffffu), hi = static_cast<uint16_t>(words[i] >> 16);
    if (dtype == WeightDtype::BF16) {
      out[2 * i] = __uint_as_float(static_cast<uint32_t>(lo) << 16);
      out[2 * i + 1] = __uint_as_float(static_cast<uint32_t>(hi) << 16);
    } else {
      out[2 * i] = __half2float(__ushort_as_half(lo));
      out[2 * i + 1] = __half2float(__ushort_as_half(hi));
    }
  }
}

// launch_skinny_dense: warp w of the grid computes output feature o = w for R rows.
// `vec8`: 16-bit W, `in` a multiple of 8, W and x 16-byte aligned (8 weights and two
// float4 of each row per load); otherwise element by element.
template <int R>
__global__ void skinny_dense_kernel(const float* __restrict__ x, const void* __restrict__ w, WeightDtype dtype,
                                    int64_t out, int64_t in, const float* __restrict__ bias, float* __restrict__ y,
                                    bool vec8) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t o = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (o >= out) return;
  float acc[R];
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if (vec8) {
    const uint4* row = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + o * in);
    const int64_t packs = in / 8;
#pragma unroll 4
    for (int64_t c = lane; c < packs; c += 32) {
      float wf[8];
      widen8(__ldg(row + c), dtype, wf);
      for (int r = 0; r < R; ++r) {
        const float4* xr = reinterpret_cast<const float4*>(x + r * in + c * 8);
        const float4 a = xr[0], b = xr[1];
        float s = acc[r];
        s = __fmaf_rn(wf[0], a.x, s);
        s = __fmaf_rn(wf[1], a.y, s);
        s = __fmaf_rn(wf[2], a.z, s);
        s = __fmaf_rn(wf[3], a.w, s);
        s = __fmaf_rn(wf[4], b.x, s);
        s = __fmaf_rn(wf[5], b.y, s);
        s = __fmaf_rn(wf[6], b.z, s);
        s = __fmaf_rn(wf[7], b.w, s);
        acc[r] = s;
      }
    }
  } else {
    for (int64_t k = lane; k < in; k += 32) {
      const float wk = weight_at(w, dtype, o * in + k);
      for (int r = 0; r < R; ++r) acc[r] = __fmaf_rn(wk, x[r * in + k], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = acc[r];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) y[r * out + o] = bias ? s + bias[o] : s;
  }
}

template <int R>
void launch_skinny_rows(const float* x, const void* w, WeightDtype dtype, int64_t out, int64_t in, const float* bias,
                        float* y, bool vec8, cudaStream_t stream) {
  constexpr int kWarps = kThreads / 32;
  const int64_t blocks = (out + kWarps - 1) / kWarps;
  skinny_dense_kernel<R><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, w, dtype, out, in, bias, y, vec8);
  KVB_CUDA_CHECK_LAUNCH("skinny_dense_kernel");
}

__global__ void embed_kernel(const int32_t* tokens, const void* tok, const void* pos, WeightDtype dtype,
                             int64_t first_position, int hidden, float* x) {
  const int r = blockIdx.x;
  const int64_t t = tokens[r];
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = weight_at(tok, dtype, t * hidden + c);
    if (pos) v = __fadd_rn(v, weight_at(pos, dtype, (first_position + r) * hidden + c));
    x[int64_t{r} * hidden + c] = v;
  }
}

// Sum over the block (kThreads threads), fixed order; every thread gets it.
__device__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

__global__ void normalize_rows_kernel(const float* x, const float* w, const float* b, double eps, int n, float* y) {
  __shared__ double scratch[kThreads / 32];
  const float* in = x + int64_t{blockIdx.x} * n;
  float* out = y + int64_t{blockIdx.x} * n;
  if (b) {  // LayerNorm
    double sum = 0;
    for (int i = threadIdx.x; i < n; i += kThreads) sum += in[i];
    const double mean = block_sum(sum, scratch) / n;
    double var = 0;
    for (int i = threadIdx.x; i < n; i += kThreads) var += (in[i] - mean) * (in[i] - mean);
    var = block_sum(var, scratch) / n;
    const float m = static_cast<float>(mean);
    const float rstd = static_cast<float>(1.0 / sqrt(var + eps));
    for (int i = threadIdx.x; i < n; i += kThreads)
      out[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(in[i], m), rstd), w[i]), b[i]);
  } else {  // RMSNorm
    double sq = 0;
    for (int i = threadIdx.x; i < n; i += kThreads) sq += static_cast<double>(in[i]) * in[i];
    sq = block_sum(sq, scratch);
    const float rstd = static_cast<float>(1.0 / sqrt(sq / n + eps));
    for (int i = threadIdx.x; i < n; i += kThreads) out[i] = __fmul_rn(w[i], __fmul_rn(in[i], rstd));
  }
}

__global__ void broadcast_rows_kernel(const float* bias, int64_t total, int n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = bias[i % n];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __fadd_rn(x[i], y[i]);
}

__device__ __forceinline__ float activate_one(float x, int act) {
  switch (act) {
    case 0: {  // GELU, tanh approximation
      const float k = 0.7978845608028654f;
      return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case 1: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case 2: return fmaxf(x, 0.0f);
    default: return x / (1.0f + expf(-x));
  }
}

__global__ void activate_kernel(float* x, int64_t n, int act) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = activate_one(x[i], act);
}

__global__ void gated_activation_kernel(const float* gate_up, int rows, int inner, int act, float* out) {
  const int64_t total = int64_t{rows} * inner;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / inner, c = i % inner;
    const float* row = gate_up + r * 2 * inner;
    out[i] = __fmul_rn(activate_one(row[c], act), row[inner + c]);
  }
}

__global__ void rope_kernel(float* x, int64_t stride, int heads, int d, const float* cos, const float* sin) {
  const int r = blockIdx.x, half = d / 2;
  for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int h = i / half, p = i % half;
    float* row = x + r * stride + int64_t{h} * d;
    const float c = cos[int64_t{r} * half + p], s = sin[int64_t{r} * half + p];
    const float lo = row[p], hi = row[p + half];
    row[p] = __fadd_rn(__fmul_rn(lo, c), __fmul_rn(-hi, s));
    row[p + half] = __fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s));
  }
}

__global__ void append_units_kernel(const float* src, int64_t src_stride, int64_t col0, int n, int heads, int d,
                                    float* dst, int64_t dst_unit, int64_t dst_row0) {
  const int64_t total = int64_t{n} * heads * d;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % d, g = (i / d) % heads, r = i / (int64_t{d} * heads);
    dst[g * dst_unit + (dst_row0 + r) * d + c] = src[r * src_stride + col0 + g * d + c];
  }
}

// One block per (query row, query head): kAttnWarps warps take every kAttnWarps-th
// visible key; lanes split the head dimension (channel lane + 32 i). Each warp keeps an
// online softmax (running max, normalizer, weighted value sum); the block merges them.
constexpr int kAttnWarps = 4;
constexpr int kLaneDims = kMaxAttentionHeadDim / 32;

__global__ void __launch_bounds__(kAttnWarps * 32) causal_attention_kernel(AttentionArgs a) {
  const int r = blockIdx.x, h = blockIdx.y;
  const int g = h / (a.q_heads / a.kv_heads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d = a.d;
  const int64_t t = a.first + r;
  const int64_t lo = a.window > 0 && t - a.window + 1 > 0 ? t - a.window + 1 : 0;
  const float* q = a.queries + r * a.query_stride + int64_t{h} * d;
  float qv[kLaneDims], acc[kLaneDims];
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < d ? q[c] : 0.0f;
    acc[i] = 0.0f;
  }
  int64_t key_from = INT64_MAX, value_from = INT64_MAX;
  bool key_window = false, value_window = false;
  if (a.residual_from) {
    key_from = a.residual_from[(int64_t{0} * a.kv_heads + g) * a.n + r];
    value_from = a.residual_from[(int64_t{1} * a.kv_heads + g) * a.n + r];
    key_window = a.residual_window[(int64_t{0} * a.kv_heads + g) * a.n + r] != 0;
    value_window = a.residual_window[(int64_t{1} * a.kv_heads + g) * a.n + r] != 0;
  }
  const int64_t ex = g * a.exact_unit_stride, ver = g * a.version_unit_stride;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = lo + warp; j <= t; j += kAttnWarps) {
    const float* k = j < key_from ? a.k_stored + ver : (key_window ? a.k_window + ver : a.k_exact + ex);
    const float* v = j < value_from ? a.v_stored + ver : (value_window ? a.v_window + ver : a.v_exact + ex);
    k += j * d;
    v += j * d;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) {
      const int c = lane + 32 * i;
      if (c < d) s = fmaf(qv[i], k[c], s);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= a.score_scale;
    const float m_new = fmaxf(m, s);
    const float rescale = expf(m - m_new), p = expf(s - m_new);
    l = l * rescale + p;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) {
      const int c = lane + 32 * i;
      if (c < d) acc[i] = acc[i] * rescale + p * v[c];
    }
    m = m_new;
  }
  __shared__ float warp_m[kAttnWarps], warp_l[kAttnWarps];
  __shared__ float warp_acc[kAttnWarps][kMaxAttentionHeadDim];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int c = lane + 32 * i;
    if (c < d) warp_acc[warp][c] = acc[i];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, warp_m[w]);
  double L = 0;
  float scale[kAttnWarps];
  for (int w = 0; w < kAttnWarps; ++w) {
    scale[w] = warp_m[w] == -INFINITY ? 0.0f : expf(warp_m[w] - M);
    L += static_cast<double>(warp_l[w]) * scale[w];
  }
  const float inv_l = static_cast<float>(1.0 / L);
  float* out = a.out + r * int64_t{a.q_heads} * d + int64_t{h} * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) o += warp_acc[w][c] * scale[w];
    out[c] = o * inv_l;
  }
}


// Tiled causal attention (launch_causal_attention_tiled). A block takes the query heads
// of KV head g = blockIdx.y, GH of its G = q_heads / kv_heads heads at a time, for BQ
// = 64 / GH consecutive query rows: 64 query vectors ("slots"; slot s is local row s /
// GH, local head s % GH). It walks the keys its rows see in tiles of 64: stages a key
// tile in shared memory, computes the 64 x 64 scores, updates each slot's online
// softmax (running max m, normaliser l, output accumulators rescaled), stages the value
// tile and accumulates probabilities x values. 256 threads as 16 x 16: thread (ty, tx)
// owns slots ty + 16 i (i < 4), of the score tile keys tx + 16 jj (jj < 4), and output
// channels 64 k + 4 tx + e (k < DP / 64, e < 4); DP is the head dimension rounded up to
// 64, 128 or 256 (channels from d on are zero).
//
// Versions: row r reads token j of KV head g in version 0 (stored) for j <
// residual_from, else version 1 (window) or 2 (exact) as residual_window says. A tile
// whose (row, key) pairs all read one version stages that version once; otherwise each
// version some row reads there is staged in turn: the scores take each pair's own
// version, the probabilities go to the value version each pair reads (0 elsewhere).
// Keys a version stages for no row are zeros in shared memory, never read from memory.
constexpr int kTileSlots = 64, kTileKeys = 64, kTileThreads = 256;
constexpr int kProbPitch = kTileKeys + 16;  // floats per slot row of the probability tile (bank spread)
constexpr int kStored = 0, kWindow = 1, kExact = 2, kVersionCount = 3;

template <int DP>
constexpr size_t tiled_attention_smem_bytes() {  // query tile, key/value tile, probabilities
  return sizeof(float) * (size_t{2} * kTileSlots * (DP + 4) + size_t{kTileSlots} * kProbPitch);
}

// Up to 4 floats from src (`left` of them valid, > 0): one 16-byte load when vec4.
__device__ __forceinline__ float4 load_quad(const float* src, int left, bool vec4) {
  if (vec4) return *reinterpret_cast<const float4*>(src);
  float4 v = make_float4(src[0], 0.0f, 0.0f, 0.0f);
  if (left > 1) v.y = src[1];
  if (left > 2) v.z = src[2];
  if (left > 3) v.w = src[3];
  return v;
}

// Key or value `kind` (0 K, 1 V) of KV head g in `version`: token j's row at + j * d.
__device__ __forceinline__ const float* version_rows(const AttentionArgs& a, int kind, int version, int g) {
  switch (version) {
    case kStored: return (kind ? a.v_stored : a.k_stored) + g * a.version_unit_stride;
    case kWindow: return (kind ? a.v_window : a.k_window) + g * a.version_unit_stride;
    default: return (kind ? a.v_exact : a.k_exact) + g * a.exact_unit_stride;
  }
}

__device__ __forceinline__ int version_of(int from, int alt, int64_t j) { return j < from ? kStored : alt; }

// Rows [0, 64) of a tile (pitch DP + 4 floats) = tokens j0 + row of `rows` for rows in
// [lo, hi), channels < d; zeros elsewhere. Every thread of the block calls it.
template <int DP>
__device__ __forceinline__ void stage_tile(float* tile, const float* rows, int64_t j0, int lo, int hi, int d,
                                           bool vec4) {
#pragma unroll 4
  for (int it = 0; it < DP / 16; ++it) {
    const int q = threadIdx.x + kTileThreads * it;  // quad q of 64 rows x DP / 4 quads
    const int row = q / (DP / 4), c = 4 * (q % (DP / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row >= lo && row < hi && c < d) v = load_quad(rows + (j0 + row) * d + c, d - c, vec4);
    *reinterpret_cast<float4*>(tile + row * (DP + 4) + c) = v;
  }
}

// For one kind (K or V), the version rules of the block's rows reduced: some row reads
// key j in the stored version iff j < from_max, in the window version iff j >=
// window_from, in the exact version iff j >= exact_from.
struct TileVersions {
  int from_max = INT_MIN, window_from = INT_MAX, exact_from = INT_MAX;

  __device__ void add_row(int from, int alt) {
    from_max = max(from_max, from);
    if (alt == kWindow) window_from = min(window_from, from);
    else exact_from = min(exact_from, from);
  }
  // The local key range [lo, hi) of the tile [j0, j0 + count) that some row reads in
  // `version`; false when empty.
  __device__ bool range(int version, int64_t j0, int count, int& lo, int& hi) const {
    const int64_t l = version == kStored ? 0 : (version == kWindow ? window_from : exact_from) - j0;
    const int64_t h = version == kStored ? from_max - j0 : count;
    lo = static_cast<int>(l < 0 ? 0 : (l > count ? count : l));
    hi = static_cast<int>(h < 0 ? 0 : (h > count ? count : h));
    return lo < hi;
  }
  // How many versions some row reads in the tile.
  __device__ int count_in(int64_t j0, int count) const {
    int lo = 0, hi = 0, n = 0;
    for (int v = 0; v < kVersionCount; ++v) n += range(v, j0, count, lo, hi);
    return n;
  }
};

template <int DP>
__global__ void __launch_bounds__(kTileThreads, DP <= 128 ? 2 : 1) tiled_attention_kernel(AttentionArgs a, int heads_per_block,
                                                                       int rows_per_block, int head_chunks,
                                                                       int row_tiles, bool vec4) {
  constexpr int P = DP + 4;  // floats per row of the query and key/value tiles
  constexpr int K4 = DP / 64;
  extern __shared__ float4 tiled_smem[];
  float* const qs = reinterpret_cast<float*>(tiled_smem);  // [64 slots][P]
  float* const kvs = qs + kTileSlots * P;                   // [64 keys][P]
  float* const ps = kvs + kTileKeys * P;                    // [64 slots][kProbPitch]
  __shared__ int row_from[2][kTileSlots], row_alt[2][kTileSlots];  // [K, V][local row]

  const int G = a.q_heads / a.kv_heads, GH = heads_per_block;
  const int g = blockIdx.y, chunk = blockIdx.x % head_chunks;
  const int r0 = (row_tiles - 1 - static_cast<int>(blockIdx.x) / head_chunks) * rows_per_block;  // longest first
  const int rows_here = min(rows_per_block, a.n - r0);
  const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  const int d = a.d;

  if (tid < kTileSlots) {
    for (int kind = 0; kind < 2; ++kind) {
      int from = INT_MAX, alt = kExact;  // without residual_from: every token stored
      if (a.residual_from && tid < rows_here) {
        const int64_t at = (int64_t{kind} * a.kv_heads + g) * a.n + r0 + tid;
        from = a.residual_from[at];
        alt = a.residual_window[at] != 0 ? kWindow : kExact;
      }
      row_from[kind][tid] = from;
      row_alt[kind][tid] = alt;
    }
  }
#pragma unroll
  for (int it = 0; it < DP / 16; ++it) {
    const int q = tid + kTileThreads * it;  // quad q of 64 slots x DP / 4 quads
    const int s = q / (DP / 4), c = 4 * (q % (DP / 4));
    const int lr = s / GH, head = chunk * GH + s % GH;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (lr < rows_here && head < G && c < d)
      v = load_quad(a.queries + int64_t{r0 + lr} * a.query_stride + int64_t{g * G + head} * d + c, d - c, vec4);
    *reinterpret_cast<float4*>(qs + s * P + c) = v;
  }
  __syncthreads();

  TileVersions key_rules, value_rules;
  for (int lr = 0; lr < rows_here; ++lr) {
    key_rules.add_row(row_from[0][lr], row_alt[0][lr]);
    value_rules.add_row(row_from[1][lr], row_alt[1][lr]);
  }
  // Slot ty + 16 i is at position t_first + lr_of[i] and sees keys lowest_key(t) <= j
  // <= t (slots past the last row get positions past it; their results are never
  // written).
  const int window = a.window;
  auto lowest_key = [window](int64_t t) -> int64_t { return window > 0 && t - window + 1 > 0 ? t - window + 1 : 0; };
  int lr_of[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) lr_of[i] = (ty + 16 * i) / GH;
  const int64_t t_first = a.first + r0, t_last = t_first + rows_here - 1;
  const int64_t lo_first = lowest_key(t_first), lo_last = lowest_key(t_last);

  float o[4][K4][4], m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < K4; ++k)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][k][e] = 0.0f;
  }
  const int d4 = (d + 3) & ~3;

  for (int64_t j0 = lo_first; j0 <= t_last; j0 += kTileKeys) {
    const int count = static_cast<int>(t_last + 1 - j0 < kTileKeys ? t_last + 1 - j0 : kTileKeys);
    // Every row sees every key of the tile: no masking.
    const bool unmasked = j0 >= lo_last && j0 + kTileKeys - 1 <= t_first;
    int lo_v = 0, hi_v = 0;  // the keys staged in the current version

    // Scores s[i][jj] of slot ty + 16 i and key j0 + tx + 16 jj, each in its version:
    // with several versions, each pass keeps its pairs' scores in the thread's own
    // cells of ps (free until the value passes; read back below). The first pass fills
    // every cell, so that pairs no row reads (past the last row) hold finite scores.
    float s[4][4];
    const int key_versions = key_rules.count_in(j0, count);
    bool first_pass = true;
    for (int v = 0; v < kVersionCount; ++v) {
      if (!key_rules.range(v, j0, count, lo_v, hi_v)) continue;
      __syncthreads();  // the previous readers of kvs and ps are done
      stage_tile<DP>(kvs, version_rows(a, 0, v, g), j0, lo_v, hi_v, d, vec4);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) s[i][jj] = 0.0f;
#pragma unroll 1
      for (int c = 0; c < d4; c += 4) {
        float4 kv[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) kv[jj] = *reinterpret_cast<const float4*>(kvs + (tx + 16 * jj) * P + c);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float4 qv = *reinterpret_cast<const float4*>(qs + (ty + 16 * i) * P + c);
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            s[i][jj] = fmaf(qv.x, kv[jj].x, s[i][jj]);
            s[i][jj] = fmaf(qv.y, kv[jj].y, s[i][jj]);
            s[i][jj] = fmaf(qv.z, kv[jj].z, s[i][jj]);
            s[i][jj] = fmaf(qv.w, kv[jj].w, s[i][jj]);
          }
        }
      }
      if (key_versions > 1) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj)
            if (first_pass || version_of(row_from[0][lr_of[i]], row_alt[0][lr_of[i]], j0 + tx + 16 * jj) == v)
              ps[(ty + 16 * i) * kProbPitch + tx + 16 * jj] = s[i][jj];
      }
      first_pass = false;
    }
    if (key_versions > 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) s[i][jj] = ps[(ty + 16 * i) * kProbPitch + tx + 16 * jj];
    }

    // Online softmax: s becomes the probabilities relative to the new running max.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t t = t_first + lr_of[i], lo = lowest_key(t);
      float tile_max = -INFINITY;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float x = s[i][jj] * a.score_scale;
        const int64_t j = j0 + tx + 16 * jj;
        if (!unmasked && (j < lo || j > t)) x = -INFINITY;
        s[i][jj] = x;
        tile_max = fmaxf(tile_max, x);
      }
      for (int off = 8; off > 0; off >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float m_new = fmaxf(m[i], tile_max);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: every p is 0
      const float rescale = expf(m[i] - m_ref);
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        s[i][jj] = expf(s[i][jj] - m_ref);
        sum += s[i][jj];
      }
      l[i] = l[i] * rescale + sum;
      m[i] = m_new;
#pragma unroll
      for (int k = 0; k < K4; ++k)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][k][e] *= rescale;
    }

    // Probabilities x values, each pair's probability against the value version it reads.
    const int value_versions = value_rules.count_in(j0, count);
    const int count4 = (count + 3) & ~3;
    for (int v = 0; v < kVersionCount; ++v) {
      if (!value_rules.range(v, j0, count, lo_v, hi_v)) continue;
      __syncthreads();  // the previous readers of kvs and ps are done
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const bool reads = value_versions == 1 ||
                             version_of(row_from[1][lr_of[i]], row_alt[1][lr_of[i]], j0 + tx + 16 * jj) == v;
          ps[(ty + 16 * i) * kProbPitch + tx + 16 * jj] = reads ? s[i][jj] : 0.0f;
        }
      stage_tile<DP>(kvs, version_rows(a, 1, v, g), j0, lo_v, hi_v, d, vec4);
      __syncthreads();
#pragma unroll 1
      for (int j = 0; j < count4; j += 4) {
        float4 p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = *reinterpret_cast<const float4*>(ps + (ty + 16 * i) * kProbPitch + j);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
          for (int k = 0; k < K4; ++k) {
            const float4 vv = *reinterpret_cast<const float4*>(kvs + (j + jj) * P + 64 * k + 4 * tx);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float pij = jj == 0 ? p[i].x : jj == 1 ? p[i].y : jj == 2 ? p[i].z : p[i].w;
              o[i][k][0] = fmaf(pij, vv.x, o[i][k][0]);
              o[i][k][1] = fmaf(pij, vv.y, o[i][k][1]);
              o[i][k][2] = fmaf(pij, vv.z, o[i][k][2]);
              o[i][k][3] = fmaf(pij, vv.w, o[i][k][3]);
            }
          }
        }
      }
    }
  }

  // The normaliser of each slot: the 16 threads of a slot row hold a share each.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float total = l[i];
    for (int off = 8; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
    const int slot = ty + 16 * i, head = chunk * GH + slot % GH;
    if (lr_of[i] >= rows_here || head >= G) continue;
    const float inv = 1.0f / total;
    float* out = a.out + int64_t{r0 + lr_of[i]} * a.q_heads * d + int64_t{g * G + head} * d;
#pragma unroll
    for (int k = 0; k < K4; ++k) {
      const int c = 64 * k + 4 * tx;
      if (c >= d) continue;
      const float4 r = make_float4(o[i][k][0] * inv, o[i][k][1] * inv, o[i][k][2] * inv, o[i][k][3] * inv);
      if (vec4) {
        *reinterpret_cast<float4*>(out + c) = r;
      } else {
        out[c] = r.x;
        if (c + 1 < d) out[c + 1] = r.y;
        if (c + 2 < d) out[c + 2] = r.z;
        if (c + 3 < d) out[c + 3] = r.w;
      }
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int DP>
void launch_tiled_attention(const AttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = tiled_attention_smem_bytes<DP>();
  static const bool configured = [] {  // beyond 48 KB of dynamic shared memory: opt in, once
    KVB_CUDA_CHECK(cudaFuncSetAttribute(tiled_attention_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
    return true;
  }();
  (void)configured;
  const int G = a.q_heads / a.kv_heads;
  const int heads_per_block = G < kTileSlots ? G : kTileSlots;
  const int head_chunks = (G + heads_per_block - 1) / heads_per_block;
  const int rows_per_block = kTileSlots / heads_per_block;
  const int row_tiles = (a.n + rows_per_block - 1) / rows_per_block;
  // 16-byte loads and stores: every row and head start a multiple of 4 floats from
  // 16-byte aligned bases.
  const bool vec4 = a.d % 4 == 0 && a.query_stride % 4 == 0 && a.exact_unit_stride % 4 == 0 &&
                    a.version_unit_stride % 4 == 0 && aligned16(a.queries) && aligned16(a.out) &&
                    aligned16(a.k_exact) && aligned16(a.k_stored) && aligned16(a.k_window) && aligned16(a.v_exact) &&
                    aligned16(a.v_stored) && aligned16(a.v_window);
  tiled_attention_kernel<DP><<<dim3(row_tiles * head_chunks, a.kv_heads), kTileThreads, smem, stream>>>(
      a, heads_per_block, rows_per_block, head_chunks, row_tiles, vec4);
  KVB_CUDA_CHECK_LAUNCH("tiled_attention_kernel");
}

}  // namespace

void launch_weight_to_f32(const void* weight, WeightDtype dtype, int64_t first, int64_t n, float* out,
                          cudaStream_t stream) {
  if (n <= 0) return;
  weight_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(weight, dtype, first, n, out);
  KVB_CUDA_CHECK_LAUNCH("weight_to_f32_kernel");
}

void launch_skinny_dense(const float* x, int rows, const void* w, WeightDtype dtype, int64_t out, int64_t in,
                         const float* bias, float* y, cudaStream_t stream) {
  if (rows < 1 || rows > kMaxSkinnyRows || out <= 0 || in <= 0) {
    if (rows == 0 || out == 0) return;
    throw Error("internal: launch_skinny_dense: " + std::to_string(rows) + " rows of " + std::to_string(in) + " -> " +
                std::to_string(out) + " features (at most " + std::to_string(kMaxSkinnyRows) + " rows)");
  }
  const bool vec8 = dtype != WeightDtype::F32 && in % 8 == 0 && aligned16(w) && aligned16(x);
  switch (rows) {
    case 1: return launch_skinny_rows<1>(x, w, dtype, out, in, bias, y, vec8, stream);
    case 2: return launch_skinny_rows<2>(x, w, dtype, out, in, bias, y, vec8, stream);
    case 3: return launch_skinny_rows<3>(x, w, dtype, out, in, bias, y, vec8, stream);
    case 4: return launch_skinny_rows<4>(x, w, dtype, out, in, bias, y, vec8, stream);
    case 5: return launch_skinny_rows<5>(x, w, dtype, out, in, bias, y, vec8, stream);
    case 6: return launch_skinny_rows<6>(x, w, dtype, out, in, bias, y, vec8, stream);
    case 7: return launch_skinny_rows<7>(x, w, dtype, out, in, bias, y, vec8, stream);
    default: return launch_skinny_rows<8>(x, w, dtype, out, in, bias, y, vec8, stream);
  }
}

void launch_embed(const int32_t* tokens, int n, const void* token_embedding, const void* position_embedding,
                  WeightDtype dtype, int64_t first_position, int hidden, float* x, cudaStream_t stream) {
  embed_kernel<<<n, kThreads, 0, stream>>>(tokens, token_embedding, position_embedding, dtype, first_position, hidden,
                                           x);
  KVB_CUDA_CHECK_LAUNCH("embed_kernel");
}

void launch_normalize_rows(const float* x, const float* weight, const float* bias, double eps, int rows, int n,
                           float* y, cudaStream_t stream) {
  normalize_rows_kernel<<<rows, kThreads, 0, stream>>>(x, weight, bias, eps, n, y);
  KVB_CUDA_CHECK_LAUNCH("normalize_rows_kernel");
}

void launch_broadcast_rows(const float* bias, int rows, int n, float* y, cudaStream_t stream) {
  const int64_t total = int64_t{rows} * n;
  broadcast_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(bias, total, n, y);
  KVB_CUDA_CHECK_LAUNCH("broadcast_rows_kernel");
}

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  KVB_CUDA_CHECK_LAUNCH("add_kernel");
}

void launch_activate(float* x, int64_t n, int activation, cudaStream_t stream) {
  activate_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, activation);
  KVB_CUDA_CHECK_LAUNCH("activate_kernel");
}

void launch_gated_activation(const float* gate_up, int rows, int inner, int activation, float* out,
                             cudaStream_t stream) {
  gated_activation_kernel<<<blocks_for(int64_t{rows} * inner), kThreads, 0, stream>>>(gate_up, rows, inner,
                                                                                      activation, out);
  KVB_CUDA_CHECK_LAUNCH("gated_activation_kernel");
}

void launch_rope(float* x, int64_t stride, int n, int heads, int d, const float* cos, const float* sin,
                 cudaStream_t stream) {
  rope_kernel<<<n, kThreads, 0, stream>>>(x, stride, heads, d, cos, sin);
  KVB_CUDA_CHECK_LAUNCH("rope_kernel");
}

void launch_append_units(const float* src, int64_t src_stride, int64_t col0, int n, int heads, int d, float* dst,
                         int64_t dst_unit, int64_t dst_row0, cudaStream_t stream) {
  const int64_t total = int64_t{n} * heads * d;
  append_units_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, src_stride, col0, n, heads, d, dst, dst_unit,
                                                                  dst_row0);
  KVB_CUDA_CHECK_LAUNCH("append_units_kernel");
}

void launch_causal_attention_reference(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  causal_attention_kernel<<<dim3(a.n, a.q_heads), kAttnWarps * 32, 0, stream>>>(a);
  KVB_CUDA_CHECK_LAUNCH("causal_attention_kernel");
}

void launch_causal_attention_tiled(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.d <= 64) launch_tiled_attention<64>(a, stream);
  else if (a.d <= 128) launch_tiled_attention<128>(a, stream);
  else launch_tiled_attention<kMaxAttentionHeadDim>(a, stream);
}

bool causal_attention_is_tiled(const AttentionArgs& a) {
  // The device's shared memory per block (opt-in): the tiled kernel needs 55 KiB at
  // head_dim <= 64, 87 KiB at <= 128 and 151 KiB at <= 256 (an H100 has 227 KiB).
  static const int optin = [] {
    int device = 0, bytes = 0;
    KVB_CUDA_CHECK(cudaGetDevice(&device));
    KVB_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
  }();
  const size_t needed = (a.d <= 64    ? tiled_attention_smem_bytes<64>()
                         : a.d <= 128 ? tiled_attention_smem_bytes<128>()
                                      : tiled_attention_smem_bytes<kMaxAttentionHeadDim>()) +
                        sizeof(int) * 4 * kTileSlots;  // the static row_from, row_alt
  // A tile holds 64 query vectors: rows x heads of a KV head's group. Fewer rows than
  // fill two leave most of the tiled kernel's work idle; the reference then is faster.
  return int64_t{a.n} * (a.q_heads / a.kv_heads) >= 2 * kTileSlots && needed <= static_cast<size_t>(optin);
}

void launch_causal_attention(const AttentionArgs& a, cudaStream_t stream) {
  if (causal_attention_is_tiled(a)) launch_causal_attention_tiled(a, stream);
  else launch_causal_attention_reference(a, stream);
}

}  // namespace kvb::cuda
