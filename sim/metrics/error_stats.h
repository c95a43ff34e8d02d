// Raw error accumulators of one simulated point, from which every metric in the
// metric table (metric_table.h) is a reduction: tensor and attention level from the
// recording simulator, model level from the forward pass (model_metrics.h).
#pragma once
#include <cstdint>
#include <vector>

#include "sim/metrics/model_metrics.h"

namespace kvb {

// One evaluated query row: (layer, query head, position t).
struct AttentionRow {
  int32_t layer = 0;   // index into Recording::layers
  int32_t q_head = 0;
  int32_t position = 0;
  float kl = 0;            // KL(p || p̂), nats
  float topk_overlap = 0;  // |topk(p) ∩ topk(p̂)| / k
  float out_err2 = 0;      // ||o - ô||²
  float out_norm2 = 0;     // ||o||²
  float logit_err2 = 0;    // sum over keys j <= t of (ŝ_tj - s_tj)²
  float logit_err_max = 0; // max over j <= t of |ŝ_tj - s_tj|
};

struct ErrorStats {
  // Tensor level, summed over every unit: ||x̂ - x||² and ||x||².
  double k_err2 = 0, k_norm2 = 0;
  double v_err2 = 0, v_norm2 = 0;
  // Attention level: one entry per evaluated (layer, q_head, position), in
  // (layer, q_head, position) order.
  std::vector<AttentionRow> rows;
  int64_t logit_pairs = 0;  // number of causal (t, j) pairs behind logit_err2
  // Model level: a forward pass with the quantized cache against the unquantized one
  // (empty unless the data source is a model).
  ModelStats model;

  // Appends another partial result (e.g. the next layer). Merging in a fixed order
  // keeps results identical for any thread count.
  void merge(const ErrorStats& other);
};

}  // namespace kvb
