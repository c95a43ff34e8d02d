// The dense building blocks of the forward pass, on row-major fp32 activations
// [tokens, features] (host).
//
// Parallelism: dense() splits its output into tiles of a fixed size and runs them
// with OpenMP when called outside a parallel region (inside one, e.g. a sweep that
// evaluates points in parallel, it runs on the calling thread). Tiles never depend on
// the thread count, so every result is bit-identical for any number of threads.
#pragma once
#include <Eigen/Core>

#include "sim/model/model_config.h"
#include "sim/model/weights.h"

namespace kvb {

// Whether a piece of work of about `flops` operations should fan out to OpenMP
// threads: not inside a parallel region, and not when the work is too small to pay
// for waking the other threads (a decoding step of a small model). Only the
// scheduling depends on it, never the arithmetic.
bool parallel_worthwhile(double flops);

// y [rows, out] = x [rows, in] · weightᵀ (+ bias), weight [out, in]. y is resized.
void dense(const RowMatrix& x, const RowMatrix& weight, const Eigen::VectorXf* bias, RowMatrix& y);
inline void dense(const RowMatrix& x, const DenseWeights& w, RowMatrix& y) {
  dense(x, w.weight, w.bias.size() ? &w.bias : nullptr, y);
}

// Row-wise normalization into y (resized): LayerNorm (weight and bias) when
// norm.bias is non-empty, else RMSNorm (Hugging Face LlamaRMSNorm).
void normalize_rows(const RowMatrix& x, const NormWeights& norm, double eps, RowMatrix& y);

// In place, elementwise.
void activate(float* x, int64_t n, Activation act);

// SwiGLU: out [rows, I] = act(gate) * up, from gate_up [rows, 2I] (gate columns first).
void gated_activation(const RowMatrix& gate_up, Activation act, RowMatrix& out);

}  // namespace kvb
