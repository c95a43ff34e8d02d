// The recency window's time rule (Plan, methods.md §3) as plain arithmetic, shared by
// RecentWindow::holds and row_versions (sim/plan.cpp; the CUDA attention kernels get
// its results per position) and by the open groups along tokens (a chunked rule too).
#pragma once
#include <cstdint>

#include "sim/core/hd.h"

namespace kvb {

// The first token the query at position t sees in window precision, for a window of
// `size` tokens that may hold tokens >= `first` (the plan's prefill): the window holds
// exactly the tokens j with window_first_held(...) <= j <= t.
//   sliding: the last `size` tokens, t - size < j (methods.md §3);
//   chunked: a residual flushed every `size` tokens, j >= first + size * floor((t - first) / size).
//     As in KIVI and Hugging Face's QuantizedCache, the query at t attends with the
//     residual plus its own token before the residual is flushed, so it holds
//     (t - first) mod size + 1 tokens (1..size) in window precision; memory counts
//     the last query's (RecentWindow::held_at).
KVB_HD int64_t window_first_held(int64_t size, bool chunked, int64_t t, int64_t first) {
  const int64_t from = chunked ? first + size * ((t - first) / size) : t - size + 1;
  return from > first ? from : first;
}

}  // namespace kvb
