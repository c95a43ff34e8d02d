// Portable seeded random numbers for the synthetic generator.
//
// std::normal_distribution and friends are implementation-defined (libstdc++ and libc++
// give different streams), so the generator uses its own: splitmix64 to derive seeds,
// xoshiro256** for the stream, 53-bit uniforms and Marsaglia's polar method for normals,
// all with explicit arithmetic. A stream is identified by (seed, purpose, layer, head),
// so any unit of work can be generated independently, in any order, on any thread.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace kvb::synth {

// One splitmix64 step: advances state and returns a well-mixed 64-bit value.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A seed for the stream named by `parts` (e.g. {seed, purpose, layer, head}).
inline uint64_t derive_seed(std::initializer_list<uint64_t> parts) {
  uint64_t state = 0x6b76627564676574ull;  // "kvbudget"
  uint64_t out = 0;
  for (uint64_t p : parts) {
    state ^= p;
    out = splitmix64(state);
    state = out;
  }
  return out;
}

// xoshiro256** (Blackman & Vigna), seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = splitmix64(sm);
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0 (multiply-shift; bias < n / 2^64, irrelevant here).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64); }

  // Standard normal, Marsaglia's polar method; the second value of each pair is kept.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

  // ±1 with probability 1/2 each.
  double sign() { return (next_u64() >> 63) ? 1.0 : -1.0; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

// Fisher–Yates shuffle of [first, first + n) with this stream.
template <typename T>
void shuffle(T* first, int64_t n, Rng& rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    T tmp = first[i];
    first[i] = first[j];
    first[j] = tmp;
  }
}

}  // namespace kvb::synth
