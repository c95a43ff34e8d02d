// Rotation + Lloyd-Max ("turbo"): the Lloyd-Max table of methods.md §5, measured MSE,
// TurboQuant's bound, exact bits per element, and a plain reference implementation
// that the format must match bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/lloyd_max.h"
#include "sim/formats/registry.h"
#include "sim/formats/seeded.h"
#include "sim/formats/turbo_format.h"
#include "format_test_util.h"
#include "test_util.h"

using namespace kvb;

namespace {

const double kLloydMaxMse[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};  // methods.md §5

// ---------------------------------------------------------------- plain reference
void ref_hadamard(std::vector<float>& v) {
  const size_t n = v.size();
  for (size_t half = 1; half < n; half *= 2)
    for (size_t start = 0; start < n; start += 2 * half)
      for (size_t j = start; j < start + half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a + b;
        v[j + half] = a - b;
      }
}

struct RefSpec {
  int bits;
  int64_t outliers = 0;
  int outlier_bits = 0;
  int64_t cal = 128;
};

std::vector<float> ref_turbo(const std::vector<float>& x, int64_t rows, int64_t d, const RefSpec& s,
                             const SpanInfo& span) {
  // Channel order: outliers (largest energy on the calibration rows, lower channel on
  // ties) then the rest, each ascending.
  std::vector<int64_t> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), 0);
  if (s.outliers > 0) {
    std::vector<double> energy(static_cast<size_t>(d), 0.0);
    for (int64_t r = 0; r < std::min(rows, s.cal); ++r)
      for (int64_t c = 0; c < d; ++c) energy[c] += static_cast<double>(x[r * d + c]) * x[r * d + c];
    std::vector<int64_t> out, rest;
    std::vector<bool> taken(static_cast<size_t>(d), false);
    for (int64_t k = 0; k < s.outliers; ++k) {
      int64_t best = -1;
      for (int64_t c = 0; c < d; ++c)
        if (!taken[c] && (best < 0 || energy[c] > energy[best])) best = c;
      taken[best] = true;
    }
    for (int64_t c = 0; c < d; ++c) (taken[c] ? out : rest).push_back(c);
    order = out;
    order.insert(order.end(), rest.begin(), rest.end());
  }
  // Parts: the outliers, then the rest split into descending powers of two.
  struct Part { int64_t offset, size; int bits; };
  std::vector<Part> parts;
  int64_t offset = 0, rest = d;
  if (s.outliers > 0) {
    parts.push_back({0, s.outliers, s.outlier_bits});
    offset = s.outliers;
    rest = d - s.outliers;
  }
  while (rest > 0) {
    int64_t p = 1;
    while (p * 2 <= rest) p *= 2;
    parts.push_back({offset, p, s.bits});
    offset += p;
    rest -= p;
  }
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t pi = 0; pi < parts.size(); ++pi) {
      const Part& p = parts[pi];
      const LloydMaxCodebook& book = lloyd_max_gaussian(p.bits);
      const uint64_t stream = turbo_sign_stream(span, static_cast<int>(pi));
      std::vector<float> v(static_cast<size_t>(p.size)), sign(v.size());
      for (int64_t i = 0; i < p.size; ++i) {
        v[i] = x[r * d + order[p.offset + i]];
        sign[i] = stream_sign(stream, static_cast<uint64_t>(i));
      }
      float ss = 0;
      for (float a : v) ss += a * a;
      const float norm = std::sqrt(ss);
      const float inv = norm > 0 ? 1.0f / norm : 0.0f;
      std::vector<float> w(v.size());
      for (size_t i = 0; i < v.size(); ++i) w[i] = v[i] * sign[i];
      ref_hadamard(w);
      std::vector<float> c(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        const float z = w[i] * inv;
        int code = 0;
        for (float t : book.thresholds) code += t < z ? 1 : 0;
        c[i] = book.centroids[code];
      }
      const float norm16 = f16_bits_to_f32(f32_to_f16_bits(std::min(norm, 65504.0f)));
      ref_hadamard(c);
      const float scale = norm16 * (1.0f / static_cast<float>(p.size));
      for (size_t i = 0; i < v.size(); ++i) y[r * d + order[p.offset + i]] = c[i] * scale * sign[i];
    }
  }
  return y;
}

double relative_mse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    n += static_cast<double>(x[i]) * x[i];
  }
  return e / n;
}

}  // namespace

TEST_CASE("Lloyd-Max codebooks reproduce the table of methods.md §5") {
  for (int b = 1; b <= 4; ++b) {
    INFO("bits " << b);
    const LloydMaxCodebook& cb = lloyd_max_gaussian(b);
    CHECK(cb.mse == doctest::Approx(kLloydMaxMse[b]).epsilon(1e-3));
    // Measured on N(0, 1) samples through the fp32 thresholds and centroids.
    const std::vector<float> x = kvb::test::random_normal(1 << 20, 100 + static_cast<uint64_t>(b));
    double err = 0;
    for (float v : x) {
      int code = 0;
      for (float t : cb.thresholds) code += t < v ? 1 : 0;
      err += (static_cast<double>(v) - cb.centroids[code]) * (static_cast<double>(v) - cb.centroids[code]);
    }
    CHECK(err / static_cast<double>(x.size()) == doctest::Approx(kLloydMaxMse[b]).epsilon(0.01));
  }
  CHECK(lloyd_max_gaussian(1).centroids_exact.back() == doctest::Approx(std::sqrt(2.0 / M_PI)).epsilon(1e-9));
  for (int b = 1; b <= 8; ++b) {  // symmetric, ascending, fixed-rate gap below sqrt(3) pi / 2
    const LloydMaxCodebook& cb = lloyd_max_gaussian(b);
    CHECK(cb.centroids.size() == (size_t{1} << b));
    CHECK(std::is_sorted(cb.thresholds.begin(), cb.thresholds.end()));
    CHECK(cb.centroids.front() == -cb.centroids.back());
    CHECK(cb.mse * std::pow(4.0, b) < std::sqrt(3.0) * M_PI / 2);
  }
  CHECK_THROWS_AS(lloyd_max_gaussian(9), Error);
}

TEST_CASE("turbo: measured MSE on N(0,1) vectors matches Lloyd-Max within 1%") {
  const int64_t rows = 4096, d = 256;
  const std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 7);
  for (int b = 1; b <= 4; ++b) {
    INFO("bits " << b);
    const std::vector<float> y = test::roundtrip("turbo-" + std::to_string(b), x, rows, d, SpanInfo{});
    CHECK(relative_mse(x, y) == doctest::Approx(kLloydMaxMse[b]).epsilon(0.01));
  }
}

TEST_CASE("turbo: TurboQuant's bound MSE <= (sqrt(3) pi / 2) 4^-b holds for unit vectors") {
  const int64_t rows = 2000;
  for (int64_t d : {64, 128}) {
    std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 8 + static_cast<uint64_t>(d));
    for (int64_t r = 0; r < rows; ++r) {  // unit vectors, some with a dominant channel
      float* v = x.data() + r * d;
      if (r % 3 == 0) v[r % d] *= 30.0f;
      double n = 0;
      for (int64_t c = 0; c < d; ++c) n += static_cast<double>(v[c]) * v[c];
      for (int64_t c = 0; c < d; ++c) v[c] = static_cast<float>(v[c] / std::sqrt(n));
    }
    for (int b = 1; b <= 8; ++b) {
      INFO("head_dim " << d << " bits " << b);
      const std::vector<float> y = test::roundtrip("turbo-" + std::to_string(b), x, rows, d, SpanInfo{});
      const double mse = relative_mse(x, y);  // = mean ||x - x̂||² for unit vectors
      CHECK(mse <= std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -b));
      CHECK(mse >= std::pow(4.0, -b));  // Shannon lower bound
    }
  }
}

TEST_CASE("turbo: the format matches the plain reference bit for bit") {
  const int64_t rows = 97, d = 128;
  std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 21, 3.0f);
  for (int64_t c = 0; c < d; ++c) x[c] = 0.0f;                      // a zero vector
  for (int64_t c = 0; c < d; ++c) x[d + c] = 1.0f;                  // all equal
  for (int64_t r = 2; r < rows; ++r) x[r * d + 5] *= 20.0f;         // an outlier channel
  for (int64_t r = 2; r < rows; ++r) x[r * d + 77] *= 9.0f;
  for (int64_t c = 0; c < d; ++c) x[3 * d + c] = 1e4f;              // a norm above fp16's max
  for (int64_t c = 0; c < d; ++c) x[4 * d + c] *= 1e-7f;            // tiny
  SpanInfo span{3, 1, true, 0, 42};
  CHECK(test::identical(test::roundtrip("turbo-3", x, rows, d, span), ref_turbo(x, rows, d, {3}, span)));
  CHECK(test::identical(test::roundtrip("turbo-1", x, rows, d, span), ref_turbo(x, rows, d, {1}, span)));
  CHECK(test::identical(test::roundtrip("turbo-8", x, rows, d, span), ref_turbo(x, rows, d, {8}, span)));
  CHECK(test::identical(test::roundtrip("turbo-2-o64b3", x, rows, d, span), ref_turbo(x, rows, d, {2, 64, 3}, span)));
  CHECK(test::identical(test::roundtrip("turbo-2-o50%b3", x, rows, d, span), ref_turbo(x, rows, d, {2, 64, 3}, span)));
  CHECK(test::identical(test::roundtrip("turbo-1-o12.5%b4", x, rows, d, span), ref_turbo(x, rows, d, {1, 16, 4}, span)));
  CHECK(test::identical(test::roundtrip("turbo-2-o32b4-cal8", x, rows, d, span), ref_turbo(x, rows, d, {2, 32, 4, 8}, span)));
  // head_dim 96 with a split: 32 outliers + parts of 64.
  const std::vector<float> x96 = kvb::test::random_normal(static_cast<size_t>(rows * 96), 22);
  CHECK(test::identical(test::roundtrip("turbo-3-o32b5", x96, rows, 96, span), ref_turbo(x96, rows, 96, {3, 32, 5}, span)));
  // Units get their own rotation: another head, another seed or the values differ.
  const std::vector<float> a = test::roundtrip("turbo-3", x, rows, d, span);
  CHECK(!test::identical(a, test::roundtrip("turbo-3", x, rows, d, SpanInfo{3, 2, true, 0, 42})));
  CHECK(!test::identical(a, test::roundtrip("turbo-3", x, rows, d, SpanInfo{3, 1, true, 0, 43})));
  CHECK(!test::identical(a, test::roundtrip("turbo-3", x, rows, d, SpanInfo{3, 1, false, 0, 42})));
  CHECK(test::identical(a, test::roundtrip("turbo-3", x, rows, d, SpanInfo{3, 1, true, 50, 42})));  // one rotation per unit
}

TEST_CASE("turbo: exact bits per element, names and shape errors") {
  CHECK(make_format("turbo-3")->bpe(4096, 128) == 3.0 + 16.0 / 128);
  CHECK(make_format("turbo-4")->bpe(7, 64) == 4.0 + 16.0 / 64);
  // 64 channels at 3 bits + 64 at 2, two norms, a 128-bit channel mask per span.
  CHECK(make_format("turbo-2-o64b3")->storage_bits(4096, 128) == 4096u * (64 * 3 + 64 * 2 + 32) + 128u);
  // 32 at 3 + 96 = 64 + 32 at 2, three norms.
  CHECK(make_format("turbo-2-o32b3")->storage_bits(10, 128) == 10u * (32 * 3 + 96 * 2 + 48) + 128u);
  CHECK(make_format("turboquant-2.5")->name() == "turbo-2-o50%b3");
  CHECK(make_format("turbo-2-o50%b3")->storage_bits(100, 128) == make_format("turbo-2-o64b3")->storage_bits(100, 128));
  CHECK(make_format("turbo-2-o50%b3")->bpe(100, 64) == 2.5 + 32.0 / 64 + 1.0 / 100);
  CHECK(make_format("turbo-2-o50%b3")->check_shape(10, 96).find("not a power of two") != std::string::npos);
  CHECK(make_format("turbo-2-o12.50%b4")->name() == "turbo-2-o12.5%b4");
  CHECK_THROWS_AS(make_format("turbo-2-o100%b3"), ConfigError);
  CHECK_THROWS_AS(make_format("turbo-2-ob3"), ConfigError);
  CHECK(make_format("turbo-2-o64b3-cal128")->name() == "turbo-2-o64b3");
  CHECK(make_format("turbo-3")->check_shape(10, 96).find("power of two") != std::string::npos);
  CHECK(make_format("turbo-3-o32b4")->check_shape(10, 96) == "");
  CHECK(make_format("turbo-3-o128b4")->check_shape(10, 128) != "");
  CHECK_THROWS_AS(make_format("turbo-9"), ConfigError);
  CHECK_THROWS_AS(make_format("turbo-3-o48b4"), ConfigError);
  CHECK_THROWS_AS(make_format("turbo-2.5"), ConfigError);
  std::vector<float> x(96, 1.0f), y(96);
  CHECK_THROWS_WITH_AS(make_format("turbo-3")->roundtrip(ConstMatView{x.data(), 1, 96, 96},
                                                         MatView{y.data(), 1, 96, 96}, SpanInfo{}),
                       doctest::Contains("power of two"), Error);
}
