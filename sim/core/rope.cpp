#include "sim/core/rope.h"

#include <cmath>
#include <vector>

#include "sim/core/error.h"

namespace kvb {

float rope_inv_freq(int64_t pair, int64_t head_dim, double theta) {
  // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32.
  const float exponent = static_cast<float>(2 * pair) / static_cast<float>(head_dim);
  return 1.0f / std::pow(static_cast<float>(theta), exponent);
}

float rope_angle(int64_t pos, int64_t pair, int64_t head_dim, double theta) {
  return static_cast<float>(pos) * rope_inv_freq(pair, head_dim, theta);
}

RopeTable make_rope_table(int64_t T, int64_t d, const int64_t* positions, double theta) {
  if (d % 2 != 0) throw Error("RoPE needs an even head_dim, got " + std::to_string(d));
  std::vector<float> inv_freq(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) inv_freq[static_cast<size_t>(i)] = rope_inv_freq(i, d, theta);
  return make_rope_table(T, positions, inv_freq);
}

RopeTable make_rope_table(int64_t T, const int64_t* positions, const std::vector<float>& inv_freq) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  RopeTable table;
  table.tokens = T;
  table.head_dim = 2 * half;
  table.cos.resize(static_cast<size_t>(T * half));
  table.sin.resize(static_cast<size_t>(T * half));
  for (int64_t t = 0; t < T; ++t) {
    const float pos = static_cast<float>(positions ? positions[t] : t);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[static_cast<size_t>(i)];
      table.cos[static_cast<size_t>(t * half + i)] = std::cos(angle);
      table.sin[static_cast<size_t>(t * half + i)] = std::sin(angle);
    }
  }
  return table;
}

namespace {

// Rotates one row by the table's angles at row t; sign = +1 applies, −1 inverts.
inline void rotate_row(float* row, const RopeTable& table, int64_t t, float sign) {
  const int64_t half = table.head_dim / 2;
  const float* c = table.cos.data() + t * half;
  const float* s = table.sin.data() + t * half;
  for (int64_t i = 0; i < half; ++i) {
    const float sn = sign * s[i];
    const float lo = row[i], hi = row[i + half];
    // (x · cos) + (rotate_half(x) · sin), rotate_half(x) = [−hi, lo].
    row[i] = lo * c[i] + (-hi) * sn;
    row[i + half] = hi * c[i] + lo * sn;
  }
}

void rotate_rows(float* x, const RopeTable& table, float sign) {
  for (int64_t t = 0; t < table.tokens; ++t) rotate_row(x + t * table.head_dim, table, t, sign);
}

void rotate_heads(Tensor& heads, const std::vector<int64_t>& positions, double theta, float sign) {
  if (heads.rank() != 3 || heads.dim(2) % 2 != 0)
    throw Error("RoPE needs a [heads, tokens, head_dim] tensor with even head_dim, got " + shape_str(heads.shape));
  const int64_t H = heads.dim(0), T = heads.dim(1), d = heads.dim(2);
  if (!positions.empty() && static_cast<int64_t>(positions.size()) != T)
    throw Error("RoPE: " + std::to_string(positions.size()) + " positions for " + std::to_string(T) + " tokens");
  const RopeTable table = make_rope_table(T, d, positions.empty() ? nullptr : positions.data(), theta);
  for (int64_t h = 0; h < H; ++h) rotate_rows(heads.slice(h), table, sign);
}

}  // namespace

void apply_rope(float* x, const RopeTable& table) { rotate_rows(x, table, 1.0f); }
void invert_rope(float* x, const RopeTable& table) { rotate_rows(x, table, -1.0f); }
void apply_rope_row(float* x, const RopeTable& table, int64_t t) { rotate_row(x, table, t, 1.0f); }

void apply_rope(float* x, int64_t T, int64_t d, const int64_t* positions, double theta) {
  apply_rope(x, make_rope_table(T, d, positions, theta));
}

void invert_rope(float* x, int64_t T, int64_t d, const int64_t* positions, double theta) {
  invert_rope(x, make_rope_table(T, d, positions, theta));
}

void apply_rope(Tensor& heads, const std::vector<int64_t>& positions, double theta) {
  rotate_heads(heads, positions, theta, 1.0f);
}

void invert_rope(Tensor& heads, const std::vector<int64_t>& positions, double theta) {
  rotate_heads(heads, positions, theta, -1.0f);
}

}  // namespace kvb
