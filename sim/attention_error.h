// The attention-error measurement of one query head, shared by the simulator's two
// implementations (internal to sim/):
//   - measure_head_reference (attention_error_reference.cpp): the plain definition,
//     fp64 per key, partial sorts for top-k; the yardstick;
//   - measure_head_fast (attention_error_fast.cpp): the same quantities with fp32
//     vectorised row arithmetic (sim/metrics/row_simd.h), k-selection for top-k and
//     the exact pass's per-row results computed once per run (ExactAttentionCache);
//     tested against the reference (tests/test_attention_fast.cpp).
// Both see the cache through UnitDelta (the reconstruction error of one unit as the
// query reads it) and follow the Plan's time semantics (plan.h).
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/exact_attention.h"
#include "sim/formats/format.h"
#include "sim/metrics/error_stats.h"
#include "sim/plan.h"
#include "sim/recording.h"
#include "sim/simulator.h"

namespace kvb::detail {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMat>;

// One unit's reconstruction error as the attention of each query sees it.
// stored: x̂ - x of the segment version [T, d]; window: x̂ - x of the window version
// [T, d] (empty when the unit has no window). Which one the query at t reads for
// token j is row_versions()' business (plan.h); a residual without a window is exact
// (no error).
struct UnitDelta {
  std::vector<float> stored, window;
  const UnitPlan* unit = nullptr;  // the plan's unit: its window and open groups
  // Key segments whose logits come from their format's estimator (QJL), not from a
  // decoded key: for those, Δs = estimate - exact in the stored version, on columns
  // [keep_begin, keep_end) (the segment, less what an attribution region leaves out:
  // there Δs stays the zeroed stored error's 0).
  std::vector<EstimatedKeys> estimated;
  bool has_window() const { return !window.empty(); }
  // What the query at t reads of this unit (plan.h).
  RowVersions versions(int64_t t, int64_t prefill) const { return row_versions(*unit, prefill, t); }
  // Whether some query may read another version than the stored one (Δ needs per-(t, j) selection).
  bool mixed(int64_t prefill) const { return reads_residual(*unit, prefill); }
};

// One block of evaluated rows: positions pos[begin, begin + rows), keys [0, cols)
// (cols = the last row's position + 1); `index` counts blocks from 0.
struct RowBlock {
  size_t index = 0, begin = 0;
  int64_t rows = 0, cols = 0;
};
// The blocks of `pos` (sorted), row_block rows each, the last one possibly shorter:
// how every measurement, the exact pass and its cache walk the rows.
std::vector<RowBlock> row_blocks(const std::vector<int64_t>& pos, int64_t row_block);

// The queries of one head by position (LayerTensors::query_row): every position, or
// the sampled ones a recording keeps.
struct QueryRows {
  const LayerTensors* layer;
  int64_t h, d;
  Eigen::Map<const Eigen::RowVectorXf> row(int64_t t) const { return {layer->query_row(h, t), d}; }
  int64_t cols() const { return d; }
};

// The tensors of query head h in `layer` and of its KV head, row-major [T, d], host.
struct HeadTensors {
  HeadTensors(const Recording& rec, int64_t layer, int64_t h);
  int64_t T, d, kv_head;
  float inv_sqrt_d;
  QueryRows Q;
  ConstRowMap K, V;
};

// Per-thread scratch for one query head (both implementations). The block matrices
// are allocated once at [row_block, T] (reserve) and used through their top-left
// [rows, cols] corner (blk), so no block reallocates them.
struct HeadScratch {
  RowMat scores, dscores, dscores_win, probs, dprobs, phat_stored, phat_win, out, dout, est;
  void reserve(int64_t rows, int64_t T, int64_t d) {
    for (RowMat* m : {&scores, &dscores, &dscores_win, &probs, &dprobs, &phat_stored, &phat_win})
      if (m->rows() < rows || m->cols() < T) m->resize(rows, T);
    for (RowMat* m : {&out, &dout})
      if (m->rows() < rows || m->cols() < d) m->resize(rows, d);
  }
  static Eigen::Block<RowMat> blk(RowMat& m, int64_t rows, int64_t cols) { return m.topLeftCorner(rows, cols); }
  std::vector<double> p, phat, dp;  // p, p̂ and p̂ - p of one row (fp64)
  std::vector<float> ds;            // Δs of one row as the query sees the cache
  std::vector<float> e;               // fast path: expm1(Δs - shift) of one row
  std::vector<float> val;            // fast path: top-k selection keys
  std::vector<int32_t> ia, ib;
  UnitDelta dk, dv;                  // the current KV head's key and value errors
};

// The scores of a block of queries Qb [rows, d] against the first cols keys, into
// s.scores (only when need_scores, or when estimated key columns need them), and their
// errors Δs: stored (estimated columns replaced) into s.dscores and, when the key unit
// has a window, the window version into s.dscores_win.
// Qs = Qb/√d [rows, d] (scaled once per block: every score is Qs·kᵀ, the one
// expression the simulator, its exact pass and its cache use), Qb for estimators.
void block_scores(const RowMat& Qb, const RowMat& Qs, const ConstRowMap& K, const UnitDelta& dk, int64_t cols,
                  int64_t T, float inv_sqrt_d, HeadScratch& s, bool need_scores = true);
// The block's exact scores Qs·K[0, cols)ᵀ into s.scores.
void exact_scores(const RowMat& Qs, const ConstRowMap& K, int64_t cols, HeadScratch& s);
// The queries of one block of positions: Qb [rows, d] and Qs = Qb/√d.
void block_queries(const QueryRows& Q, const int64_t* pos, int64_t rows, float inv_sqrt_d, RowMat& Qb, RowMat& Qs);

// The exact pass (exact_attention.h) of one row from its scores s [n]: p [n] and the
// top-k indices of p (ranked by s) into topk [min(k, n)]; returns mass and count.
ExactRow exact_row(const float* s, int64_t n, int64_t k, float* p, int32_t* topk, std::vector<float>& val);
// The exact pass of one block: scores [rows, cols] of the rows at positions pos[0..rows),
// Vtop the first cols values; fills `out` (top-k, mass, ‖p·V‖²) and its probs, written
// to probs_memory [rows·cols].
void exact_block(const Eigen::Ref<const RowMat>& scores, const Eigen::Ref<const RowMat>& Vtop, const int64_t* pos,
                 int64_t rows, int64_t k, HeadScratch& s, float* probs_memory, ExactBlock& out);
// The exact pass of query head h of `layer` at the positions, blocked as opt.row_block.
ExactHead exact_head(const Recording& rec, int64_t layer, int64_t h, const std::vector<int64_t>& pos,
                     const SimOptions& opt, HeadScratch& s);

// The query positions a simulation evaluates: opt.positions, or every position when empty.
std::vector<int64_t> evaluated_positions(const Recording& rec, const SimOptions& opt);

// Throws SimulationStopped when opt.stop is set and true, looked at before every
// kStopCheckRowBlocks-th row block (whole blocks: the same numbers as without a stop).
inline void check_stop(const SimOptions& opt, size_t block, int64_t layer, int64_t h) {
  if (opt.stop && block % static_cast<size_t>(kStopCheckRowBlocks) == 0 && opt.stop->load(std::memory_order_relaxed))
    throw SimulationStopped("stopped in layer " + std::to_string(layer) + ", query head " + std::to_string(h));
}

// Causal attention of one row in fp64 (the reference): p from the scores s[0..n),
// p̂ from s + Δs. Fills h.p, h.dp = p̂ - p and h.phat; returns KL(p || p̂) in nats.
double row_attention_reference(const float* s, const float* ds, int64_t n, HeadScratch& h);

// |topk(a) ∩ topk(b)| / k over the first n entries of two fp64 rows (k = min(k, n); 1
// when k <= 0), ties broken by lower index; ia, ib: scratch.
float topk_overlap(const double* a, const double* b, int64_t n, int64_t k, std::vector<int32_t>& ia,
                   std::vector<int32_t>& ib);

// How many indices two ascending index lists a [na] and b [nb] share.
int64_t common_count(const int32_t* a, int64_t na, const int32_t* b, int64_t nb);

// Both measurements fill every value of an AttentionRow (kAttentionRowValues, error_stats.h).
static_assert(sizeof(kAttentionRowValues) / sizeof(kAttentionRowValues[0]) == 6,
              "a new AttentionRow value: fill it in measure_head_reference and measure_head_fast");

// Adds the rows of query head h (positions `pos`) to stats, in position order.
void measure_head_reference(const Recording& rec, const Plan& plan, int64_t layer, int64_t h, const UnitDelta& dk,
                            const UnitDelta& dv, const std::vector<int64_t>& pos, const SimOptions& opt,
                            HeadScratch& s, ErrorStats& stats);
void measure_head_fast(const Recording& rec, const Plan& plan, int64_t layer, int64_t h, const UnitDelta& dk,
                       const UnitDelta& dv, const std::vector<int64_t>& pos, const SimOptions& opt, HeadScratch& s,
                       ErrorStats& stats);

}  // namespace kvb::detail
