#include "sim/model/attention.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "sim/model/layers.h"

namespace kvb {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedRows = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using OutRows = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using Rows = Eigen::Map<const RowMat>;

constexpr int64_t kQueryBlock = 128;  // query rows per task

// Whether some query of the block may read another version than the stored one.
bool mixed(const KvUnitView& u, int64_t prefill, int64_t first_query) {
  return u.exact != u.stored && (prefill > first_query || reads_residual(u.plan, 0));
}

// Per-thread buffers of one task: scores, and for mixed values the probabilities
// whose value is read in the exact and the window version.
struct Scratch {
  ScratchMatrix scores, scores_exact, scores_window, p_exact, p_window, estimate;
};

}  // namespace

void causal_attention(const float* queries, int64_t query_stride, int64_t n, int64_t context, const KvLayerView& kv,
                      const AttentionGeometry& geo, float* out) {
  const int64_t d = geo.head_dim;
  const int64_t group = geo.q_heads / geo.kv_heads;
  const int64_t first = context - n;  // position of query row 0
  const int64_t blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = geo.q_heads * blocks;
  const int64_t out_stride = geo.q_heads * d;
  const int64_t prefill = kv.prefill;
  // q·k and p·v over the visible keys (about half the context for teacher forcing).
  const double flops = 4.0 * static_cast<double>(geo.q_heads * d) * static_cast<double>(n) *
                       static_cast<double>(context - n / 2);

#pragma omp parallel if (tasks > 1 && parallel_worthwhile(flops))
  {
    thread_local Scratch s;  // reused across calls: no fresh pages per call
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t h = task / blocks, r0 = (task % blocks) * kQueryBlock;
      const int64_t rows = std::min(kQueryBlock, n - r0);
      const KvUnitView& K = kv.keys[static_cast<size_t>(h / group)];
      const KvUnitView& V = kv.values[static_cast<size_t>(h / group)];
      // Keys visible to any row of the block: [lo, hi).
      const int64_t hi = first + r0 + rows;
      const int64_t lo = geo.window > 0 ? std::max<int64_t>(0, first + r0 - geo.window + 1) : 0;
      const int64_t cols = hi - lo;
      const StridedRows q(queries + r0 * query_stride + h * d, rows, d, Eigen::OuterStride<>(query_stride));
      auto scores = s.scores.view(rows, cols);
      scores.noalias() = q * Rows(K.stored + lo * d, cols, d).transpose();
      for (const EstimatedKeys& e : K.estimated) {  // estimated logits replace decoded-key ones
        const int64_t a = std::max(e.begin, lo), b = std::min(e.end, hi);
        if (a >= b) continue;
        auto est = s.estimate.view(rows, b - e.begin);
        e.estimator->estimate(ConstMatView{q.data(), rows, d, query_stride}, b - e.begin,
                              MatView{est.data(), rows, b - e.begin, b - e.begin});
        scores.middleCols(a - lo, b - a) = est.rightCols(b - a);
      }
      const bool mixed_k = mixed(K, prefill, first + r0), mixed_v = mixed(V, prefill, first + r0);
      auto scores_exact = s.scores_exact.view(mixed_k ? rows : 0, cols);
      auto scores_window = s.scores_window.view(mixed_k && K.window ? rows : 0, cols);
      auto p_exact = s.p_exact.view(mixed_v ? rows : 0, cols);
      auto p_window = s.p_window.view(mixed_v && V.window ? rows : 0, cols);
      if (mixed_k) {
        scores_exact.noalias() = q * Rows(K.exact + lo * d, cols, d).transpose();
        if (K.window) scores_window.noalias() = q * Rows(K.window + lo * d, cols, d).transpose();
      }
      p_exact.setZero();
      p_window.setZero();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = first + r0 + r;
        // Visible keys of this row, as column indices: [a, b).
        const int64_t a = (geo.window > 0 ? std::max<int64_t>(0, t - geo.window + 1) : 0) - lo;
        const int64_t b = t + 1 - lo;
        float* row = scores.row(r).data();
        if (mixed_k) {
          const RowVersions kv = row_versions(K.plan, prefill, t);
          for (int64_t c = a; c < b; ++c) {
            const Seen v = kv.of(lo + c);
            if (v == Seen::Exact) row[c] = scores_exact(r, c);
            else if (v == Seen::Window) row[c] = scores_window(r, c);
          }
        }
        Eigen::Map<Eigen::ArrayXf> visible(row + a, b - a);
        visible *= geo.score_scale;
        visible = (visible - visible.maxCoeff()).exp();
        visible *= static_cast<float>(1.0 / visible.cast<double>().sum());
        std::fill(row, row + a, 0.0f);
        std::fill(row + b, row + cols, 0.0f);
        if (mixed_v) {  // move each probability to the version of the value it reads
          const RowVersions vv = row_versions(V.plan, prefill, t);
          for (int64_t c = a; c < b; ++c) {
            const Seen v = vv.of(lo + c);
            if (v == Seen::Stored) continue;
            (v == Seen::Exact ? p_exact : p_window)(r, c) = row[c];
            row[c] = 0.0f;
          }
        }
      }
      OutRows o(out + r0 * out_stride + h * d, rows, d, Eigen::OuterStride<>(out_stride));
      o.noalias() = scores * Rows(V.stored + lo * d, cols, d);
      if (mixed_v) {
        o.noalias() += p_exact * Rows(V.exact + lo * d, cols, d);
        if (V.window) o.noalias() += p_window * Rows(V.window + lo * d, cols, d);
      }
    }
  }
}

}  // namespace kvb
