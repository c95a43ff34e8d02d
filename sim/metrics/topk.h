// Top-k selection over a row of fp32 keys, kLanes at a time (sim/metrics/row_simd.h):
// the fast CPU path's top-k of p and p̂ (sim/attention_error_fast.cpp). Host only.
// tests/metrics/test_topk.cpp checks it against a plain sort.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sim/metrics/row_simd.h"

namespace kvb::simd {

// The k best of a row's keys: larger keys first, ties to the lower index (an order
// independent of the scan). Keys are scanned kLanes at a time, in index order: a chunk
// whose keys are all below the current k-th (or below `floor`, a value the final k-th is
// known to reach) costs one vector comparison. NaN never enters. finish() sorts the
// indices ascending into idx and returns their count.
class TopK {
 public:
  TopK(int64_t k, int32_t* idx, std::vector<float>& val, float floor = -INFINITY)
      : k_(k), idx_(idx), val_(val), floor_(floor) {
    val_.resize(static_cast<size_t>(k));
  }

  // key[j0, j0 + cnt), cnt <= kLanes; j0 above every index scanned before.
  void scan(const float* key, int64_t j0, int64_t cnt) {
    if (k_ == 0) return;
    const float threshold = count_ == k_ ? val_[static_cast<size_t>(k_ - 1)] : floor_;
    // Lanes at or above the threshold, lowest first (an entry raises it); lanes past cnt
    // are masked off (their padding would tie a threshold of -Inf).
    uint32_t m = mask_bits(load(key + j0, cnt) >= splat(threshold));
    if (cnt < kLanes) m &= (1u << cnt) - 1u;
    for (; m != 0; m &= m - 1) {
      const int64_t j = j0 + __builtin_ctz(m);
      offer(key[j], j);
    }
  }

  // key[0, n), all of a row.
  void scan_all(const float* key, int64_t n) {
    for (int64_t j = 0; j < n && k_ > 0; j += kLanes) scan(key, j, std::min(kLanes, n - j));
  }

  int64_t finish() {
    std::sort(idx_, idx_ + count_);
    return count_;
  }

 private:
  // Indices come in increasing order: a tie never ranks before an entry held.
  void offer(float v, int64_t j) {
    if (count_ == k_ && !(v > val_[static_cast<size_t>(k_ - 1)])) return;
    int64_t i = count_ < k_ ? count_++ : k_ - 1;
    while (i > 0 && v > val_[static_cast<size_t>(i - 1)]) {
      val_[static_cast<size_t>(i)] = val_[static_cast<size_t>(i - 1)];
      idx_[i] = idx_[i - 1];
      --i;
    }
    val_[static_cast<size_t>(i)] = v;
    idx_[i] = static_cast<int32_t>(j);
  }

  int64_t k_, count_ = 0;
  int32_t* idx_;
  std::vector<float>& val_;
  float floor_;
};

}  // namespace kvb::simd
