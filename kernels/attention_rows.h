// Kernels of the CUDA attention-error path (kernels/cuda_simulator.cpp drives them
// with cuBLAS GEMMs in between). Host-only header: launchers enqueue on a stream.
//
// A row block holds `heads` query heads × `npos` evaluated positions of one KV head:
// row r = head_in_block * npos + i is query head (head0 + head_in_block) at position
// positions[i]. Score-like matrices are [rows, ld] row-major on the device, ld = the
// block's key count (last position + 1); entries j > t of row r are written as zero.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "sim/metrics/error_stats.h"

namespace kvb::cuda {

struct RowBlockArgs {
  const float* scores = nullptr;       // s = q·k/√d
  const float* dscores = nullptr;      // Δs from the stored keys' error
  const float* dscores_win = nullptr;  // Δs from the window keys' error; nullptr without a key window
  float* probs = nullptr;              // out: p (may alias scores)
  float* dprobs = nullptr;             // out: p̂ - p (may alias dscores)
  float* phat_stored = nullptr;        // out: p̂ where the query sees stored values, else 0
  float* phat_win = nullptr;           // out: p̂ where it sees window values, else 0; nullptr without
                                       // a value window (may alias dscores_win)
  int64_t ld = 0;                      // keys of the block (columns)
  const int32_t* positions = nullptr;  // [npos] device, ascending
  int npos = 0;
  int rows = 0;                        // heads * npos
  // How each unit is seen over time (sim/plan.h, row_versions): every token exact for
  // t < prefill; else tokens j >= *_residual_from[i] (the window's first held token or
  // the open group's, computed on the host) at the residual precision (the window's
  // version when the unit has a window, i.e. dscores_win / phat_win are set; else
  // exact), the stored version before.
  int64_t prefill = 0;
  const int32_t* key_residual_from = nullptr;    // [npos] device
  const int32_t* value_residual_from = nullptr;  // [npos] device
  int topk = 8;                        // k <= kMaxTopK
  int32_t layer = 0;
  int32_t head0 = 0;                   // first query head of the block
  // Results: row r goes to out_rows[(head0 + r / npos) * out_npos + out_pos0 + r % npos].
  AttentionRow* out_rows = nullptr;
  int out_npos = 0;
  int out_pos0 = 0;
};

inline constexpr int kMaxTopK = 64;

// Per row: softmax, KL(p || p̂), top-k overlap and logit errors into out_rows (all but
// out_norm2 / out_err2); p, p̂ - p and p̂ split by value version into the matrices.
void launch_attention_rows(const RowBlockArgs& a, cudaStream_t stream);

// Per row: out_norm2 = ||o||², out_err2 = ||Δo||² from o, Δo [rows, d] into out_rows.
void launch_output_norms(const float* o, const float* dout, int rows, int d, const RowBlockArgs& a,
                         cudaStream_t stream);

// qb [heads * npos, d] = q [head0 + r / npos, positions[r % npos], :] from q [q_heads, T, d].
void launch_gather_queries(const float* q, int64_t tokens, int d, int head0, int heads, const int32_t* positions,
                           int npos, float* qb, cudaStream_t stream);

// delta = xhat - x over n elements, in place in xhat; partial[b] = (Σ delta², Σ x²) in
// double for each of kDeltaBlocks blocks (summed on the host in block order).
inline constexpr int kDeltaBlocks = 128;
void launch_delta(const float* x, float* xhat, int64_t n, double* partial, cudaStream_t stream);

}  // namespace kvb::cuda
