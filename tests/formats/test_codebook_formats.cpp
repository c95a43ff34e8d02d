// NF4 and the per-channel non-uniform codebooks (nuq): plain references that the
// formats must match bit for bit, bitsandbytes' NF4 thresholds, exact bits per element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/codebook.h"
#include "sim/formats/lloyd_max.h"
#include "sim/formats/nuq_format.h"
#include "sim/formats/registry.h"
#include "format_test_util.h"
#include "test_util.h"

using namespace kvb;

namespace {

int count_below(const std::vector<float>& thresholds, float x) {
  int code = 0;
  for (float t : thresholds) code += t < x ? 1 : 0;
  return code;
}

// ------------------------------------------------------------------ NF4 reference
const double kNf4[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                         -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                         0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                         0.7229568362236023, 1.0};

std::vector<float> ref_nf4(const std::vector<float>& x, int64_t group, bool fp32_scale) {
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) t.push_back(static_cast<float>((kNf4[i] + kNf4[i + 1]) / 2));
  std::vector<float> y(x.size());
  for (size_t g = 0; g < x.size(); g += static_cast<size_t>(group)) {
    float amax = 0;
    for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(x[g + i]));
    const float s = fp32_scale ? amax : f16_bits_to_f32(f32_to_f16_bits(std::min(amax, 65504.0f)));
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    for (int64_t i = 0; i < group; ++i)
      y[g + i] = static_cast<float>(kNf4[count_below(t, x[g + i] * inv)]) * s;
  }
  return y;
}

// ------------------------------------------------------------------ nuq reference
// Plain 1-D k-means: every iteration assigns each sorted sample by counting
// thresholds, then averages each cell in sorted order.
std::vector<double> ref_kmeans(std::vector<float> s, int bits, bool weighted) {
  const int K = 1 << bits;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  std::vector<double> c(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) c[k] = s[std::min(n - 1, static_cast<size_t>((k + 0.5) * static_cast<double>(n) / K))];
  std::vector<int> cell(n, -1), prev;
  for (int it = 0; it < NuqFormat::kMaxIterations; ++it) {
    for (size_t i = 0; i < n; ++i) {
      int k = 0;
      for (int j = 0; j + 1 < K; ++j) k += 0.5 * (c[j] + c[j + 1]) < static_cast<double>(s[i]) ? 1 : 0;
      cell[i] = k;
    }
    if (cell == prev) break;
    std::vector<double> sum(static_cast<size_t>(K), 0.0), wsum(static_cast<size_t>(K), 0.0);
    std::vector<int> count(static_cast<size_t>(K), 0);
    for (size_t i = 0; i < n; ++i) {
      const double v = s[i], w = weighted ? v * v : 1.0;
      sum[cell[i]] += w * v;
      wsum[cell[i]] += w;
      ++count[cell[i]];
    }
    for (int k = 0; k < K; ++k) {
      if (wsum[k] > 0) c[k] = sum[k] / wsum[k];
      else if (count[k] > 0) c[k] = 0.0;
    }
    prev = cell;
  }
  return c;
}

std::vector<float> ref_nuq(const std::vector<float>& x, int64_t rows, int64_t d, int bits, int64_t cal, bool weighted) {
  const int64_t n_cal = cal > 0 ? std::min(rows, cal) : rows;
  std::vector<float> y(x.size());
  for (int64_t c = 0; c < d; ++c) {
    std::vector<float> samples;
    for (int64_t r = 0; r < n_cal; ++r) samples.push_back(x[r * d + c]);
    std::vector<float> values;
    for (double v : ref_kmeans(samples, bits, weighted)) values.push_back(round_to_f16(static_cast<float>(v)));
    std::sort(values.begin(), values.end());
    std::vector<float> t;
    for (size_t k = 0; k + 1 < values.size(); ++k)
      t.push_back(static_cast<float>((static_cast<double>(values[k]) + values[k + 1]) / 2));
    for (int64_t r = 0; r < rows; ++r) y[r * d + c] = values[count_below(t, x[r * d + c])];
  }
  return y;
}

std::vector<float> test_span(int64_t rows, int64_t d, uint64_t seed) {
  std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), seed, 1.5f);
  for (int64_t r = 0; r < rows; ++r) {
    x[r * d + 3] = 4.0f * x[r * d + 3] + 2.0f;   // shifted, wide channel
    x[r * d + 9] = 0.25f;                          // constant channel
    x[r * d + 11] = static_cast<float>(r % 3);     // three values only
  }
  for (int64_t c = 0; c < 64; ++c) x[5 * d + c] = 0.0f;  // a zero group
  return x;
}

}  // namespace

TEST_CASE("NF4 thresholds are bitsandbytes' decision constants") {
  const double bnb[15] = {-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
                          -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
                          0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                          0.5016634166240692, 0.6427869200706482, 0.8614784181118011};
  for (int i = 0; i < 15; ++i) CHECK(nf4_threshold(i) == static_cast<float>(bnb[i]));
}

TEST_CASE("counting thresholds below x (NF4's encoder) gives the binary search's index") {
  float t[15];
  for (int i = 0; i < 15; ++i) t[i] = nf4_threshold(i);
  std::vector<float> probes = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 2.0f, -2.0f};
  for (float v : t)
    for (float p : {v, std::nextafter(v, INFINITY), std::nextafter(v, -INFINITY)}) probes.push_back(p);
  for (int i = 0; i <= 4000; ++i) probes.push_back(-1.1f + 2.2f * static_cast<float>(i) / 4000.0f);
  for (float p : probes) CHECK_MESSAGE(codebook_count_below(p, t, 16) == codebook_index(p, t, 16), "x = " << p);
}

TEST_CASE("table16_select and table16_bytes (the device's lookups of NF4 values and the iq4_nl grid) return every entry") {
  const float nf4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                         -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                         0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
                         0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
  const int8_t grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int i = 0; i < 16; ++i) {
    CHECK(table16_select(nf4, i) == nf4[i]);
    CHECK(nf4_value(i) == nf4[i]);
    CHECK(table16_select(grid, i) == grid[i]);
    CHECK(table16_bytes(grid, i) == grid[i]);
  }
  const uint8_t bytes[16] = {0, 255, 128, 127, 1, 2, 254, 3, 200, 17, 99, 100, 4, 5, 250, 6};
  for (int i = 0; i < 16; ++i) CHECK(table16_bytes(bytes, i) == bytes[i]);
}

TEST_CASE("nf4 matches the plain reference bit for bit") {
  const int64_t rows = 50, d = 128;
  const std::vector<float> x = test_span(rows, d, 31);
  CHECK(test::identical(test::roundtrip("nf4-g64", x, rows, d), ref_nf4(x, 64, false)));
  CHECK(test::identical(test::roundtrip("nf4-g32", x, rows, d), ref_nf4(x, 32, false)));
  CHECK(test::identical(test::roundtrip("nf4-g64-sfp32", x, rows, d), ref_nf4(x, 64, true)));
  CHECK(make_format("nf4")->name() == "nf4-g64");
  CHECK(make_format("nf4-g64")->bpe(4096, 128) == 4.25);
  CHECK(make_format("nf4-g64-sfp32")->bpe(4096, 128) == 4.5);
  CHECK(make_format("nf4-g64")->check_shape(1, 96) != "");
  CHECK_THROWS_AS(make_format("nf4-x"), ConfigError);
}

TEST_CASE("nuq matches the plain reference bit for bit") {
  const int64_t rows = 300, d = 16;
  const std::vector<float> x = test_span(rows, d, 32);
  CHECK(test::identical(test::roundtrip("nuq4", x, rows, d), ref_nuq(x, rows, d, 4, 0, false)));
  CHECK(test::identical(test::roundtrip("nuq3-cal64", x, rows, d), ref_nuq(x, rows, d, 3, 64, false)));
  CHECK(test::identical(test::roundtrip("nuq2-cal100-wsq", x, rows, d), ref_nuq(x, rows, d, 2, 100, true)));
  CHECK(test::identical(test::roundtrip("nuq5-cal20", x, rows, d), ref_nuq(x, rows, d, 5, 20, false)));  // fewer samples than levels
}

TEST_CASE("nuq: quality, exact bits per element, names") {
  // In-sample 4-bit per-channel codebooks on Gaussian channels approach Lloyd-Max.
  const int64_t rows = 4096, d = 8;
  const std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 33);
  const std::vector<float> y = test::roundtrip("nuq4", x, rows, d);
  double e = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    n += static_cast<double>(x[i]) * x[i];
  }
  CHECK(e / n == doctest::Approx(lloyd_max_gaussian(4).mse).epsilon(0.1));
  // b bits per element + 2^b fp16 values per channel per span.
  CHECK(make_format("nuq4-cal256")->storage_bits(4096, 128) == 4096u * 128 * 4 + 128u * 16 * 16);
  CHECK(make_format("nuq4-cal256")->bpe(4096, 128) == 4.0625);
  CHECK(make_format("nuq3-cal256-wsq")->name() == "nuq3-cal256-wsq");
  CHECK_THROWS_AS(make_format("nuq9"), ConfigError);
  CHECK_THROWS_AS(make_format("nuq4-wsq-cal8"), ConfigError);
}
