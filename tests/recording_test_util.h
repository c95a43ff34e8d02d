// A small random recording for the simulator's tests.
#pragma once
#include <cstdint>
#include <numeric>

#include "sim/formats/prerope_format.h"
#include "sim/recording.h"
#include "test_util.h"

namespace kvb::test {

// Two identical layers of N(0, 1) keys and values and N(0, q_scale²) queries, [heads, T, d],
// seeded (queries seed, keys seed + 1, values seed + 2).
inline Recording random_recording(int64_t q_heads, int64_t kv_heads, int64_t T, int64_t d, uint64_t seed,
                                  float q_scale = 1.0f) {
  Recording r;
  r.name = "random";
  r.source = "test";
  r.q_heads = q_heads;
  r.kv_heads = kv_heads;
  r.tokens = T;
  r.head_dim = d;
  LayerTensors L;
  L.query = Tensor({q_heads, T, d});
  L.key = Tensor({kv_heads, T, d});
  L.value = Tensor({kv_heads, T, d});
  L.query.data = random_normal(L.query.data.size(), seed, q_scale);
  L.key.data = random_normal(L.key.data.size(), seed + 1);
  L.value.data = random_normal(L.value.data.size(), seed + 2);
  r.layers = {L, L};
  r.layer_ids = {0, 1};
  r.validate();
  return r;
}

// The shape of random_layers' recording.
struct RandomShape {
  int64_t layers = 2;
  int64_t q_heads = 2;
  int64_t kv_heads = 1;
  int64_t tokens = 64;
  int64_t head_dim = 32;
  uint64_t seed = 1;
  float q_scale = 1.0f;  // queries are N(0, q_scale²)
  bool rope = false;     // keys post-RoPE (base 1e4), their pre-RoPE version kept too
};

// Layers of distinct N(0, 1) keys and values and N(0, q_scale²) queries, [heads, T, d],
// positions 0..T-1. Layer l draws queries, keys and values from seeds seed + 3l, +1, +2.
inline Recording random_layers(const RandomShape& s) {
  Recording r;
  r.name = "random";
  r.source = "test";
  r.q_heads = s.q_heads;
  r.kv_heads = s.kv_heads;
  r.tokens = s.tokens;
  r.head_dim = s.head_dim;
  r.rope.applied = s.rope;
  r.positions.resize(static_cast<size_t>(s.tokens));
  std::iota(r.positions.begin(), r.positions.end(), 0);
  const int64_t T = s.tokens, d = s.head_dim;
  for (int64_t l = 0; l < s.layers; ++l) {
    const uint64_t seed = s.seed + 3 * static_cast<uint64_t>(l);
    LayerTensors L;
    L.query = Tensor({s.q_heads, T, d});
    L.key = Tensor({s.kv_heads, T, d});
    L.value = Tensor({s.kv_heads, T, d});
    L.query.data = random_normal(L.query.data.size(), seed, s.q_scale);
    L.key.data = random_normal(L.key.data.size(), seed + 1);
    L.value.data = random_normal(L.value.data.size(), seed + 2);
    if (s.rope) {
      L.key_pre_rope = L.key;
      for (int64_t row = 0; row < s.kv_heads * T; ++row)
        rope_rotate_row(L.key.data.data() + row * d, d, static_cast<double>(row % T), 1e4);
    }
    r.layers.push_back(std::move(L));
    r.layer_ids.push_back(static_cast<int>(l));
  }
  r.validate();
  return r;
}

}  // namespace kvb::test
