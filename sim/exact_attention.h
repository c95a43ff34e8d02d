// The exact pass of the attention-error measurement: for every evaluated row of a
// query head, the reference attention p = softmax(q·Kᵀ/√d) over the causal keys, its
// top-k, and ‖p·V‖². It depends on the recording and the evaluated positions only,
// never on a plan, so a sweep computes it once (ExactAttentionCache) and every point
// reuses it; without a cache the fast measurement computes it per point, with the
// same code, so cached and uncached results are identical (tests/test_attention_fast.cpp).
#pragma once
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sim/core/allocator.h"
#include "sim/recording.h"
#include "sim/simulator.h"

namespace kvb {

struct ExactRow {
  double mass = 0;         // Σ_j p_j of the stored fp32 p's (1 up to rounding)
  float out_norm2 = 0;     // ‖p·V‖²
  int64_t topk_count = 0;  // entries of the row's top-k (min(k, t + 1))
};

// One block of evaluated rows (SimOptions::row_block of them), as the measurement
// walks them: rows r = 0..rows-1 at positions pos[r], keys 0..cols-1 (cols = last
// position + 1).
struct ExactBlock {
  // [rows, cols] row-major, p, 0 beyond t: memory the block's owner gives exact_block
  // (its head's `memory`, or a thread's scratch).
  const float* probs = nullptr;
  int64_t cols = 0;
  std::vector<int32_t> topk;  // [rows, k]: indices of the k largest p, ascending; ties to the lower index
  std::vector<ExactRow> rows;
  int64_t k = 0;
  const float* probs_of(int64_t r) const { return probs + r * cols; }
  const int32_t* topk_of(int64_t r) const { return topk.data() + r * k; }
  size_t bytes() const;
};

struct ExactHead {
  PrefaultedBuffer memory;  // every block's probs, one after another
  std::vector<ExactBlock> blocks;
};

// The exact pass of every (layer, query head) of a recording for one set of options
// (positions, row_block, topk), built in parallel, head by head while the memory
// stays within a budget (heads beyond it are measured without the cache). Throws
// SimulationStopped when opt.stop becomes true while it is built.
// With only_layer >= 0, only that layer's heads (a streamed recording holds one layer
// at a time, sim/layer_stream.h); the others are measured without the cache.
class ExactAttentionCache {
 public:
  ExactAttentionCache(const Recording& rec, const SimOptions& opt, size_t budget_bytes, int64_t only_layer = -1);

  // The cached head, or nullptr when it was not cached or `opt` asks for other
  // positions, row blocks or k than the cache was built for.
  const ExactHead* head(int64_t layer, int64_t q_head, const SimOptions& opt) const;

  size_t bytes() const { return bytes_; }
  int64_t heads_cached() const { return heads_cached_; }
  int64_t heads_total() const { return static_cast<int64_t>(heads_.size()); }

 private:
  const Recording* rec_;
  std::vector<int64_t> positions_;
  int64_t row_block_ = 0, topk_ = 0;
  std::vector<ExactHead> heads_;  // [layer * q_heads + q_head]
  std::vector<char> cached_;
  size_t bytes_ = 0;
  int64_t heads_cached_ = 0;
};

}  // namespace kvb
