#include "sim/metrics/error_stats.h"

namespace kvb {

void ErrorStats::merge(const ErrorStats& o) {
  merge_sums(o);
  rows.insert(rows.end(), o.rows.begin(), o.rows.end());
}

void ErrorStats::merge_sums(const ErrorStats& o) {
  k_err2 += o.k_err2;
  k_norm2 += o.k_norm2;
  v_err2 += o.v_err2;
  v_norm2 += o.v_norm2;
  logit_pairs += o.logit_pairs;
  model.merge(o.model);
}

ErrorStats ErrorStats::merged(const ErrorStats* parts, size_t count, std::vector<AttentionRow> storage) {
  size_t rows = 0;
  for (size_t i = 0; i < count; ++i) rows += parts[i].rows.size();
  ErrorStats all;
  all.rows = std::move(storage);
  all.rows.clear();
  all.rows.reserve(rows);
  for (size_t i = 0; i < count; ++i) all.merge(parts[i]);
  return all;
}

ErrorStats ErrorStats::merged_in_groups(const ErrorStats* parts, size_t groups, size_t per_group,
                                        std::vector<AttentionRow> storage) {
  size_t rows = 0;
  for (size_t i = 0; i < groups * per_group; ++i) rows += parts[i].rows.size();
  ErrorStats all;
  all.rows = std::move(storage);
  all.rows.clear();
  all.rows.reserve(rows);
  for (size_t g = 0; g < groups; ++g) {
    ErrorStats group;
    for (size_t i = g * per_group; i < (g + 1) * per_group; ++i) {
      group.merge_sums(parts[i]);
      all.rows.insert(all.rows.end(), parts[i].rows.begin(), parts[i].rows.end());
    }
    all.merge_sums(group);
  }
  return all;
}

}  // namespace kvb
