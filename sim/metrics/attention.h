// Causal scaled-dot-product attention for one query head, the reference every
// attention-level metric, the entropy statistics and the synthetic generator's
// tests are computed with.
//
// Conventions: q is [T, d] (one query head), k and v are [T, d] (its KV head),
// all row-major fp32 host memory; query t attends keys j <= t with
// p_tj = softmax_j(q_t·k_j / sqrt(d)).
#pragma once
#include <cstdint>
#include <vector>

#include "sim/recording.h"

namespace kvb {

// Scores for query rows [t0, t1): out is [(t1-t0), T] row-major, scaled by 1/sqrt(d).
// Entries j > t are computed too but are not part of the causal row.
void attention_scores(const float* q, const float* k, int64_t T, int64_t d, int64_t t0, int64_t t1,
                      float* out);

// Causal softmax of the first n = t+1 scores of a row, in double precision.
// Writes probabilities to p[0..n) and returns log-sum-exp.
double softmax_row(const float* scores, int64_t n, double* p);

// Entropies of a probability vector, in bits.
double shannon_entropy_bits(const double* p, int64_t n);  // -sum p log2 p
double renyi2_entropy_bits(const double* p, int64_t n);   // -log2 sum p^2

struct HeadEntropy {
  double shannon = 0;  // mean over the query positions, bits
  double renyi2 = 0;   // mean over the query positions, bits
};

// Mean attention entropy of query head h in layer index li (into rec.layers) over
// the given query positions (each < T). GQA: reads the head's KV head.
HeadEntropy head_entropy(const Recording& rec, int64_t li, int64_t q_head,
                         const std::vector<int64_t>& positions);

// Default calibration positions: every position from 1 to T-1 with a stride so that
// at most max_positions are used (position 0 always has zero entropy).
std::vector<int64_t> spread_positions(int64_t T, int64_t max_positions);

// Attention output rows [t0, t1) of one head: out [(t1-t0), d] = P·v with the causal
// softmax of q·kᵀ/√d. Used to validate recordings against their attn_output.
void attention_output(const float* q, const float* k, const float* v, int64_t T, int64_t d, int64_t t0,
                      int64_t t1, float* out);

}  // namespace kvb
