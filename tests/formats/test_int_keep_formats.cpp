// Integer and keep formats against a plain restatement of methods.md §2 (with the
// stored-metadata rounding of sim/formats/int_block.h): every grouping, both modes,
// 1..8 bits, every metadata dtype.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "sim/core/store_dtype.h"
#include "sim/formats/registry.h"
#include "format_test_util.h"
#include "test_util.h"

using namespace kvb;

namespace {

float store(float v, StoreDtype dt) {
  const float max = dt == StoreDtype::F16 ? 65504.0f : 3.4028234663852886e38f;
  return round_to_store(std::clamp(v, -max, max), dt);
}

// One group of values (gathered), quantized and dequantized in place.
void ref_group(std::vector<float>& g, int bits, bool sym, StoreDtype sdt, StoreDtype zdt) {
  if (sym) {
    float scale;
    if (bits == 1) {
      double sum = 0;
      for (float v : g) sum += std::fabs(v);
      scale = store(static_cast<float>(sum / static_cast<double>(g.size())), sdt);
      for (float& v : g) v = (v < 0 ? -1.0f : 1.0f) * scale;
      return;
    }
    float amax = 0;
    for (float v : g) amax = std::max(amax, std::fabs(v));
    const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
    scale = store(amax / qmax, sdt);
    for (float& v : g) {  // codes are integers (no -0)
      const int q = scale > 0 ? static_cast<int>(std::clamp(std::rint(v / scale), -qmax, qmax)) : 0;
      v = static_cast<float>(q) * scale;
    }
    return;
  }
  const float lo = *std::min_element(g.begin(), g.end()), hi = *std::max_element(g.begin(), g.end());
  const float levels = static_cast<float>((1 << bits) - 1);
  const float zero = store(lo, zdt), scale = store((hi - lo) / levels, sdt);
  for (float& v : g) v = (scale > 0 ? std::clamp(std::rint((v - zero) / scale), 0.0f, levels) : 0.0f) * scale + zero;
}

// grouping: "g<G>", "tok", "ch<G>", "ch".
std::vector<float> ref_int(const std::vector<float>& x, int64_t rows, int64_t d, int bits, bool sym,
                           const std::string& grouping, StoreDtype sdt, StoreDtype zdt) {
  std::vector<float> y = x;
  const bool along_tokens = grouping.rfind("ch", 0) == 0;
  int64_t G = grouping == "tok" ? d : (grouping == "ch" ? rows : std::stoll(grouping.substr(along_tokens ? 2 : 1)));
  if (!along_tokens) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c0 = 0; c0 < d; c0 += G) {
        std::vector<float> g(y.begin() + r * d + c0, y.begin() + r * d + c0 + G);
        ref_group(g, bits, sym, sdt, zdt);
        std::copy(g.begin(), g.end(), y.begin() + r * d + c0);
      }
  } else {
    for (int64_t c = 0; c < d; ++c)
      for (int64_t r0 = 0; r0 < rows; r0 += G) {
        const int64_t r1 = std::min(rows, r0 + G);
        std::vector<float> g;
        for (int64_t r = r0; r < r1; ++r) g.push_back(y[r * d + c]);
        ref_group(g, bits, sym, sdt, zdt);
        for (int64_t r = r0; r < r1; ++r) y[r * d + c] = g[r - r0];
      }
  }
  return y;
}

}  // namespace

TEST_CASE("int formats match the plain definition for every grouping, mode and width") {
  const int64_t rows = 45, d = 64;  // 45 rows: a partial last token group for ch<G>
  std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 400, 2.0f);
  for (int64_t c = 0; c < d; ++c) x[3 * d + c] = 0.75f;  // a constant row
  for (int64_t r = 0; r < rows; ++r) x[r * d + 9] = -1.25f;  // a constant channel
  x[7] = 1e5f;  // beyond fp16's range: saturated scale
  for (int bits : {1, 2, 3, 4, 8})
    for (const char* mode : {"sym", "asym"})
      for (const char* grouping : {"g16", "g64", "tok", "ch8", "ch"}) {
        const std::string name = "int" + std::to_string(bits) + "-" + mode + "-" + grouping;
        INFO(name);
        CHECK(test::identical(test::roundtrip(name, x, rows, d),
                        ref_int(x, rows, d, bits, std::string(mode) == "sym", grouping, StoreDtype::F16, StoreDtype::F16)));
      }
  CHECK(test::identical(test::roundtrip("int4-asym-g32-sbf16-zfp32", x, rows, d),
                  ref_int(x, rows, d, 4, false, "g32", StoreDtype::BF16, StoreDtype::F32)));
  CHECK(test::identical(test::roundtrip("int5-sym-g16-sfp32", x, rows, d),
                  ref_int(x, rows, d, 5, true, "g16", StoreDtype::F32, StoreDtype::F32)));
}

TEST_CASE("keep formats store each value at their precision") {
  const std::vector<float> x = kvb::test::random_normal(300, 401, 1e3f);
  std::vector<float> f16(x.size()), b16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    f16[i] = round_to_f16(x[i]);
    b16[i] = round_to_bf16(x[i]);
  }
  CHECK(test::identical(test::roundtrip("keep-fp16", x, 10, 30), f16));
  CHECK(test::identical(test::roundtrip("keep-bf16", x, 10, 30), b16));
  CHECK(test::identical(test::roundtrip("keep-fp32", x, 10, 30), x));
}

TEST_CASE("the storage dtype table: names, bits, stored bits and rounding agree for every dtype") {
  const std::vector<float> values = {0.0f,  -0.0f,   1.0f,   -3.14159f, 65504.0f, 65519.0f, 65520.0f,
                                     1e-8f, 6e-8f, -1e30f, 3e38f,     -1.5e-40f, 0.1f};
  std::vector<std::string> names;
  for (const StoreDtype d : kStoreDtypes) {
    const std::string name = store_dtype_name(d);
    INFO(name);
    names.push_back(name);
    StoreDtype parsed = d == StoreDtype::F32 ? StoreDtype::F16 : StoreDtype::F32;
    CHECK(parse_store_dtype(name, parsed));
    CHECK(parsed == d);
    const int bits = store_dtype_bits(d);
    CHECK((bits == 16 || bits == 32));
    CHECK(std::isfinite(store_dtype_max(d)));
    CHECK(store_saturating(1e30f * 1e30f, d) == round_to_store(store_dtype_max(d), d));
    for (const float v : values) {
      INFO(v);
      const uint32_t stored = store_bits(v, d);
      if (bits < 32) CHECK((stored >> bits) == 0u);  // fits its width
      CHECK(float_bits(store_bits_value(stored, d)) == float_bits(round_to_store(v, d)));
    }
  }
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  // fp16 saturates at its largest finite value; fp32 stores every float as it is.
  CHECK(store_saturating(1e6f, StoreDtype::F16) == 65504.0f);
  CHECK(round_to_store(0.1f, StoreDtype::F32) == 0.1f);
  StoreDtype d = StoreDtype::F16;
  CHECK((parse_store_dtype("f32", d) && d == StoreDtype::F32));
  CHECK((parse_store_dtype("f16", d) && d == StoreDtype::F16));
  CHECK(!parse_store_dtype("fp8", d));
  CHECK(d == StoreDtype::F16);
}
