// Counter-based seeded random bits for formats that need per-unit randomness
// (randomized Hadamard signs, Gaussian sketch matrices). Pure integer arithmetic, so
// host and device draw identical bits; every (seed, layer, KV head, K/V, purpose)
// gets its own stream, and word i of a stream does not depend on how many words
// were drawn before.
#pragma once
#include <cstdint>

#include "sim/core/hd.h"

namespace kvb {

KVB_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Stream key of one cache unit and purpose (salt: a constant per format / part).
KVB_HD uint64_t unit_stream(uint64_t seed, int64_t layer, int64_t kv_head, bool is_key, uint64_t salt) {
  uint64_t h = splitmix64(seed ^ 0x6b76627564676574ull);  // "kvbudget"
  h = splitmix64(h ^ static_cast<uint64_t>(layer));
  h = splitmix64(h ^ static_cast<uint64_t>(kv_head));
  h = splitmix64(h ^ (is_key ? 1ull : 2ull));
  return splitmix64(h ^ salt);
}

// Word i of a stream.
KVB_HD uint64_t stream_word(uint64_t stream, uint64_t i) { return splitmix64(stream ^ splitmix64(i)); }

// ±1 with probability 1/2 each: bit (i mod 64) of word i/64.
KVB_HD float stream_sign(uint64_t stream, uint64_t i) {
  return ((stream_word(stream, i >> 6) >> (i & 63u)) & 1u) ? -1.0f : 1.0f;
}

}  // namespace kvb
