// The fast path's fp32 per-element arithmetic has two forms: scalar (KVB_HD, in
// sim/metrics/attention_shift.h: the CUDA row kernels) and kLanes (8 or 16) lanes at a time
// (sim/metrics/row_simd.h: sim/attention_error_fast.cpp). Both run the same fp32
// operations in the same order (fmaf where the lanes fuse), so they agree bit for bit; and both are
// close to the fp64 functions they stand for.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "sim/metrics/attention_shift.h"
#include "sim/metrics/row_simd.h"
#include "test_util.h"

using namespace kvb;

namespace {

// The lanes of `op` applied to kLanes inputs at once.
template <class Op>
std::vector<float> lanes(const std::vector<float>& x, Op op) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); i += simd::kLanes) {
    const int64_t cnt = std::min<int64_t>(simd::kLanes, static_cast<int64_t>(x.size() - i));
    simd::store(out.data() + i, op(simd::load(x.data() + i, cnt)), cnt);
  }
  return out;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::vector<float> inputs() {
  std::vector<float> x = {0.0f, -0.0f, 1e-30f, -1e-7f, 0.5f, -0.999f, 1.0f, -1.0f, 1.0001f, 5.0f, -20.0f,
                          -87.0f, -87.3365f, -87.4f, -100.0f, 88.7f, 88.8f, 200.0f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-90.0f, 90.0f), narrow(-2.0f, 2.0f);
  for (int i = 0; i < 2000; ++i) x.push_back(i % 2 ? wide(rng) : narrow(rng));
  while (x.size() % simd::kLanes) x.push_back(0.25f);
  return x;
}

}  // namespace

TEST_CASE("attn_exp_f32 and attn_expm1_minus_x: the scalar twins of the SIMD lanes, bit for bit") {
  const std::vector<float> x = inputs();
  const std::vector<float> e = lanes(x, [](simd::f32v v) { return simd::exp(v); });
  const std::vector<float> phi = lanes(x, [](simd::f32v v) { return simd::expm1_minus_x(v); });
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i]);
    CHECK(same_bits(attn_exp_f32(x[i]), e[i]));
    CHECK(same_bits(attn_expm1_minus_x(x[i]), phi[i]));
  }
}

TEST_CASE("attn_exp_f32, attn_expm1_minus_x and attn_exact_weight against fp64") {
  for (float x : inputs()) {
    INFO("x = " << x);
    const double e = std::exp(static_cast<double>(x));
    if (x < -87.3365f) CHECK(attn_exp_f32(x) == 0.0f);
    else if (x > 88.7228f) CHECK(std::isinf(attn_exp_f32(x)));
    else if (e > 1e-37) CHECK(std::fabs(attn_exp_f32(x) - e) <= 3e-7 * e);
    const double phi = std::expm1(static_cast<double>(x)) - x;
    if (std::fabs(x) < 20.0f) CHECK(std::fabs(attn_expm1_minus_x(x) - phi) <= 1e-6 * std::fabs(phi) + 1e-44);
  }
  // The weight recovers the rounding of s - m: logits 40 apart, where s - m loses bits.
  const float s = 40.123456f, m = 80.0f;
  const double exact = std::exp(static_cast<double>(s) - static_cast<double>(m));
  CHECK(std::fabs(attn_exact_weight(s, m) - exact) <= 3e-7 * exact);
  CHECK(attn_exact_weight(m, m) == 1.0f);
  CHECK(attn_exact_weight(-INFINITY, m) == 0.0f);
}

// Units in the last place between two positive doubles (their bit patterns' distance).
int64_t ulps_apart(double a, double b) {
  int64_t ia, ib;
  std::memcpy(&ia, &a, sizeof a);
  std::memcpy(&ib, &b, sizeof b);
  return ia > ib ? ia - ib : ib - ia;
}

TEST_CASE("simd::exp on fp64 lanes: within 1 ulp of std::exp, and its edges") {
  std::vector<double> x = {0.0,     -0.0,     1e-300,  -1e-17,  0.5,      -0.5,    0.34657359, -0.34657359,
                           1.0,     -1.0,     -20.0,   -87.5,   -700.0,   -708.39, -708.4,     -730.0,
                           -744.0,  -745.13,  -745.14, -746.0,  -1e300,   700.0,   709.78,     709.7827,
                           709.783, 1e300,    -INFINITY, INFINITY, std::nan("")};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> wide(-745.0, 709.0), narrow(-40.0, 0.0);
  for (int i = 0; i < 200000; ++i) x.push_back(i % 2 ? wide(rng) : narrow(rng));
  const int64_t half = simd::kLanes / 2;
  while (x.size() % half) x.push_back(0.25);
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); i += half) {
    simd::f64h v;
    std::memcpy(&v, x.data() + i, sizeof v);
    const simd::f64h e = simd::exp(v);
    for (int64_t l = 0; l < half; ++l) {
      const double xi = x[i + l], want = std::exp(xi), got = e[l];
      INFO("x = " << xi << ", std::exp " << want << ", lanes " << got);
      if (std::isnan(xi)) {
        CHECK(std::isnan(got));
      } else if (want == 0.0 || std::isinf(want) || want < 2.2250738585072014e-308) {
        // Where std::exp underflows to 0 or a subnormal, or overflows: the same class,
        // and a subnormal within its absolute rounding.
        if (std::isinf(want)) CHECK(got == want);
        else CHECK(std::fabs(got - want) <= 1e-323);
      } else {
        const int64_t d = ulps_apart(got, want);
        worst = std::max(worst, d);
        CHECK(d <= 1);
      }
    }
  }
  MESSAGE("largest distance from std::exp: " << worst << " ulp");
}
