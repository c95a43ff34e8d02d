// Causal multi-head attention of new queries over a key/value cache (host, fp32).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "sim/plan.h"
#include "sim/reconstruction.h"

namespace kvb {

struct AttentionGeometry {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;   // divides q_heads; query head h reads KV head h / (q_heads / kv_heads)
  int64_t head_dim = 0;
  float score_scale = 1;  // scores are q·k * score_scale
  int64_t window = 0;     // sliding-window attention: 0 = full causal; W > 0: query t sees keys t - W < j <= t
};

// The versions of one KV head's keys (or values) a query may read, each
// [context, head_dim] rows. Without a plan all three are the exact cache.
struct KvUnitView {
  const float* stored = nullptr;         // the cache's stored version (segments' formats)
  const float* exact = nullptr;          // the exact values
  const float* window = nullptr;         // the window-precision version, or nullptr
  UnitPlan plan;                         // the plan's unit at the cache's length (Plan::unit_at):
                                         // its window and open groups; no segments without a plan
  std::vector<EstimatedKeys> estimated;  // keys only: estimated segments, ascending (keep range: the segment)
};

// What attention reads for one layer: per KV head, keys and values, and the plan's
// prefill. Query t reads token j's version row_versions(plan, prefill, t).of(j)
// (sim/plan.h): the same selection as the recording simulator's.
struct KvLayerView {
  std::vector<KvUnitView> keys, values;
  int64_t prefill = 0;
};

// n queries at positions context - n .. context - 1 attend to the cache's keys and
// values 0 .. context - 1 (causally): out = softmax(q·kᵀ·scale)·v per query head.
//   queries: row r, head h starts at queries + r * query_stride + h * head_dim
//   out: [n, q_heads * head_dim] row-major (sized by the caller), heads concatenated
// Softmax is computed in fp32 with a double-precision normalizer. Work is split into
// (head, block of query rows) tasks of fixed size, run with OpenMP outside a parallel
// region; results do not depend on the thread count.
void causal_attention(const float* queries, int64_t query_stride, int64_t n, int64_t context, const KvLayerView& kv,
                      const AttentionGeometry& geo, float* out);

}  // namespace kvb
