// Kernels of the model forward pass on the device (kernels/model_forward.cpp drives
// them, with cuBLAS GEMMs in between). Host-only header: launchers enqueue on a stream.
// Activations are row-major fp32 [tokens, features]; weights are in their stored dtype.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvb::cuda {

// How a weight's elements are stored on the device.
enum class WeightDtype : int { F32 = 0, F16 = 1, BF16 = 2 };

// out [n] fp32 = the weight's n elements from element `first` (exact conversion).
void launch_weight_to_f32(const void* weight, WeightDtype dtype, int64_t first, int64_t n, float* out,
                          cudaStream_t stream);

// Rows up to which launch_skinny_dense computes a dense layer (decoding: one row a step).
constexpr int kMaxSkinnyRows = 8;

// y [rows, out] = x [rows, in] · Wᵀ (+ bias [out] when non-null), rows in
// [1, kMaxSkinnyRows], reading W [out, in] (row-major) in its stored dtype, each element
// widened exactly as launch_weight_to_f32 does, products summed in fp32 (one warp per
// output feature: each lane a strided share of `in`, then a fixed-order warp
// reduction). For the few rows of a decoding step, where converting a 16-bit W to fp32
// before a GEMM would move three times W's bytes. Equal to that GEMM within fp32
// summation order (tests/gpu/test_forward.cpp).
void launch_skinny_dense(const float* x, int rows, const void* w, WeightDtype dtype, int64_t out, int64_t in,
                         const float* bias, float* y, cudaStream_t stream);

// x [n, hidden] = token_embedding[tokens[r]] (+ position_embedding[first_position + r]
// when position_embedding is non-null); both tables [*, hidden] in `dtype`.
void launch_embed(const int32_t* tokens, int n, const void* token_embedding, const void* position_embedding,
                  WeightDtype dtype, int64_t first_position, int hidden, float* x, cudaStream_t stream);

// y [rows, n] = LayerNorm (weight, bias) when bias is non-null, else RMSNorm (weight),
// of x [rows, n], with sums in double as the CPU (sim/model/layers.cpp).
void launch_normalize_rows(const float* x, const float* weight, const float* bias, double eps, int rows, int n,
                           float* y, cudaStream_t stream);

// y [rows, n] = bias broadcast to every row.
void launch_broadcast_rows(const float* bias, int rows, int n, float* y, cudaStream_t stream);

// x += y over n elements.
void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream);

// Activation codes as kvb::Activation: GeluTanh 0, GeluErf 1, Relu 2, Silu 3.
// In place over n elements.
void launch_activate(float* x, int64_t n, int activation, cudaStream_t stream);
// out [rows, inner] = act(gate_up[:, :inner]) * gate_up[:, inner:], gate_up [rows, 2 inner].
void launch_gated_activation(const float* gate_up, int rows, int inner, int activation, float* out,
                             cudaStream_t stream);

// RoPE of the first `heads` head vectors (d each) of every row of x [n, stride], in
// place: row r is rotated by cos/sin [n, d/2] row r (sim/core/rope.h's arithmetic).
void launch_rope(float* x, int64_t stride, int n, int heads, int d, const float* cos, const float* sin,
                 cudaStream_t stream);

// Copies rows: dst + g * dst_unit + (dst_row0 + r) * d  <-  src + r * src_stride + col0 + g * d,
// for KV heads g < heads and rows r < n (appending new keys or values to the cache).
void launch_append_units(const float* src, int64_t src_stride, int64_t col0, int n, int heads, int d, float* dst,
                         int64_t dst_unit, int64_t dst_row0, cudaStream_t stream);

// Causal attention of n new queries over a layer's cache (the device twin of
// sim/model/attention.cpp's causal_attention). Query row r sits at position first + r
// and sees keys lo(t) <= j <= t, lo = max(0, t - window + 1) for window > 0, else 0.
// Token j of KV head g is read in the version row_versions() gives (sim/plan.h):
// stored for j < residual_from, else window (when residual_window) or exact.
struct AttentionArgs {
  const float* queries = nullptr;  // row r, head h at queries + r * query_stride + h * d
  int64_t query_stride = 0;
  int n = 0;
  int64_t first = 0;
  int q_heads = 0, kv_heads = 0, d = 0;
  int window = 0;
  float score_scale = 1;
  // Keys and values of KV head g, token j at base + g * unit_stride + j * d.
  const float *k_exact = nullptr, *k_stored = nullptr, *k_window = nullptr;
  const float *v_exact = nullptr, *v_stored = nullptr, *v_window = nullptr;
  int64_t exact_unit_stride = 0;    // the cache's capacity * d
  int64_t version_unit_stride = 0;  // the reconstructed versions': context * d
  // [2 (K, V), kv_heads, n] (device) or nullptr: every token read in the stored version.
  const int32_t* residual_from = nullptr;
  const int32_t* residual_window = nullptr;  // 1: the residual is read in the window version
  float* out = nullptr;                      // [n, q_heads * d]
};
inline constexpr int kMaxAttentionHeadDim = 256;
// The forward pass's attention: the tiled kernel when causal_attention_is_tiled(a),
// else the reference kernel. Chosen by shape only (n x q_heads / kv_heads >= 128, and
// the tiled kernel's shared memory for head_dim within the device's), so that a shape
// always runs the same arithmetic on a device.
void launch_causal_attention(const AttentionArgs& a, cudaStream_t stream);
bool causal_attention_is_tiled(const AttentionArgs& a);
// The reference: one block per (query row, query head), warps walking the keys one by
// one (fast enough for a few rows: generation steps).
void launch_causal_attention_reference(const AttentionArgs& a, cudaStream_t stream);
// Flash-attention style: a block takes the query heads of one KV head for a tile of
// consecutive query rows (64 query vectors), stages tiles of 64 keys and values in
// shared memory and keeps an online softmax; fp32 throughout. The same results as the
// reference to fp32 rounding (other summation orders). A version of a token that some
// row of a tile reads may be multiplied by zero for the other rows of the tile (as the
// CPU's causal_attention does), so versions must be finite where any row reads them.
void launch_causal_attention_tiled(const AttentionArgs& a, cudaStream_t stream);

}  // namespace kvb::cuda
