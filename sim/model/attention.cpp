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

constexpr int64_t kQueryBlock = 128;  // query rows per task

}  // namespace

void causal_attention(const float* queries, int64_t query_stride, int64_t n, int64_t context,
                      const std::vector<const float*>& keys, const std::vector<const float*>& values,
                      const AttentionGeometry& geo, float* out) {
  const int64_t d = geo.head_dim;
  const int64_t group = geo.q_heads / geo.kv_heads;
  const int64_t first = context - n;  // position of query row 0
  const int64_t blocks = (n + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = geo.q_heads * blocks;
  const int64_t out_stride = geo.q_heads * d;

  // q·k and p·v over the visible keys (about half the context for teacher forcing).
  const double flops = 4.0 * static_cast<double>(geo.q_heads * d) * static_cast<double>(n) *
                       static_cast<double>(context - n / 2);
#pragma omp parallel if (tasks > 1 && parallel_worthwhile(flops))
  {
    RowMat scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t h = task / blocks, r0 = (task % blocks) * kQueryBlock;
      const int64_t rows = std::min(kQueryBlock, n - r0);
      const int64_t g = h / group;
      // Keys visible to any row of the block: [lo, hi).
      const int64_t hi = first + r0 + rows;
      const int64_t lo = geo.window > 0 ? std::max<int64_t>(0, first + r0 - geo.window + 1) : 0;
      const StridedRows q(queries + r0 * query_stride + h * d, rows, d, Eigen::OuterStride<>(query_stride));
      const Eigen::Map<const RowMat> k(keys[static_cast<size_t>(g)] + lo * d, hi - lo, d);
      const Eigen::Map<const RowMat> v(values[static_cast<size_t>(g)] + lo * d, hi - lo, d);
      scores.noalias() = q * k.transpose();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = first + r0 + r;
        // Visible keys of this row, as column indices into scores: [a, b).
        const int64_t a = (geo.window > 0 ? std::max<int64_t>(0, t - geo.window + 1) : 0) - lo;
        const int64_t b = t + 1 - lo;
        float* s = scores.row(r).data();
        Eigen::Map<Eigen::ArrayXf> visible(s + a, b - a);
        visible *= geo.score_scale;
        visible = (visible - visible.maxCoeff()).exp();
        visible *= static_cast<float>(1.0 / visible.cast<double>().sum());
        std::fill(s, s + a, 0.0f);
        std::fill(s + b, s + (hi - lo), 0.0f);
      }
      OutRows o(out + r0 * out_stride + h * d, rows, d, Eigen::OuterStride<>(out_stride));
      o.noalias() = scores * v;
    }
  }
}

}  // namespace kvb
