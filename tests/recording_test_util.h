// A small random recording for the simulator's tests.
#pragma once
#include <cstdint>

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

}  // namespace kvb::test
