// The bulk widening of 16-bit values (sim/core/half.h): f16_to_f32_n (F16C where the
// build has it), its portable loop and bf16_to_f32_n give, for every one of the 65536
// bit patterns, the bits of the per-value conversion (zeros of both signs, subnormals,
// Inf and NaN payloads included).
#include <cstdint>
#include <cstring>
#include <vector>

#include "sim/core/half.h"
#include "test_util.h"

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::vector<uint16_t> every_pattern() {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  return all;
}

}  // namespace

// Both the plain loop and f16_to_f32_n (F16C's eight at a time where the build has it),
// from every offset into a group of eight: each NaN pattern then shares its group with
// finite ones, and the tail of fewer than eight is reached from every length.
TEST_CASE("f16_to_f32_n and its portable loop equal f16_bits_to_f32 on every pattern, at any offset") {
  const std::vector<uint16_t> in = every_pattern();
  std::vector<float> out(in.size());
  for (const bool portable : {true, false})
    for (size_t offset = 0; offset < 8; ++offset) {
      CAPTURE(portable);
      CAPTURE(offset);
      const size_t n = in.size() - offset;
      if (portable) kvb::f16_to_f32_n_portable(in.data() + offset, n, out.data());
      else kvb::f16_to_f32_n(in.data() + offset, n, out.data());
      size_t differing = 0;
      for (size_t i = 0; i < n; ++i) {
        const float want = kvb::f16_bits_to_f32(in[i + offset]);
        if (bits_of(out[i]) != bits_of(want) && differing++ < 5) {
          CAPTURE(i + offset);
          CHECK(bits_of(out[i]) == bits_of(want));
        }
      }
      CHECK(differing == 0);
    }
  kvb::f16_to_f32_n(in.data(), in.size(), out.data());
  CHECK(out[0x0001] == 5.9604644775390625e-08f);  // smallest subnormal, 2^-24
  CHECK(bits_of(out[0x8000]) == 0x80000000u);     // -0
  CHECK(out[0x7bff] == 65504.0f);
  CHECK(bits_of(out[0x7d01]) == 0x7fa02000u);     // a signalling NaN stays signalling
}

TEST_CASE("bf16_to_f32_n equals bf16_bits_to_f32 on every pattern, at any offset") {
  const std::vector<uint16_t> in = every_pattern();
  std::vector<float> out(in.size());
  kvb::bf16_to_f32_n(in.data() + 3, in.size() - 3, out.data());  // an unaligned start
  size_t differing = 0;
  for (size_t i = 0; i + 3 < in.size(); ++i) differing += bits_of(out[i]) != bits_of(kvb::bf16_bits_to_f32(in[i + 3]));
  CHECK(differing == 0);
}
