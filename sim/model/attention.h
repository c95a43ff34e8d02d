// Causal multi-head attention of new queries over a key/value cache (host, fp32).
#pragma once
#include <cstdint>
#include <vector>

namespace kvb {

struct AttentionGeometry {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;   // divides q_heads; query head h reads KV head h / (q_heads / kv_heads)
  int64_t head_dim = 0;
  float score_scale = 1;  // scores are q·k * score_scale
  int64_t window = 0;     // 0: full causal; W > 0: query t sees keys t - W < j <= t
};

// n queries at positions context - n .. context - 1 attend to the cache's keys and
// values 0 .. context - 1 (causally): out = softmax(q·kᵀ·scale)·v per query head.
//   queries: row r, head h starts at queries + r * query_stride + h * head_dim
//   keys[g], values[g]: KV head g's cache, [context, head_dim] contiguous
//   out: [n, q_heads * head_dim] row-major (resized by the caller), heads concatenated
// Softmax is computed in fp32 with a double-precision normalizer. Work is split into
// (head, block of query rows) tasks of fixed size, run with OpenMP outside a parallel
// region; results do not depend on the thread count.
void causal_attention(const float* queries, int64_t query_stride, int64_t n, int64_t context,
                      const std::vector<const float*>& keys, const std::vector<const float*>& values,
                      const AttentionGeometry& geo, float* out);

}  // namespace kvb
