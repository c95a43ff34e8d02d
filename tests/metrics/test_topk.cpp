// sim/metrics/topk.h against a plain sort: the k largest keys, ties to the lower index,
// NaN never entering, with and without a floor, for rows of every length around the
// vector width.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "sim/metrics/topk.h"
#include "test_util.h"

using namespace kvb;

namespace {

// The plain form: every index ordered by (key descending, index ascending), NaN last;
// the first min(k, non-NaN count) of them, sorted ascending.
std::vector<int32_t> topk_by_sort(const std::vector<float>& key, int64_t k) {
  std::vector<int32_t> idx;
  for (size_t j = 0; j < key.size(); ++j)
    if (!std::isnan(key[j])) idx.push_back(static_cast<int32_t>(j));
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return key[a] > key[b]; });
  idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(k)));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> topk_fast(const std::vector<float>& key, int64_t k, float floor = -INFINITY) {
  std::vector<int32_t> idx(static_cast<size_t>(k));
  std::vector<float> val;
  simd::TopK top(k, idx.data(), val, floor);
  top.scan_all(key.data(), static_cast<int64_t>(key.size()));
  idx.resize(static_cast<size_t>(top.finish()));
  return idx;
}

// Keys of one of several kinds: distinct, heavily tied, with NaN and infinities.
std::vector<float> row(std::mt19937& rng, size_t n, int kind) {
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::uniform_int_distribution<int> few(0, 3), pick(0, 9);
  std::vector<float> key(n);
  for (float& v : key) {
    v = kind == 0 ? u(rng) : static_cast<float>(few(rng));
    if (kind == 2 && pick(rng) == 0) v = NAN;
    if (kind == 2 && pick(rng) == 1) v = -INFINITY;
    if (kind == 3) v = -INFINITY;
  }
  return key;
}

}  // namespace

TEST_CASE("TopK: the plain sort's indices for every length, k, tie pattern and floor") {
  std::mt19937 rng(11);
  for (size_t n = 1; n <= 3 * static_cast<size_t>(simd::kLanes) + 3; ++n)
    for (int kind = 0; kind < 4; ++kind)
      for (int64_t k : {1, 2, 8, 17}) {
        const std::vector<float> key = row(rng, n, kind);
        const std::vector<int32_t> want = topk_by_sort(key, k);
        INFO("n = " << n << ", kind = " << kind << ", k = " << k);
        CHECK(topk_fast(key, k) == want);
        // A floor the k-th reaches: the least key taken (what the fast path derives from
        // the exact row's top-k), and one below it.
        if (static_cast<int64_t>(want.size()) == k) {
          float least = INFINITY;
          for (int32_t j : want) least = std::min(least, key[static_cast<size_t>(j)]);
          CHECK(topk_fast(key, k, least) == want);
          CHECK(topk_fast(key, k, std::nextafter(least, -INFINITY)) == want);
        }
      }
}

TEST_CASE("TopK: k = 0 selects nothing, and long rows agree with the sort") {
  std::mt19937 rng(5);
  const std::vector<float> key = row(rng, 5000, 1);
  CHECK(topk_fast(key, 0).empty());
  for (int64_t k : {1, 8, 64}) CHECK(topk_fast(key, k) == topk_by_sort(key, k));
  const std::vector<float> distinct = row(rng, 5000, 0);
  for (int64_t k : {1, 8, 64}) CHECK(topk_fast(distinct, k) == topk_by_sort(distinct, k));
}
