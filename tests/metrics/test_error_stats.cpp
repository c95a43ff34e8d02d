// The fields of an attention row, listed once (sim/metrics/error_stats.h): every
// value is found when it alone is not finite, and names are distinct; merging partial
// results.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "sim/metrics/error_stats.h"

namespace kvb {

TEST_CASE("the row field lists: each value is checked for finiteness, names distinct, identity apart") {
  AttentionRow row;
  row.layer = 1;
  row.q_head = 2;
  row.position = 3;
  CHECK(first_nonfinite_value(row) == nullptr);
  std::set<std::string> names;
  for (const AttentionRowId& id : kAttentionRowIds) names.insert(id.name);
  for (const AttentionRowValue& v : kAttentionRowValues) {
    INFO(v.name);
    names.insert(v.name);
    for (const float bad : {NAN, INFINITY, -INFINITY}) {
      AttentionRow r = row;
      r.*v.member = bad;
      const AttentionRowValue* found = first_nonfinite_value(r);
      REQUIRE(found != nullptr);
      CHECK(std::string(found->name) == v.name);
    }
  }
  CHECK(names.size() == std::size(kAttentionRowIds) + std::size(kAttentionRowValues));
  CHECK(row.*kAttentionRowIds[2].member == 3);  // the identity: layer, q_head, position
}

TEST_CASE("merged() is the partial results merged one by one, in order") {
  std::vector<ErrorStats> parts(3);
  for (size_t i = 0; i < parts.size(); ++i) {
    parts[i].k_err2 = 1.0 + static_cast<double>(i);
    parts[i].v_norm2 = 10.0 * static_cast<double>(i);
    parts[i].logit_pairs = static_cast<int64_t>(i) + 5;
    for (int32_t r = 0; r < static_cast<int32_t>(i) + 2; ++r) {
      AttentionRow row;
      row.layer = static_cast<int32_t>(i);
      row.position = r;
      row.kl = 0.5f * static_cast<float>(r + 1);
      parts[i].rows.push_back(row);
    }
  }
  ErrorStats one_by_one;
  for (const ErrorStats& p : parts) one_by_one.merge(p);
  const ErrorStats all = ErrorStats::merged(parts.data(), parts.size());
  CHECK(all.k_err2 == one_by_one.k_err2);
  CHECK(all.v_norm2 == one_by_one.v_norm2);
  CHECK(all.logit_pairs == one_by_one.logit_pairs);
  REQUIRE(all.rows.size() == 2 + 3 + 4);
  for (size_t i = 0; i < all.rows.size(); ++i) {
    CHECK(all.rows[i].layer == one_by_one.rows[i].layer);
    CHECK(all.rows[i].position == one_by_one.rows[i].position);
    CHECK(all.rows[i].kl == one_by_one.rows[i].kl);
  }
  CHECK(ErrorStats::merged(nullptr, 0).rows.empty());
  // Into the memory of an earlier result (a sweep's pool): that result's rows are gone,
  // its capacity kept, the merge the same.
  std::vector<AttentionRow> storage(50, AttentionRow{});
  const AttentionRow* memory = storage.data();
  const ErrorStats reused = ErrorStats::merged(parts.data(), parts.size(), std::move(storage));
  CHECK(reused.rows.data() == memory);
  REQUIRE(reused.rows.size() == all.rows.size());
  for (size_t i = 0; i < all.rows.size(); ++i) CHECK(std::memcmp(&reused.rows[i], &all.rows[i], sizeof(AttentionRow)) == 0);
  CHECK(reused.k_err2 == all.k_err2);

  // merge_sums() is merge() without the rows.
  ErrorStats sums;
  for (const ErrorStats& p : parts) sums.merge_sums(p);
  CHECK(sums.k_err2 == one_by_one.k_err2);
  CHECK(sums.v_norm2 == one_by_one.v_norm2);
  CHECK(sums.logit_pairs == one_by_one.logit_pairs);
  CHECK(sums.rows.empty());
}

TEST_CASE("merged_in_groups() has the bits of merged() over each group's merged results") {
  // 2 groups x 3 parts, sums whose fp64 additions round differently in another order.
  std::vector<ErrorStats> parts(6);
  for (size_t i = 0; i < parts.size(); ++i) {
    parts[i].k_err2 = (i % 2 ? 1e16 : 1.0) + 0.1 * static_cast<double>(i);
    parts[i].v_norm2 = 1.0 / (1.0 + static_cast<double>(i));
    parts[i].logit_pairs = static_cast<int64_t>(i) + 1;
    AttentionRow row;
    row.layer = static_cast<int32_t>(i / 3);
    row.q_head = static_cast<int32_t>(i % 3);
    parts[i].rows.push_back(row);
  }
  const ErrorStats groups[2] = {ErrorStats::merged(parts.data(), 3), ErrorStats::merged(parts.data() + 3, 3)};
  const ErrorStats expected = ErrorStats::merged(groups, 2);
  const ErrorStats all = ErrorStats::merged_in_groups(parts.data(), 2, 3);
  CHECK(all.k_err2 == expected.k_err2);
  CHECK(all.v_norm2 == expected.v_norm2);
  CHECK(all.logit_pairs == expected.logit_pairs);
  REQUIRE(all.rows.size() == 6);
  for (size_t i = 0; i < all.rows.size(); ++i) {
    CHECK(all.rows[i].layer == static_cast<int32_t>(i / 3));
    CHECK(all.rows[i].q_head == static_cast<int32_t>(i % 3));
  }
  // One part a group: merged() itself.
  const ErrorStats flat = ErrorStats::merged_in_groups(parts.data(), 6, 1), plain = ErrorStats::merged(parts.data(), 6);
  CHECK(flat.k_err2 == plain.k_err2);
  CHECK(flat.rows.size() == plain.rows.size());
  CHECK(ErrorStats::merged_in_groups(nullptr, 0, 4).rows.empty());
  std::vector<AttentionRow> storage(2, AttentionRow{});  // too small: grown, the same rows
  const ErrorStats reused = ErrorStats::merged_in_groups(parts.data(), 2, 3, std::move(storage));
  REQUIRE(reused.rows.size() == 6);
  for (size_t i = 0; i < reused.rows.size(); ++i) CHECK(reused.rows[i].q_head == static_cast<int32_t>(i % 3));
  CHECK(reused.k_err2 == expected.k_err2);
}

}  // namespace kvb
