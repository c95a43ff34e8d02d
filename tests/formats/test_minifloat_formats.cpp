// FP8 (E4M3, E5M2), MXFP4 and NVFP4: the bit-trick encoder of sim/core/minifloat.h
// against a brute-force reference (enumerate every code, take the nearest value,
// ties to the even code, saturate), and the formats' scaled paths against plain
// re-statements of their scale rules.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "sim/core/error.h"
#include "sim/formats/fp4_format.h"
#include "sim/formats/fp8_format.h"
#include "sim/core/minifloat.h"
#include "sim/formats/registry.h"
#include "test_util.h"

using namespace kvb;

namespace {

struct RefFormat {
  int exp_bits, man_bits, bias;
  double max;
  bool has_nan_at_top;  // E4M3: S.1111.111 is NaN
  bool ieee_specials;   // E5M2: exponent 31 is Inf/NaN
};
const RefFormat kE4M3{4, 3, 7, 448.0, true, false};
const RefFormat kE5M2{5, 2, 15, 57344.0, false, true};
const RefFormat kE2M1{2, 1, 1, 6.0, false, false};

// Value of a non-negative code, or NaN when the code is not a finite number.
double ref_value(int code, const RefFormat& f) {
  const int e = code >> f.man_bits, m = code & ((1 << f.man_bits) - 1);
  const int emax_field = (1 << f.exp_bits) - 1;
  if (f.ieee_specials && e == emax_field) return m == 0 ? INFINITY : NAN;
  if (f.has_nan_at_top && code == (1 << (f.exp_bits + f.man_bits)) - 1) return NAN;
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  return std::ldexp(static_cast<double>((1 << f.man_bits) + m), e - f.bias - f.man_bits);
}

int ref_encode(float x, const RefFormat& f) {
  const int sign = std::signbit(x) ? 1 << (f.exp_bits + f.man_bits) : 0;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  if (a >= f.max)  // saturate: the nearest finite value, also for infinities
    for (int c = 0; c < (1 << (f.exp_bits + f.man_bits)); ++c)
      if (ref_value(c, f) == f.max) return sign | c;
  double best_err = INFINITY;
  for (int c = 0; c < (1 << (f.exp_bits + f.man_bits)); ++c) {
    const double v = ref_value(c, f);
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;  // beyond max the nearest finite value is max: saturation
}

float ref_decode(int code, const RefFormat& f) {
  const int sign_bit = 1 << (f.exp_bits + f.man_bits);
  const double v = ref_value(code & (sign_bit - 1), f);
  return static_cast<float>((code & sign_bit) ? -v : v);
}

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// Representable values, midpoints between neighbours and their float neighbours,
// the region past max, zeros, subnormal edges and random values at many scales.
std::vector<float> probe_values(const RefFormat& f) {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-40f, -1e-40f,
                          std::numeric_limits<float>::denorm_min()};
  std::vector<double> reps;
  for (int c = 0; c < (1 << (f.exp_bits + f.man_bits)); ++c)
    if (std::isfinite(ref_value(c, f))) reps.push_back(ref_value(c, f));
  reps.push_back(f.max * 2);  // past max: the "next" binade value
  for (size_t i = 0; i < reps.size(); ++i) {
    for (float s : {1.0f, -1.0f}) {
      const float r = static_cast<float>(reps[i]) * s;
      v.push_back(r);
      v.push_back(std::nextafter(r, INFINITY));
      v.push_back(std::nextafter(r, -INFINITY));
      if (i + 1 < reps.size()) {
        const float mid = static_cast<float>(0.5 * (reps[i] + reps[i + 1])) * s;
        v.push_back(mid);
        v.push_back(std::nextafter(mid, INFINITY));
        v.push_back(std::nextafter(mid, -INFINITY));
      }
    }
  }
  for (float scale : {1e-6f, 1e-3f, 0.1f, 1.0f, 10.0f, 300.0f, 1e4f})
    for (float x : kvb::test::random_normal(2000, static_cast<uint64_t>(scale * 1000) + 7, scale)) v.push_back(x);
  return v;
}

void check_encoder(const RefFormat& rf, MinifloatSpec spec, const char* what) {
  INFO(what);
  for (float x : probe_values(rf)) {
    const int expect = ref_encode(x, rf);
    const int got = minifloat_encode(x, spec);
    CHECK_MESSAGE(got == expect, "x = " << x << " (" << std::hexfloat << x << std::defaultfloat << ")");
    // The fast quantize-dequantize path gives the decoded code, bit for bit.
    CHECK_MESSAGE(same_bits(minifloat_round(x, spec), minifloat_decode(static_cast<uint8_t>(got), spec)), "x = " << x);
  }
  CHECK(same_bits(minifloat_round(NAN, spec), minifloat_decode(minifloat_encode(NAN, spec), spec)));
  // Every 4099th fp32 bit pattern up to +Inf, both signs: every binade, normal and subnormal.
  int wrong = 0;
  for (uint32_t bits = 0; bits <= 0x7f800000u; bits += 4099u)
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = kvb::bits_float(bits | sign);
      if (minifloat_encode(x, spec) != ref_encode(x, rf) && ++wrong <= 5) FAIL_CHECK("bits " << (bits | sign));
      // The fused encoder reads the code of what minifloat_round returns.
      if (minifloat_encode(x, spec) != minifloat_code(minifloat_round(x, spec), spec) && ++wrong <= 5)
        FAIL_CHECK("fused encoder vs minifloat_code(minifloat_round()): bits " << (bits | sign));
    }
  CHECK(wrong == 0);
  for (int c = 0; c < (1 << (rf.exp_bits + rf.man_bits + 1)); ++c)
    CHECK_MESSAGE(same_bits(minifloat_decode(static_cast<uint8_t>(c), spec), ref_decode(c, rf)), "code " << c);
}

}  // namespace

TEST_CASE("minifloat encoders round to nearest even and saturate, as a brute-force search does") {
  check_encoder(kE4M3, minifloat_e4m3(), "E4M3");
  check_encoder(kE5M2, minifloat_e5m2(), "E5M2");
  check_encoder(kE2M1, minifloat_e2m1(), "E2M1");
  CHECK(minifloat_max(minifloat_e4m3()) == 448.0f);
  CHECK(minifloat_max(minifloat_e5m2()) == 57344.0f);
  CHECK(minifloat_decode(minifloat_encode(464.0f, minifloat_e4m3()), minifloat_e4m3()) == 448.0f);  // tie -> even
  CHECK(minifloat_decode(minifloat_encode(1e6f, minifloat_e4m3()), minifloat_e4m3()) == 448.0f);
  CHECK(minifloat_decode(minifloat_encode(-INFINITY, minifloat_e5m2()), minifloat_e5m2()) == -57344.0f);
  CHECK(minifloat_decode(minifloat_encode(2.5f, minifloat_e2m1()), minifloat_e2m1()) == 2.0f);
  CHECK(minifloat_decode(minifloat_encode(5.0f, minifloat_e2m1()), minifloat_e2m1()) == 4.0f);
  CHECK(minifloat_decode(minifloat_encode(0.25f, minifloat_e2m1()), minifloat_e2m1()) == 0.0f);
  CHECK(minifloat_decode(minifloat_encode(0.75f, minifloat_e2m1()), minifloat_e2m1()) == 1.0f);
}

namespace {

// Plain restatement of each scaled format; returns the dequantized span.
std::vector<float> ref_fp8(const std::vector<float>& x, int64_t rows, int64_t d, const RefFormat& f, const char* mode,
                           float static_scale, int64_t cal) {
  std::vector<float> y(x.size());
  float span_scale = static_scale;
  if (std::string(mode) == "cal") {
    float amax = 0;
    for (int64_t i = 0; i < std::min(rows, cal) * d; ++i) amax = std::max(amax, std::fabs(x[i]));
    span_scale = amax / static_cast<float>(f.max) > 0 ? amax / static_cast<float>(f.max) : 1.0f;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float s = span_scale;
    if (std::string(mode) == "tok") {
      float amax = 0;
      for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(x[r * d + c]));
      s = amax / static_cast<float>(f.max) > 0 ? amax / static_cast<float>(f.max) : 1.0f;
    }
    for (int64_t c = 0; c < d; ++c) y[r * d + c] = ref_decode(ref_encode(x[r * d + c] / s, f), f) * s;
  }
  return y;
}

std::vector<float> ref_mxfp4(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    int e = -127;
    if (amax > 0) {
      int ex;
      std::frexp(amax, &ex);  // amax = m 2^ex, m in [0.5, 1)
      e = std::clamp(ex - 1 - 2, -127, 127);
    }
    const double X = std::ldexp(1.0, e);
    for (int j = 0; j < 32; ++j)
      y[b + j] = static_cast<float>(ref_decode(ref_encode(static_cast<float>(x[b + j] / X), kE2M1), kE2M1) * X);
  }
  return y;
}

std::vector<float> ref_nvfp4(const std::vector<float>& x) {
  float amax_all = 0;
  for (float v : x) amax_all = std::max(amax_all, std::fabs(v));
  const float g = amax_all / 2688.0f > 0 ? amax_all / 2688.0f : 1.0f;
  std::vector<float> y(x.size());
  for (size_t b = 0; b < x.size(); b += 16) {
    float amax = 0;
    for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float s = ref_decode(ref_encode(amax / 6.0f / g, kE4M3), kE4M3);
    const float eff = s * g;
    for (int j = 0; j < 16; ++j)
      y[b + j] = ref_decode(ref_encode(eff > 0 ? x[b + j] / eff : 0.0f, kE2M1), kE2M1) * eff;
  }
  return y;
}

std::vector<float> roundtrip(const std::string& name, const std::vector<float>& x, int64_t rows, int64_t d) {
  std::vector<float> y(x.size());
  FormatPtr f = make_format(name);
  f->roundtrip(ConstMatView{x.data(), rows, d, d}, MatView{y.data(), rows, d, d}, SpanInfo{});
  BitWriter w;
  f->encode(ConstMatView{x.data(), rows, d, d}, SpanInfo{}, w);
  CHECK(w.bits() == f->storage_bits(rows, d));
  return y;
}

void check_same(const std::vector<float>& got, const std::vector<float>& expect, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == expect.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!same_bits(got[i], expect[i]) && bad++ < 5) CHECK_MESSAGE(false, "element " << i << ": " << got[i] << " vs " << expect[i]);
  CHECK(bad == 0);
}

std::vector<float> test_span(int64_t rows, int64_t d, uint64_t seed) {
  std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), seed, 2.0f);
  for (int64_t c = 0; c < d; c += 17) x[c] = 0.0f;                 // zeros
  for (int64_t c = 0; c < 32; ++c) x[d + c] = 1.5f;                // an all-equal block
  for (int64_t i = 5 * d; i < 6 * d; ++i) x[i] *= 1e-4f;           // a tiny row
  for (int64_t i = 7 * d; i < 8 * d; i += 3) x[i] *= 500.0f;        // outliers past E4M3's range
  return x;
}

}  // namespace

TEST_CASE("dividing by a power-of-two scale through its reciprocal is bit-identical to the division") {
  std::vector<float> scales;
  for (int k = -126; k <= 127; ++k)
    for (float sign : {1.0f, -1.0f}) scales.push_back(sign * std::ldexp(1.0f, k));
  for (const ScaleDivisor d : {scale_divisor(scales.front()), scale_divisor(-scales.back())})
    CHECK(d.inverse != 0.0f);
  for (float other : {3.0f, 0.1f, std::ldexp(1.0f, -127), std::ldexp(1.0f, -149), 0.0f, INFINITY, NAN})
    CHECK(scale_divisor(other).inverse == 0.0f);  // divided, not multiplied
  int wrong = 0;
  for (float scale : scales) {
    const ScaleDivisor d = scale_divisor(scale);
    REQUIRE(d.inverse != 0.0f);
    for (uint32_t bits = 0; bits < 0x7f800000u; bits += 1048573u)  // about 2000 magnitudes, both signs
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float x = bits_float(bits | sign);
        if (!same_bits(divide(x, d), x / scale) && ++wrong <= 5) FAIL_CHECK(x << " / " << scale);
      }
  }
  CHECK(wrong == 0);
}

TEST_CASE("fp8 formats: static, calibrated and per-token scales") {
  const int64_t rows = 40, d = 64;
  const std::vector<float> x = test_span(rows, d, 11);
  check_same(roundtrip("fp8-e4m3", x, rows, d), ref_fp8(x, rows, d, kE4M3, "static", 1.0f, 0), "fp8-e4m3");
  check_same(roundtrip("fp8-e5m2", x, rows, d), ref_fp8(x, rows, d, kE5M2, "static", 1.0f, 0), "fp8-e5m2");
  check_same(roundtrip("fp8-e4m3-s0.25", x, rows, d), ref_fp8(x, rows, d, kE4M3, "static", 0.25f, 0), "s0.25");
  check_same(roundtrip("fp8-e4m3-cal16", x, rows, d), ref_fp8(x, rows, d, kE4M3, "cal", 1.0f, 16), "cal16");
  check_same(roundtrip("fp8-e5m2-cal4", x, rows, d), ref_fp8(x, rows, d, kE5M2, "cal", 1.0f, 4), "e5m2 cal4");
  check_same(roundtrip("fp8-e4m3-tok", x, rows, d), ref_fp8(x, rows, d, kE4M3, "tok", 1.0f, 0), "tok");
  // Values so small that absmax / max underflows: scale 1, signed zeros, never x / 0.
  std::vector<float> deep(static_cast<size_t>(rows * d));
  for (size_t i = 0; i < deep.size(); ++i) deep[i] = std::ldexp(static_cast<float>(i % 7) - 3.0f, -149);
  const std::vector<float> deep_tok = roundtrip("fp8-e4m3-tok", deep, rows, d);
  check_same(deep_tok, ref_fp8(deep, rows, d, kE4M3, "tok", 1.0f, 0), "tok deep subnormals");
  CHECK(std::all_of(deep_tok.begin(), deep_tok.end(), [](float v) { return v == 0.0f; }));
  check_same(roundtrip("fp8-e4m3-cal16", deep, rows, d), ref_fp8(deep, rows, d, kE4M3, "cal", 1.0f, 16), "cal deep");
  check_same(roundtrip("fp8-e5m2-cal4", deep, rows, d), ref_fp8(deep, rows, d, kE5M2, "cal", 1.0f, 4), "e5m2 deep");
  CHECK(make_format("fp8-e4m3")->storage_bits(100, 64) == 100 * 64 * 8);
  CHECK(make_format("fp8-e4m3-cal16")->storage_bits(100, 64) == 100 * 64 * 8 + 32);
  CHECK(make_format("fp8-e4m3-tok")->storage_bits(100, 64) == 100 * 64 * 8 + 100 * 32);
  CHECK(make_format("fp8-e4m3-s1")->name() == "fp8-e4m3");
  CHECK(make_format("fp8-e4m3-s0.1")->name() == "fp8-e4m3-s0.1");
  CHECK_THROWS_AS(make_format("fp8-e3m4"), ConfigError);
  CHECK_THROWS_AS(make_format("fp8-e4m3-s0"), ConfigError);
  CHECK_THROWS_AS(make_format("fp8-e4m3-cal0"), ConfigError);
  CHECK_THROWS_WITH_AS(make_format("fp8-e4m3-s1e-3"), doctest::Contains("plain decimal such as s0.001"), ConfigError);
}

TEST_CASE("mxfp4 and nvfp4 follow their scale rules exactly") {
  const int64_t rows = 24, d = 128;
  std::vector<float> x = test_span(rows, d, 12);
  for (int64_t c = 0; c < 32; ++c) x[2 * d + c] = 1e-41f * static_cast<float>(c);  // fp32-subnormal block
  check_same(roundtrip("mxfp4", x, rows, d), ref_mxfp4(x), "mxfp4");
  check_same(roundtrip("nvfp4", x, rows, d), ref_nvfp4(x), "nvfp4");
  const std::vector<float> zeros(static_cast<size_t>(4 * d), 0.0f);
  check_same(roundtrip("nvfp4", zeros, 4, d), zeros, "nvfp4 zeros");
  check_same(roundtrip("mxfp4", zeros, 4, d), zeros, "mxfp4 zeros");
  // A span so small that amax / 2688 underflows: zeros, never 0/0.
  std::vector<float> deep(static_cast<size_t>(4 * d));
  for (size_t i = 0; i < deep.size(); ++i) deep[i] = std::ldexp(static_cast<float>(i % 7) - 3.0f, -149);
  check_same(roundtrip("nvfp4", deep, 4, d), std::vector<float>(deep.size(), 0.0f), "nvfp4 deep subnormals");
  check_same(roundtrip("nvfp4", deep, 4, d), ref_nvfp4(deep), "nvfp4 deep subnormals vs reference");
  // Bits per element of methods.md §1.
  CHECK(make_format("mxfp4")->bpe(1000, 128) == 4.25);
  CHECK(make_format("nvfp4")->storage_bits(1000, 128) == 1000 * 128 * 4 + 1000 * 8 * 8 + 32);
  CHECK(make_format("nvfp4")->bpe(1000, 128) == doctest::Approx(4.5).epsilon(1e-3));
  CHECK(make_format("mxfp4")->check_shape(1, 48) != "");
  CHECK(make_format("nvfp4")->check_shape(1, 48) == "");
  // MX: a block whose max is 7.9 (scale 2^(2-2) = 1) clips to 6; a block of 0.3 uses scale 2^(-2-2).
  std::vector<float> b(32, 0.0f);
  b[0] = 7.9f;
  b[1] = 2.6f;
  std::vector<float> y = roundtrip("mxfp4", b, 1, 32);
  CHECK(y[0] == 6.0f);
  CHECK(y[1] == 3.0f);
}
