// Lloyd-Max (MSE-optimal fixed-rate scalar) codebooks for the standard normal N(0, 1),
// computed by Lloyd iteration in double precision for any b = 1..8 bits and cached.
//
// methods.md §5 lists the MSE at b = 1..4: 0.3634, 0.1175, 0.03454, 0.009497.
// The rotation formats scale these by 1/sqrt(d) for coordinates ~ N(0, 1/d).
#pragma once
#include <vector>

namespace kvb {

struct LloydMaxCodebook {
  int bits = 0;
  std::vector<double> centroids_exact;  // 2^bits ascending, symmetric about 0
  std::vector<float> centroids;         // the same rounded to fp32 (what decoders use)
  std::vector<float> thresholds;        // 2^bits - 1 fp32-rounded midpoints (sim/formats/codebook.h)
  double mse = 0;                       // E[(X - Q(X))^2] for X ~ N(0, 1), of the exact codebook
  int iterations = 0;                   // Lloyd iterations until convergence
};

// The b-bit codebook, b in 1..8. Computed on first use (thread-safe), then shared.
// Throws kvb::Error for b outside 1..8.
const LloydMaxCodebook& lloyd_max_gaussian(int bits);

}  // namespace kvb
