// First-order attention-error predictions (methods.md §5), measured against the exact
// error on a recording.
//
// Values quantized (keys exact): with per-token errors e_j = v̂_j − v_j the output
// error of the query at t is exactly Δo = Σ_j p_j e_j. If the errors are independent
// and zero-mean across tokens, E‖Δo‖² = Σ_j p_j² E‖e_j‖², which for equal per-token
// error σ_e² is 2^(−H₂(p))·σ_e² (why Rényi-2 entropy appears).
// Keys quantized (values exact): Δs_j = q·e_j/√d and, to second order,
// KL(p ‖ p̂) ≈ ½·Var_p(Δs).
#pragma once
#include <cstdint>
#include <vector>

#include "sim/formats/format.h"
#include "sim/recording.h"

namespace kvb::theory {

struct FirstOrderCheck {
  int64_t rows = 0;             // (layer, query head, position) rows measured
  double measured = 0;          // mean over rows of ‖Δo‖² (values) or KL in nats (keys)
  double predicted = 0;         // mean of Σ p_j² ‖e_j‖² (values) or ½·Var_p(Δs) (keys)
  // values: mean of 2^(−H₂(p))·σ_e², σ_e² = the mean ‖e_j‖² over the tokens j ≤ t the
  // row at t reads (its unit's)
  double predicted_renyi2 = 0;
  // The same quantities summed over the rows of each query position, aligned with the
  // `positions` argument (for a bootstrap over blocks of positions).
  std::vector<double> measured_at, predicted_at, predicted_renyi2_at;
};

// `positions`: query positions (each < T); every layer and query head.
FirstOrderCheck value_error_first_order(const Recording& rec, const Format& format,
                                        const std::vector<int64_t>& positions, uint64_t seed);
FirstOrderCheck key_error_first_order(const Recording& rec, const Format& format, const std::vector<int64_t>& positions,
                                      uint64_t seed);

}  // namespace kvb::theory
