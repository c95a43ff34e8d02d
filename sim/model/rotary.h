// Rotary position embeddings for the forward pass: the inverse frequencies a
// checkpoint's config implies (default, linear and llama3 scaling, computed in fp32
// as Hugging Face does) and the rotation itself in Hugging Face's rotate_half
// convention: channel i is paired with channel i + head_dim/2.
//
// The rotation is private to sim/model until sim/core/rope.h (shared with the
// synthetic generator) lands on main; then rotate_rows() calls it.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/model/model_config.h"

namespace kvb {

// inv_freq[i] for i < head_dim/2: theta^(-2i/head_dim), then scaled as rope.type says.
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim);

// cos and sin of position * inv_freq[i] for a run of consecutive positions.
struct RotaryTable {
  int64_t first_position = 0;
  int64_t positions = 0;
  int64_t half = 0;        // head_dim / 2
  std::vector<float> cos;  // [positions, half]
  std::vector<float> sin;  // [positions, half]
};
RotaryTable make_rotary_table(const std::vector<float>& inv_freq, int64_t first_position, int64_t count);

// Rotates `rows` vectors of head_dim floats in place; row r (stride `stride` floats)
// is at position table.first_position + r:
//   x'[i]        = x[i]·cos - x[i+half]·sin
//   x'[i + half] = x[i+half]·cos + x[i]·sin        (i < half)
void rotate_rows(float* x, int64_t rows, int64_t stride, const RotaryTable& table);

}  // namespace kvb
