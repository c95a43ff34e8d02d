#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

}  // namespace

void launch_weight_to_f32(const void* weight, WeightDtype dtype, int64_t first, int64_t n, float* out,
                          cudaStream_t stream) {
  if (n <= 0) return;
  weight_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(weight, dtype, first, n, out);
  KVB_CUDA_CHECK_LAUNCH("weight_to_f32_kernel");
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

void launch_causal_attention(const AttentionArgs& a, cudaStream_t stream) {
  causal_attention_kernel<<<dim3(a.n, a.q_heads), kAttnWarps * 32, 0, stream>>>(a);
  KVB_CUDA_CHECK_LAUNCH("causal_attention_kernel");
}

}  // namespace kvb::cuda
