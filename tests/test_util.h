// Helpers shared by the test programs.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace kvb::test {

// Bundled data (data/ in the repo).
inline std::filesystem::path data_dir() { return KVB_TEST_DATA_DIR; }
inline std::filesystem::path source_dir() { return KVB_TEST_SOURCE_DIR; }

// A fresh, empty scratch directory under the build tree, unique per test name.
inline std::filesystem::path scratch_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::path(KVB_TEST_BINARY_DIR) / "test_scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

inline std::vector<float> random_normal(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace kvb::test
