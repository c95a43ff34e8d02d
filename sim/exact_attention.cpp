#include "sim/exact_attention.h"

#include "sim/attention_error.h"
#include "sim/core/parallel.h"

namespace kvb {

size_t ExactBlock::bytes() const {
  return rows.size() * static_cast<size_t>(cols) * sizeof(float) + topk.size() * sizeof(int32_t) +
         rows.size() * sizeof(ExactRow);
}

namespace {

// Bytes the exact pass of one head takes at these positions (probs dominate).
size_t head_bytes(const std::vector<int64_t>& pos, int64_t row_block, int64_t k) {
  size_t bytes = 0;
  for (const detail::RowBlock& b : detail::row_blocks(pos, row_block)) {
    const size_t rows = static_cast<size_t>(b.rows), cols = static_cast<size_t>(b.cols);
    bytes += rows * cols * sizeof(float) + rows * static_cast<size_t>(std::max<int64_t>(k, 0)) * sizeof(int32_t) +
             rows * sizeof(ExactRow);
  }
  return bytes;
}

}  // namespace

ExactAttentionCache::ExactAttentionCache(const Recording& rec, const SimOptions& opt, size_t budget_bytes,
                                         int64_t only_layer)
    : rec_(&rec), positions_(opt.positions), row_block_(opt.row_block), topk_(opt.topk) {
  const int64_t heads = rec.num_layers() * rec.q_heads;
  heads_.resize(static_cast<size_t>(heads));
  cached_.assign(static_cast<size_t>(heads), 0);
  const std::vector<int64_t> pos = detail::evaluated_positions(rec, opt);
  if (pos.empty()) return;
  // The heads that may be cached: every layer's, or only_layer's.
  const int64_t first = only_layer >= 0 ? only_layer * rec.q_heads : 0;
  const int64_t candidates = only_layer >= 0 ? rec.q_heads : heads;
  const size_t per_head = head_bytes(pos, row_block_, topk_);
  heads_cached_ = per_head > 0 ? std::min<int64_t>(candidates, static_cast<int64_t>(budget_bytes / per_head)) : 0;
  bytes_ = static_cast<size_t>(heads_cached_) * per_head;
  parallel_for_rethrow(heads_cached_, [&](int64_t k) {
    const int64_t i = first + k;
    detail::HeadScratch scratch;
    heads_[static_cast<size_t>(i)] = detail::exact_head(rec, i / rec.q_heads, i % rec.q_heads, pos, opt, scratch);
    cached_[static_cast<size_t>(i)] = 1;
  });
}

const ExactHead* ExactAttentionCache::head(int64_t layer, int64_t q_head, const SimOptions& opt) const {
  if (opt.row_block != row_block_ || opt.topk != topk_ || opt.positions != positions_) return nullptr;
  const size_t i = static_cast<size_t>(layer * rec_->q_heads + q_head);
  return i < cached_.size() && cached_[i] ? &heads_[i] : nullptr;
}

}  // namespace kvb
