// Rotary position embedding (RoPE), Hugging Face "rotate_half" convention.
//
// A head vector x of even length d is split into halves; channel i < d/2 is paired with
// channel i + d/2 and the pair is rotated by angle a = pos · inv_freq(i), where
// inv_freq(i) = theta^(-2i/d):
//   x'[i]       = x[i] cos a − x[i + d/2] sin a
//   x'[i + d/2] = x[i + d/2] cos a + x[i] sin a
// Queries and keys rotated this way satisfy q'_t · k'_j = f(q, k, t − j): attention
// sees relative positions only.
//
// The arithmetic follows transformers' LlamaRotaryEmbedding in fp32: inv_freq, the
// angle pos · inv_freq, cos and sin are all float, and the rotated value is
// (x · cos) + (rotate_half(x) · sin), each product rounded once. It reproduces Hugging
// Face's post-RoPE tensors to a few fp32 ulps (cos/sin implementations may differ in
// the last bit); tests/core/test_rope.cpp checks it against a recorded Llama.
//
// Users: the synthetic generator (sim/synthetic.cpp), pre-RoPE key quantization
// (quantize key_pre_rope, then re-apply RoPE), and the model forward pass.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/core/tensor.h"

namespace kvb {

// theta^(-2·pair/d) in fp32, as Hugging Face computes it; pair < d/2. Radians per position.
float rope_inv_freq(int64_t pair, int64_t head_dim, double theta);

// Rotation angle of `pair` at position `pos` (radians, fp32: float(pos) · inv_freq).
float rope_angle(int64_t pos, int64_t pair, int64_t head_dim, double theta);

// Rotates rows in place: x is [T, d] row-major (d even), row t at position positions[t].
// positions == nullptr means positions 0..T-1.
void apply_rope(float* x, int64_t T, int64_t d, const int64_t* positions, double theta);

// The inverse rotation (angle −a): invert_rope(apply_rope(x)) == x up to fp32 rounding.
void invert_rope(float* x, int64_t T, int64_t d, const int64_t* positions, double theta);

// cos and sin of every (row, pair) angle, computed once for many [T, d] buffers that share
// positions (all heads of a layer, all layers). Rotating with a table gives exactly the
// same floats as the functions above.
struct RopeTable {
  int64_t tokens = 0;
  int64_t head_dim = 0;
  std::vector<float> cos, sin;  // [tokens, head_dim/2], row t at positions[t]
};
RopeTable make_rope_table(int64_t T, int64_t d, const int64_t* positions, double theta);
// The same for given inverse frequencies (d/2 of them), e.g. a model's scaled ones
// (llama3 or linear RoPE scaling, sim/model/rope_scaling.h); angle = float(pos) · inv_freq[i].
RopeTable make_rope_table(int64_t T, const int64_t* positions, const std::vector<float>& inv_freq);
void apply_rope(float* x, const RopeTable& table);   // x: [table.tokens, table.head_dim]
void invert_rope(float* x, const RopeTable& table);
// One row x [d] at table row t (e.g. a single query or key).
void apply_rope_row(float* x, const RopeTable& table, int64_t t);

// Every head of a [heads, T, d] tensor, in place; positions has length T (or is empty
// for 0..T-1). Throws kvb::Error if the tensor is not rank 3 with even d, or the
// positions do not match T.
void apply_rope(Tensor& heads, const std::vector<int64_t>& positions, double theta);
void invert_rope(Tensor& heads, const std::vector<int64_t>& positions, double theta);

}  // namespace kvb
