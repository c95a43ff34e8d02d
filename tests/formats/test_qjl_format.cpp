// QJL: the sketch against a plain reference, the estimator's unbiasedness and variance
// bound, and the simulator taking QJL keys' logits from the estimator.
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/half.h"
#include "sim/formats/qjl_format.h"
#include "sim/formats/registry.h"
#include "sim/plan.h"
#include "sim/simulator.h"
#include "recording_test_util.h"
#include "test_util.h"

using namespace kvb;

namespace {

std::shared_ptr<const QjlFormat> qjl(int64_t m) {
  return std::dynamic_pointer_cast<const QjlFormat>(make_format("qjl-m" + std::to_string(m)));
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace

TEST_CASE("qjl: sketch and decoded keys match a plain reference bit for bit") {
  const int64_t rows = 40, d = 64, m = 96;
  std::vector<float> x = kvb::test::random_normal(static_cast<size_t>(rows * d), 51, 2.0f);
  for (int64_t c = 0; c < d; ++c) x[c] = 0.0f;  // a zero key
  const SpanInfo span{1, 0, true, 0, 9};
  const auto f = qjl(m);
  const std::vector<float> S = f->sketch_matrix(span, d);
  // S looks like i.i.d. N(0, 1).
  double mean = 0, var = 0;
  for (float v : S) mean += v;
  mean /= static_cast<double>(S.size());
  for (float v : S) var += (v - mean) * (v - mean);
  var /= static_cast<double>(S.size());
  CHECK(std::fabs(mean) < 0.03);
  CHECK(var == doctest::Approx(1.0).epsilon(0.05));

  BitWriter expect;
  std::vector<float> expect_y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* k = x.data() + r * d;
    float ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += k[c] * k[c];
    const uint16_t norm = f32_to_f16_bits(std::sqrt(ss));
    expect.put(norm, 16);
    std::vector<int> sign(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      float p = 0;
      for (int64_t c = 0; c < d; ++c) p += S[i * d + c] * k[c];
      sign[i] = p < 0 ? -1 : 1;
      expect.put(p < 0 ? 1 : 0, 1);
    }
    std::vector<float> u(static_cast<size_t>(d), 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < d; ++c) u[c] += static_cast<float>(sign[i]) * S[i * d + c];
    float uu = 0;
    for (float v : u) uu += v * v;
    const float scale = std::sqrt(uu) > 0 ? f16_bits_to_f32(norm) / std::sqrt(uu) : 0.0f;
    for (int64_t c = 0; c < d; ++c) expect_y[r * d + c] = u[c] * scale;
  }
  BitWriter got;
  f->encode(ConstMatView{x.data(), rows, d, d}, span, got);
  CHECK(got.bits() == f->storage_bits(rows, d));
  CHECK(got.bytes() == expect.bytes());
  std::vector<float> y(x.size());
  f->roundtrip(ConstMatView{x.data(), rows, d, d}, MatView{y.data(), rows, d, d}, span);
  CHECK(std::memcmp(y.data(), expect_y.data(), y.size() * sizeof(float)) == 0);
  CHECK(f->bpe(1000, 128) == (96.0 + 16.0) / 128);
}

TEST_CASE("qjl: the estimator is unbiased and its variance stays under pi/(2m) |q|^2 |k|^2") {
  const int64_t d = 128;
  const std::vector<float> q = kvb::test::random_normal(static_cast<size_t>(d), 52);
  std::vector<float> k = kvb::test::random_normal(static_cast<size_t>(d), 53);
  for (int64_t c = 0; c < 8; ++c) k[c] += 0.4f * q[c];  // correlated, so <q, k> is not ~0
  const double qk = dot(q.data(), k.data(), d), qq = dot(q.data(), q.data(), d), kk = dot(k.data(), k.data(), d);
  const double norm16 = f16_bits_to_f32(f32_to_f16_bits(static_cast<float>(std::sqrt(kk))));
  const double target = qk * norm16 / std::sqrt(kk);  // the estimator sees the fp16 norm
  for (int64_t m : {32, 256}) {
    INFO("m = " << m);
    const auto f = qjl(m);
    const int seeds = m > 64 ? 1000 : 3000;
    double sum = 0, sum2 = 0;
    for (int s = 0; s < seeds; ++s) {
      const auto est = f->score_estimator(ConstMatView{k.data(), 1, d, d}, SpanInfo{0, 0, true, 0, static_cast<uint64_t>(s)});
      float e = 0;
      est->estimate(ConstMatView{q.data(), 1, d, d}, 1, MatView{&e, 1, 1, 1});
      sum += e - target;
      sum2 += (e - target) * (e - target);
    }
    const double mean = sum / seeds, var = sum2 / seeds - mean * mean;
    const double bound = M_PI / (2.0 * static_cast<double>(m)) * qq * kk;
    CHECK(std::fabs(mean) < 4.0 * std::sqrt(var / seeds));  // mean error -> 0 over seeds
    CHECK(var <= bound * (1.0 + 4.0 * std::sqrt(2.0 / seeds)));
    CHECK(var >= 0.3 * bound);  // the bound is not vacuous here
  }
}

TEST_CASE("simulator: QJL keys take their logits from the estimator, not from decoded keys") {
  const int64_t T = 24, d = 32, split = 10;
  const Recording rec = test::random_layers({1, 2, 1, T, d, 60, 0.5f});
  Plan plan(1, 1, T, d);
  // Keys: the first tokens kept exactly, the rest sketched; values exact.
  plan.unit(0, 0, Kind::Key).segments = {{0, split, make_format("keep-fp32")}, {split, T, make_format("qjl-m64")}};
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  SimOptions opt;
  opt.seed = 5;
  const ErrorStats stats = simulate(rec, plan, opt);
  REQUIRE(stats.rows.size() == static_cast<size_t>(2 * T));

  const float* K = rec.layers[0].key.ptr();
  const auto f = qjl(64);
  const SpanInfo span = span_from(unit_span(rec, 0, 0, Kind::Key, opt.seed), split);
  const auto est = f->score_estimator(ConstMatView{K + split * d, T - split, d, d}, span);
  std::vector<float> khat(static_cast<size_t>((T - split) * d));
  f->roundtrip(ConstMatView{K + split * d, T - split, d, d}, MatView{khat.data(), T - split, d, d}, span);
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  double sum_est = 0, sum_dec = 0;
  for (const AttentionRow& row : stats.rows) {
    const float* q = rec.layers[0].query.slice(row.q_head) + row.position * d;
    double est_err2 = 0, dec_err2 = 0;
    const int64_t n = row.position - split + 1;  // sketched keys this query sees
    std::vector<float> e(static_cast<size_t>(std::max<int64_t>(n, 0)));
    if (n > 0) est->estimate(ConstMatView{q, 1, d, d}, n, MatView{e.data(), 1, n, n});
    for (int64_t j = split; j <= row.position; ++j) {
      const double exact = dot(q, K + j * d, d);
      est_err2 += std::pow((e[j - split] - exact) * inv_sqrt_d, 2);
      dec_err2 += std::pow((dot(q, khat.data() + (j - split) * d, d) - exact) * inv_sqrt_d, 2);
    }
    INFO("q_head " << row.q_head << " position " << row.position);
    CHECK(row.logit_err2 == doctest::Approx(est_err2).epsilon(1e-3));
    sum_est += est_err2;
    sum_dec += dec_err2;
  }
  // Decoded keys would have given other logits.
  CHECK(std::fabs(sum_dec - sum_est) > 0.05 * sum_est);
  // Tensor-level key error comes from the decoded keys.
  double kerr = 0;
  for (int64_t i = 0; i < (T - split) * d; ++i) kerr += std::pow(static_cast<double>(khat[i]) - K[split * d + i], 2);
  CHECK(stats.k_err2 == doctest::Approx(kerr).epsilon(1e-6));
}

TEST_CASE("QJL on values is an error with a clear message") {
  const Recording rec = test::random_layers({1, 2, 1, 8, 16, 70, 0.5f});
  Plan plan(1, 1, 8, 16);
  plan.assign_all(Kind::Key, make_format("qjl-m16"));
  plan.assign_all(Kind::Value, make_format("qjl-m16"));
  CHECK_THROWS_WITH_AS(simulate(rec, plan, SimOptions{}), doctest::Contains("stores keys only"), Error);
  std::vector<float> x(16, 1.0f), y(16);
  CHECK_THROWS_WITH_AS(make_format("qjl-m16")->roundtrip(ConstMatView{x.data(), 1, 16, 16}, MatView{y.data(), 1, 16, 16},
                                                         SpanInfo{0, 0, false, 0, 0}),
                       doctest::Contains("cannot store values"), ConfigError);
  CHECK_THROWS_AS(make_format("qjl-m0"), ConfigError);
  CHECK_THROWS_AS(make_format("outliers1%:qjl-m64"), ConfigError);
  CHECK_THROWS_AS(make_format("prerope:qjl-m64"), ConfigError);
}
