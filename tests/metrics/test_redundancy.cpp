// Key redundancy ρ (sim/metrics/redundancy.h): the O(n·d) mean pairwise cosine against
// the O(n²·d) definition, edge cases, and the research definition's averaging.
#include <cmath>
#include <vector>

#include "sim/core/error.h"
#include "sim/metrics/redundancy.h"
#include "test_util.h"

namespace {

using kvb::test::random_normal;

double brute_force_mean_cosine(const float* rows, int64_t n, int64_t d) {
  double sum = 0;
  int64_t pairs = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) {
      double dot = 0, ni = 0, nj = 0;
      for (int64_t c = 0; c < d; ++c) {
        dot += static_cast<double>(rows[i * d + c]) * rows[j * d + c];
        ni += static_cast<double>(rows[i * d + c]) * rows[i * d + c];
        nj += static_cast<double>(rows[j * d + c]) * rows[j * d + c];
      }
      sum += dot / std::sqrt(ni * nj);
      ++pairs;
    }
  return sum / static_cast<double>(pairs);
}

// A recording with the given keys per layer ([kv_heads, T, d] each).
kvb::Recording recording_with_keys(const std::vector<kvb::Tensor>& keys) {
  kvb::Recording rec;
  rec.name = "test";
  rec.kv_heads = keys[0].dim(0);
  rec.q_heads = rec.kv_heads;
  rec.tokens = keys[0].dim(1);
  rec.head_dim = keys[0].dim(2);
  for (const kvb::Tensor& k : keys) {
    kvb::LayerTensors L;
    L.key = k;
    rec.layers.push_back(L);
  }
  return rec;
}

}  // namespace

TEST_CASE("redundancy: mean pairwise cosine equals the pairwise definition") {
  const int64_t n = 57, d = 24;
  std::vector<float> rows = random_normal(static_cast<size_t>(n * d), 3);
  for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i * d)] += 2.0f;  // a shared component
  const double fast = kvb::mean_pairwise_cosine(rows.data(), n, d);
  CHECK(fast == doctest::Approx(brute_force_mean_cosine(rows.data(), n, d)).epsilon(1e-9));
  CHECK(fast > 0.1);
}

TEST_CASE("redundancy: edge cases") {
  const std::vector<float> same = {1, 2, 3, 2, 4, 6, 0.5f, 1, 1.5f};  // parallel rows
  CHECK(kvb::mean_pairwise_cosine(same.data(), 3, 3) == doctest::Approx(1.0));
  const std::vector<float> opposite = {1, 0, -3, 0};
  CHECK(kvb::mean_pairwise_cosine(opposite.data(), 2, 2) == doctest::Approx(-1.0));
  // Zero rows have no direction: left out.
  const std::vector<float> with_zero = {1, 0, 0, 0, 0, 1};
  CHECK(kvb::mean_pairwise_cosine(with_zero.data(), 3, 2) == doctest::Approx(0.0));
  CHECK(std::isnan(kvb::mean_pairwise_cosine(with_zero.data(), 2, 2)));
  // The minimum, -1/(n-1): n unit vectors summing to zero.
  const std::vector<float> triangle = {1, 0, -0.5f, 0.8660254f, -0.5f, -0.8660254f};
  CHECK(kvb::mean_pairwise_cosine(triangle.data(), 3, 2) == doctest::Approx(-0.5).epsilon(1e-6));
}

TEST_CASE("redundancy: research rho averages keys over KV heads, then over layers") {
  const int64_t G = 3, T = 40, d = 16;
  std::vector<kvb::Tensor> keys;
  for (int l = 0; l < 2; ++l) {
    kvb::Tensor k({G, T, d});
    const std::vector<float> v = random_normal(static_cast<size_t>(G * T * d), 10 + l);
    std::copy(v.begin(), v.end(), k.data.begin());
    keys.push_back(k);
  }
  const kvb::Recording rec = recording_with_keys(keys);
  for (int64_t li = 0; li < 2; ++li) {
    // Reference: explicit head average of rows [5, 30).
    std::vector<float> mean(static_cast<size_t>(25 * d), 0.0f);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 5; t < 30; ++t)
        for (int64_t c = 0; c < d; ++c)
          mean[static_cast<size_t>((t - 5) * d + c)] += keys[static_cast<size_t>(li)].at(g, t, c) / G;
    CHECK(kvb::key_rho_layer(rec, li, 5, 30) ==
          doctest::Approx(brute_force_mean_cosine(mean.data(), 25, d)).epsilon(1e-6));
    CHECK(kvb::key_rho_head(rec, li, 1, 5, 30) ==
          doctest::Approx(brute_force_mean_cosine(keys[static_cast<size_t>(li)].slice(1) + 5 * d, 25, d)).epsilon(1e-9));
  }
  const double both = kvb::key_rho(rec, 5, 30);
  CHECK(both == doctest::Approx((kvb::key_rho_layer(rec, 0, 5, 30) + kvb::key_rho_layer(rec, 1, 5, 30)) / 2));
  CHECK(kvb::key_rho(rec, 5, 30, {1}) == doctest::Approx(kvb::key_rho_layer(rec, 1, 5, 30)));

  // key_rho is mean_of_layer_rhos of its per-layer values, bit for bit (what a streamed
  // recording combines, RecordingStats::key_rho).
  CHECK(kvb::key_rho_layers(rec, {5, 30, {}}) == std::vector<int64_t>{0, 1});
  CHECK(kvb::key_rho_layers(rec, {5, 30, {1, 0, 1}}) == std::vector<int64_t>{1, 0, 1});
  CHECK(kvb::key_rho(rec, 5, 30, {1, 0, 1}) ==
        kvb::mean_of_layer_rhos({kvb::key_rho_layer(rec, 1, 5, 30), kvb::key_rho_layer(rec, 0, 5, 30),
                                 kvb::key_rho_layer(rec, 1, 5, 30)}));
  CHECK_THROWS_WITH_AS(kvb::key_rho_layers(rec, {5, 30, {0, 2}}), doctest::Contains("layer index 2 outside [0, 2)"),
                       kvb::Error);
  CHECK_THROWS_WITH_AS(kvb::key_rho_layers(rec, {5, 6, {0, 2}}), doctest::Contains("token range [5, 6)"), kvb::Error);

  CHECK_THROWS_AS(kvb::key_rho_layer(rec, 2, 0, 10), kvb::Error);
  CHECK_THROWS_AS(kvb::key_rho_layer(rec, 0, 10, 11), kvb::Error);  // one token: no pairs
  CHECK_THROWS_AS(kvb::key_rho_layer(rec, 0, 0, T + 1), kvb::Error);
  CHECK_THROWS_AS(kvb::key_rho_head(rec, 0, G, 0, 10), kvb::Error);
  CHECK_THROWS_AS(kvb::key_rho_layer(rec, 0, 0, 10, kvb::KeyFrame::PreRope), kvb::Error);  // none recorded
}
