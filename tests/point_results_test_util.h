// Comparing two runs' point results bit for bit (tests of code paths that must give the
// same numbers: long-context runs that keep fewer queries, streamed layers).
#pragma once
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "experiments/sweep.h"

namespace kvb::test {

inline bool same_doubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Every number a point reports: metrics, standard errors, intervals, annotations' count
// and attribution, compared bit for bit; every point must have succeeded.
inline void check_same_results(const std::vector<PointResult>& a, const std::vector<PointResult>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("point " << a[i].id << ": " << a[i].error << b[i].error);
    REQUIRE(a[i].ok);
    REQUIRE(b[i].ok);
    CHECK(a[i].id == b[i].id);
    CHECK(a[i].bpe == b[i].bpe);
    CHECK(a[i].plan == b[i].plan);
    CHECK(same_doubles(a[i].metrics, b[i].metrics));
    CHECK(same_doubles(a[i].standard_errors, b[i].standard_errors));
    REQUIRE(a[i].intervals.size() == b[i].intervals.size());
    for (size_t k = 0; k < a[i].intervals.size(); ++k) {
      CHECK(std::memcmp(&a[i].intervals[k].lo, &b[i].intervals[k].lo, sizeof(double)) == 0);
      CHECK(std::memcmp(&a[i].intervals[k].hi, &b[i].intervals[k].hi, sizeof(double)) == 0);
    }
    REQUIRE(a[i].annotations.size() == b[i].annotations.size());
    REQUIRE(a[i].attribution.has_value() == b[i].attribution.has_value());
    if (a[i].attribution) {
      CHECK(same_doubles(a[i].attribution->total, b[i].attribution->total));
      REQUIRE(a[i].attribution->regions.size() == b[i].attribution->regions.size());
      for (size_t r = 0; r < a[i].attribution->regions.size(); ++r)
        CHECK(same_doubles(a[i].attribution->regions[r].error, b[i].attribution->regions[r].error));
    }
  }
}

}  // namespace kvb::test
