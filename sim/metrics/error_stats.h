// Raw error accumulators of one simulated point, from which every metric in the
// metric table (metric_table.h) is a reduction: tensor and attention level from the
// recording simulator, model level from the forward pass (model_metrics.h).
#pragma once
#include <cmath>
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

// The fields of AttentionRow, listed once, for code that goes over all of them (the
// sweep's finiteness check, the CPU/GPU comparison): the row's identity and its
// measured values. A new field goes into the struct, one of these lists and both
// simulators (sim/attention_error_*.cpp, kernels/attention_rows.cu); the
// static_assert below fails until it is listed.
struct AttentionRowId {
  const char* name;
  int32_t AttentionRow::*member;
};
struct AttentionRowValue {
  const char* name;
  float AttentionRow::*member;
};
inline constexpr AttentionRowId kAttentionRowIds[] = {
    {"layer", &AttentionRow::layer}, {"q_head", &AttentionRow::q_head}, {"position", &AttentionRow::position}};
inline constexpr AttentionRowValue kAttentionRowValues[] = {
    {"kl", &AttentionRow::kl},
    {"topk_overlap", &AttentionRow::topk_overlap},
    {"out_err2", &AttentionRow::out_err2},
    {"out_norm2", &AttentionRow::out_norm2},
    {"logit_err2", &AttentionRow::logit_err2},
    {"logit_err_max", &AttentionRow::logit_err_max},
};
static_assert(sizeof(AttentionRow) == sizeof(kAttentionRowIds) / sizeof(kAttentionRowIds[0]) * sizeof(int32_t) +
                                          sizeof(kAttentionRowValues) / sizeof(kAttentionRowValues[0]) * sizeof(float),
              "every field of AttentionRow is listed in kAttentionRowIds or kAttentionRowValues");

// The first value of r that is not finite, or nullptr when all are.
inline const AttentionRowValue* first_nonfinite_value(const AttentionRow& r) {
  for (const AttentionRowValue& v : kAttentionRowValues)
    if (!std::isfinite(r.*v.member)) return &v;
  return nullptr;
}

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
  // merge() without the rows: the sums and counts only (the caller places the rows).
  void merge_sums(const ErrorStats& other);
  // The partial results `parts` merged in their order, the rows' memory reserved once
  // (a point's rows are many: merging them one by one regrows and refaults the vector).
  // `parts` points to `count` results (a pointer, not std::span: nvcc compiles this
  // header as C++17).
  // `storage`: a vector whose memory the rows may reuse (cleared first; a caller that
  // merges many points keeps its pages faulted in: ScratchPool, sim/core/buffer_pool.h).
  static ErrorStats merged(const ErrorStats* parts, size_t count, std::vector<AttentionRow> storage = {});
  // `groups` x `per_group` partial results in their order (a point's (layer, KV head)
  // results, layer-major): the sums added per group, then over the groups, so the bits
  // are those of merged() over the groups' own merged results; the rows copied once.
  static ErrorStats merged_in_groups(const ErrorStats* parts, size_t groups, size_t per_group,
                                     std::vector<AttentionRow> storage = {});
};

}  // namespace kvb
