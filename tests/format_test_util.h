// Helpers shared by the format tests (tests/formats/).
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sim/formats/registry.h"

namespace kvb::test {

// Round-trips x ([rows, d], row-major) through the named format and returns the decoded
// values; also encodes it and checks that the bit stream is exactly the format's declared
// storage_bits (the memory accounting every budget relies on).
inline std::vector<float> roundtrip(const std::string& name, const std::vector<float>& x, int64_t rows, int64_t d,
                                    const SpanInfo& span = SpanInfo{}) {
  std::vector<float> y(x.size());
  FormatPtr f = make_format(name);
  f->roundtrip(ConstMatView{x.data(), rows, d, d}, MatView{y.data(), rows, d, d}, span);
  BitWriter w;
  f->encode(ConstMatView{x.data(), rows, d, d}, span, w);
  CHECK(w.bits() == f->storage_bits(rows, d));
  return y;
}

// Bit-for-bit equality (NaN payloads and signed zeros included).
inline bool identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace kvb::test
