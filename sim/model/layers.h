// The dense building blocks of the forward pass, on row-major fp32 activations
// [tokens, features] (host).
//
// Parallelism: dense() splits its output into tiles of a fixed size and runs them
// with OpenMP when called outside a parallel region (inside one, e.g. a sweep that
// evaluates points in parallel, it runs on the calling thread). Tiles never depend on
// the thread count, so every result is bit-identical for any number of threads. Each
// tile's product runs through sim/core/sgemm.h (OpenBLAS, one thread per call, when the
// build has it; Eigen otherwise).
#pragma once
#include <Eigen/Core>
#include <vector>

#include "sim/model/model_config.h"
#include "sim/model/weights.h"

namespace kvb {

// Whether a piece of work of about `flops` operations should fan out to OpenMP
// threads: not inside a parallel region, and not when the work is too small to pay
// for waking the other threads (a decoding step of a small model). Only the
// scheduling depends on it, never the arithmetic.
bool parallel_worthwhile(double flops);

using MatRef = Eigen::Ref<RowMatrix>;
using ConstMatRef = Eigen::Ref<const RowMatrix>;

// Row-major scratch storage that only grows: views of any shape up to the largest
// used so far, without reallocating when shapes alternate (teacher forcing, then one
// token at a time), so that no pass maps and faults in fresh pages (on virtual
// machines that costs more than a third of a small model's forward pass).
// The storage is aligned as Eigen's own matrices are (EIGEN_MAX_ALIGN_BYTES): Eigen's
// vectorized exp/tanh peel unaligned leading elements into a scalar path that rounds
// differently, so results stay reproducible only if the alignment of every buffer is.
class ScratchMatrix {
 public:
  Eigen::Map<RowMatrix> view(int64_t rows, int64_t cols) {
    const size_t n = static_cast<size_t>(rows * cols);
    if (data_.size() < n) data_.resize(n);
    return Eigen::Map<RowMatrix>(data_.data(), rows, cols);
  }

 private:
  std::vector<float, Eigen::aligned_allocator<float>> data_;
};

// y [rows, out] = x [rows, in] · weightᵀ (+ bias), weight [out, in]; y is sized by
// the caller. A 16-bit weight is converted to fp32 one output tile at a time (exact),
// so the result is bit-identical to that of the same weight held in fp32.
void dense(ConstMatRef x, const WeightMatrix& weight, const Eigen::VectorXf* bias, MatRef y);
inline void dense(ConstMatRef x, const DenseWeights& w, MatRef y) {
  dense(x, w.weight, w.bias.size() ? &w.bias : nullptr, y);
}

// Row-wise normalization of x into y (same shape): LayerNorm (weight and bias) when
// norm.bias is non-empty, else RMSNorm (Hugging Face LlamaRMSNorm).
void normalize_rows(ConstMatRef x, const NormWeights& norm, double eps, MatRef y);

// In place, elementwise.
void activate(float* x, int64_t n, Activation act);

// SwiGLU: out [rows, I] = act(gate) * up, from gate_up [rows, 2I] (gate columns first).
void gated_activation(ConstMatRef gate_up, Activation act, MatRef out);

}  // namespace kvb
