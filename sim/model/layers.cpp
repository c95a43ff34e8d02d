#include "sim/model/layers.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "sim/core/sgemm.h"

namespace kvb {

namespace {

// Output tiles of dense(): rows x columns. Fixed so that results never depend on the
// thread count (see layers.h); sized for the GEMMs of small models on few cores.
constexpr int64_t kTileRows = 256;
constexpr int64_t kTileCols = 128;

// Elementwise activation of n values, in place, vectorized through Eigen's array
// functions (tanh and exp accurate to a few ulp).
void activate_span(float* p, int64_t n, Activation act) {
  Eigen::Map<Eigen::ArrayXf> x(p, n);
  switch (act) {
    case Activation::GeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2 / pi)
      x = 0.5f * x * (1.0f + (k * (x + 0.044715f * x.cube())).tanh());
      break;
    }
    case Activation::GeluErf:
      for (int64_t i = 0; i < n; ++i) p[i] = 0.5f * p[i] * (1.0f + std::erf(p[i] * 0.7071067811865476f));
      break;
    case Activation::Relu: x = x.max(0.0f); break;
    case Activation::Silu: x = x / (1.0f + (-x).exp()); break;
  }
}

}  // namespace

bool parallel_worthwhile(double flops) {
  constexpr double kMinFlops = 4e6;  // ~tens of microseconds of work on one core
  return flops >= kMinFlops && !omp_in_parallel() && omp_get_max_threads() > 1;
}

void dense(ConstMatRef x, const WeightMatrix& weight, const Eigen::VectorXf* bias, MatRef y) {
  const int64_t rows = x.rows(), out = weight.rows();
  eigen_assert(y.rows() == rows && y.cols() == out && x.cols() == weight.cols());
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t col_tiles = (out + kTileCols - 1) / kTileCols;
  const int64_t tiles = row_tiles * col_tiles;
#pragma omp parallel for schedule(dynamic, 1) \
    if (tiles > 1 && parallel_worthwhile(2.0 * static_cast<double>(rows * out * x.cols())))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r0 = (t / col_tiles) * kTileRows, c0 = (t % col_tiles) * kTileCols;
    const int64_t nr = std::min(kTileRows, rows - r0), nc = std::min(kTileCols, out - c0);
    // The tile starts as the bias and accumulates the product (one pass over it
    // instead of zeroing, multiplying, then adding the bias).
    auto tile = y.block(r0, c0, nr, nc);
    if (bias) tile.rowwise() = bias->segment(c0, nc).transpose();
    else tile.setZero();
    if (const RowMatrix* w32 = weight.f32()) {
      gemm_abt(x.middleRows(r0, nr), w32->middleRows(c0, nc), tile, GemmOutput::Accumulate);
    } else {
      // The tile's weight rows in fp32, in this thread's scratch (nc x in floats).
      thread_local ScratchMatrix weight_tile;
      auto w = weight_tile.view(nc, x.cols());
      weight.rows_to_f32(c0, nc, w.data());
      gemm_abt(x.middleRows(r0, nr), w, tile, GemmOutput::Accumulate);
    }
  }
}

void normalize_rows(ConstMatRef x, const NormWeights& norm, double eps, MatRef y) {
  const int64_t rows = x.rows(), n = x.cols();
  eigen_assert(y.rows() == rows && y.cols() == n);
  const bool layer_norm = norm.bias.size() != 0;
  const float* w = norm.weight.data();
  const float* b = layer_norm ? norm.bias.data() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.row(r).data();
    float* out = y.row(r).data();
    if (layer_norm) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += in[i];
      const double mean = sum / static_cast<double>(n);
      double var = 0;
      for (int64_t i = 0; i < n; ++i) var += (in[i] - mean) * (in[i] - mean);
      var /= static_cast<double>(n);
      const float m = static_cast<float>(mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
      for (int64_t i = 0; i < n; ++i) out[i] = (in[i] - m) * rstd * w[i] + b[i];
    } else {
      double sq = 0;
      for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(in[i]) * in[i];
      const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
      for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (in[i] * rstd);
    }
  }
}

void activate(float* x, int64_t n, Activation act) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1 && parallel_worthwhile(20.0 * static_cast<double>(n)))
  for (int64_t c = 0; c < chunks; ++c) activate_span(x + c * kChunk, std::min(kChunk, n - c * kChunk), act);
}

void gated_activation(ConstMatRef gate_up, Activation act, MatRef out) {
  const int64_t inner = gate_up.cols() / 2;
  eigen_assert(out.rows() == gate_up.rows() && out.cols() == inner && out.outerStride() == inner);
  out = gate_up.leftCols(inner);
  activate(out.data(), out.size(), act);
  out.array() *= gate_up.rightCols(inner).array();
}

}  // namespace kvb
