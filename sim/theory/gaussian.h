// Scalar quantization of a Gaussian source: the references of methods.md §5.
//
// All quantizers here are for N(0, 1) (scale results by σ²): 2^b reconstruction levels
// with thresholds between them; the MSE of a quantizer is computed exactly from the
// normal pdf φ and cdf Φ:
//   on [a, b]:  M0 = Φ(b) − Φ(a),  M1 = φ(a) − φ(b),  M2 = M0 + aφ(a) − bφ(b)
//   MSE = Σ_i (M2_i − 2 c_i M1_i + c_i² M0_i).
// The Lloyd-Max codebook is the one the rotation formats use (sim/formats/lloyd_max.h,
// Lloyd's iteration, cached); the best uniform quantizer comes from a golden-section
// search over the step.
#pragma once
#include <cstdint>
#include <vector>

namespace kvb::theory {

double normal_pdf(double x);
double normal_cdf(double x);

struct ScalarQuantizer {
  std::vector<double> levels;      // ascending reconstruction values, 2^b of them
  std::vector<double> thresholds;  // levels.size() − 1 decision boundaries
  double quantize(double x) const;
};

// Exact MSE of a quantizer on N(0, 1).
double gaussian_mse(const ScalarQuantizer& q);

// The b-bit Lloyd-Max quantizer of N(0, 1), b = 1..8 (sim/formats/lloyd_max.h).
ScalarQuantizer lloyd_max_gaussian(int bits);

// The uniform (midrise) quantizer of N(0, 1) with 2^b levels spaced by `step`.
ScalarQuantizer uniform_quantizer(int bits, double step);
// The step minimising the MSE of uniform_quantizer(bits, step).
double best_uniform_step(int bits);

// Shannon's distortion-rate bound of a Gaussian source: MSE/σ² >= 4^(−b).
double shannon_mse_bound(double bits);

// MSE of q on seeded N(0, 1) samples (an empirical check of the exact value).
// `standard_error` (optional) receives the standard error of that mean of squared
// errors, sqrt((mean(e⁴) − mean(e²)²) / (n − 1)) (NaN for fewer than 2 samples).
double sampled_mse(const ScalarQuantizer& q, int64_t samples, uint64_t seed, double* standard_error = nullptr);

}  // namespace kvb::theory
