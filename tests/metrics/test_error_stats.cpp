// The fields of an attention row, listed once (sim/metrics/error_stats.h): every
// value is found when it alone is not finite, and names are distinct.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

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

}  // namespace kvb
