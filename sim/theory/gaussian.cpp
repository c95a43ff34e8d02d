#include "sim/theory/gaussian.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "sim/core/rng.h"
#include "sim/formats/lloyd_max.h"

namespace kvb::theory {

double normal_pdf(double x) {
  if (std::isinf(x)) return 0.0;
  return std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

double ScalarQuantizer::quantize(double x) const {
  const size_t i = static_cast<size_t>(std::upper_bound(thresholds.begin(), thresholds.end(), x) - thresholds.begin());
  return levels[i];
}

namespace {

// x·φ(x), 0 at ±∞.
double x_pdf(double x) { return std::isinf(x) ? 0.0 : x * normal_pdf(x); }

// Interval [a, b] of level i.
void interval(const ScalarQuantizer& q, size_t i, double& a, double& b) {
  a = i == 0 ? -INFINITY : q.thresholds[i - 1];
  b = i + 1 == q.levels.size() ? INFINITY : q.thresholds[i];
}

}  // namespace

double gaussian_mse(const ScalarQuantizer& q) {
  double mse = 0;
  for (size_t i = 0; i < q.levels.size(); ++i) {
    double a, b;
    interval(q, i, a, b);
    const double m0 = normal_cdf(b) - normal_cdf(a);
    const double m1 = normal_pdf(a) - normal_pdf(b);
    const double m2 = m0 + x_pdf(a) - x_pdf(b);
    const double c = q.levels[i];
    mse += m2 - 2 * c * m1 + c * c * m0;
  }
  return mse;
}

ScalarQuantizer uniform_quantizer(int bits, double step) {
  ScalarQuantizer q;
  const int64_t n = int64_t{1} << bits;
  for (int64_t i = 0; i < n; ++i)
    q.levels.push_back((static_cast<double>(i) - 0.5 * static_cast<double>(n - 1)) * step);
  for (int64_t i = 0; i + 1 < n; ++i) q.thresholds.push_back(0.5 * (q.levels[i] + q.levels[i + 1]));
  return q;
}

double best_uniform_step(int bits) {
  // Golden-section search; the MSE is unimodal in the step.
  double lo = 1e-4, hi = 4.0;
  const double g = (std::sqrt(5.0) - 1) / 2;
  double x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
  double f1 = gaussian_mse(uniform_quantizer(bits, x1)), f2 = gaussian_mse(uniform_quantizer(bits, x2));
  for (int it = 0; it < 200 && hi - lo > 1e-13; ++it) {
    if (f1 < f2) {
      hi = x2;
      x2 = x1;
      f2 = f1;
      x1 = hi - g * (hi - lo);
      f1 = gaussian_mse(uniform_quantizer(bits, x1));
    } else {
      lo = x1;
      x1 = x2;
      f1 = f2;
      x2 = lo + g * (hi - lo);
      f2 = gaussian_mse(uniform_quantizer(bits, x2));
    }
  }
  return 0.5 * (lo + hi);
}

ScalarQuantizer lloyd_max_gaussian(int bits) {
  // The same codebook the rotation formats quantize with (sim/formats/lloyd_max.h),
  // so the bounds report measures what the simulator uses.
  const LloydMaxCodebook& cb = kvb::lloyd_max_gaussian(bits);
  ScalarQuantizer q;
  q.levels = cb.centroids_exact;
  for (size_t i = 0; i + 1 < q.levels.size(); ++i) q.thresholds.push_back(0.5 * (q.levels[i] + q.levels[i + 1]));
  return q;
}

double shannon_mse_bound(double bits) { return std::pow(4.0, -bits); }

double sampled_mse(const ScalarQuantizer& q, int64_t samples, uint64_t seed, double* standard_error) {
  synth::Rng rng(synth::derive_seed({seed, 0x7465737473ull}));
  double sum = 0, sum4 = 0;
  for (int64_t i = 0; i < samples; ++i) {
    const double x = rng.normal();
    const double e = x - q.quantize(x);
    sum += e * e;
    sum4 += e * e * e * e;
  }
  const double mean = samples ? sum / static_cast<double>(samples) : 0.0;
  if (standard_error) {
    const double n = static_cast<double>(samples);
    *standard_error = samples < 2 ? std::nan("") : std::sqrt(std::max(0.0, sum4 / n - mean * mean) / (n - 1));
  }
  return mean;
}

}  // namespace kvb::theory
