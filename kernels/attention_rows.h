// Kernels of the CUDA attention-error path (kernels/cuda_simulator.cpp drives them
// with cuBLAS GEMMs in between). Host-only header: launchers enqueue on a stream.
//
// A row block holds, for a batch of consecutive KV heads (whose units the GEMMs treat
// as one strided batch), their `group` query heads each × `npos` evaluated positions: row r = head_in_block * npos + i is query head (head0 + head_in_block) at
// position positions[i], and reads the units of KV head head_in_block / group of the
// batch. Score-like matrices are [rows, ld] row-major on the device, ld = the block's
// key count (last position + 1); entries j > t of row r are written as zero.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "sim/metrics/error_stats.h"

namespace kvb::cuda {

// What every plan's row kernel needs of the exact attention of a row (the CPU's
// ExactRow, sim/attention_error.h): p_j = attn_exact_weight(s_j, max) · inv, and
// mass = Σ p_j in fp64 (≈ 1).
struct ExactRowStats {
  float max = 0;
  float inv = 0;
  double mass = 0;
};

// The exact pass of a row block (its rows and positions as RowBlockArgs), the same for
// every plan: per row the stats and the top-k of p (by s, ties to the lower index:
// min(topk, t + 1) indices at topk_out + r * topk), and p itself into probs when it is
// not nullptr (entries j > t zero), for o = P·V.
struct ExactRowsArgs {
  const float* scores = nullptr;
  int64_t ld = 0;
  const int32_t* positions = nullptr;  // [npos] device
  int npos = 0;
  int rows = 0;
  int topk = 8;
  float* probs = nullptr;
  ExactRowStats* stats = nullptr;  // [rows]
  int32_t* topk_out = nullptr;     // [rows, topk]
};
void launch_exact_rows(const ExactRowsArgs& a, cudaStream_t stream);

struct RowBlockArgs {
  const float* scores = nullptr;       // s = q·k/√d
  const ExactRowStats* exact = nullptr;  // [rows], launch_exact_rows
  const int32_t* exact_topk = nullptr;   // [rows, topk], launch_exact_rows
  const float* dscores = nullptr;      // Δs from the stored keys' error
  const float* dscores_win = nullptr;  // Δs from the window keys' error; nullptr without a key window
  float* dprobs = nullptr;             // out: p̂ - p (may alias dscores)
  float* phat_stored = nullptr;        // out: p̂ where the query sees stored values, else 0
  float* phat_win = nullptr;           // out: p̂ where it sees window values, else 0; nullptr without
                                       // a value window (may alias dscores_win)
  int64_t ld = 0;                      // keys of the block (columns)
  const int32_t* positions = nullptr;  // [npos] device, ascending
  int npos = 0;
  int rows = 0;                        // query heads of the batch * npos
  // How each unit is seen over time (sim/plan.h, row_versions): every token exact for
  // t < prefill; else tokens j >= *_residual_from[i] (the window's first held token or
  // the open group's, computed on the host) at the residual precision (the window's
  // version when the unit has a window, i.e. dscores_win / phat_win are set; else
  // exact), the stored version before.
  int64_t prefill = 0;
  // Device, entry (h, i) at [h * residual_stride + i] for the block's KV head h.
  const int32_t* key_residual_from = nullptr;
  const int32_t* value_residual_from = nullptr;
  int64_t residual_stride = 0;
  int group = 1;                       // query heads per KV head
  int topk = 8;                        // k <= kMaxTopK
  int32_t layer = 0;
  int32_t head0 = 0;                   // first query head of the block
  // Results: row r goes to out_rows[(head0 + r / npos) * out_npos + out_pos0 + r % npos].
  // ||o||² of the exact attention, at the same index as out_rows: written by
  // launch_output_norms when it is given o, else read from here.
  float* exact_norm2 = nullptr;
  AttentionRow* out_rows = nullptr;
  int out_npos = 0;
  int out_pos0 = 0;
};

inline constexpr int kMaxTopK = 64;

// Per row: KL(p || p̂), top-k overlap and logit errors into out_rows (all but
// out_norm2 / out_err2); p̂ - p and p̂ split by value version into the matrices. The
// fp32 arithmetic of the CPU's fast path (sim/attention_error_fast.cpp) from the exact
// pass's stats; rows whose largest |Δs| reaches kLargeLogitShift (or is not finite)
// take the fp64 reference form (sim/attention_error_reference.cpp), as on the CPU.
void launch_attention_rows(const RowBlockArgs& a, cudaStream_t stream);

// Per row: out_err2 = ||Δo||² from Δo [rows, d] into out_rows; out_norm2 = ||o||² from
// o [rows, d] (also stored in a.exact_norm2), or from a.exact_norm2 when o is nullptr.
void launch_output_norms(const float* o, const float* dout, int rows, int d, const RowBlockArgs& a,
                         cudaStream_t stream);

// qb [heads * npos, d] = q [head0 + r / npos, query_rows[r % npos], :] from
// q [q_heads, query_tokens, d] (query_rows: the row of each evaluated position's query).
void launch_gather_queries(const float* q, int64_t query_tokens, int d, int head0, int heads,
                           const int32_t* query_rows, int npos, float* qb, cudaStream_t stream);

// delta = xhat - x over n elements, in place in xhat; partial[b] = (Σ delta², Σ x²) in
// double for each of kDeltaBlocks blocks (summed on the host in block order).
inline constexpr int kDeltaBlocks = 128;
void launch_delta(const float* x, float* xhat, int64_t n, double* partial, cudaStream_t stream);

}  // namespace kvb::cuda
