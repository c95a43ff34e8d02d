#include "sim/formats/lloyd_max.h"

#include <array>
#include <cmath>
#include <mutex>

#include "sim/core/error.h"

namespace kvb {

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// Upper tail Q(x) = P(X > x), accurate in both tails.
double upper_tail(double x) { return 0.5 * std::erfc(x * kInvSqrt2); }
double pdf(double x) { return std::isinf(x) ? 0.0 : kInvSqrt2Pi * std::exp(-0.5 * x * x); }

// P(a < X < b) without cancellation in the tails.
double mass(double a, double b) {
  if (a >= 0) return upper_tail(a) - upper_tail(b);
  if (b <= 0) return upper_tail(-b) - upper_tail(-a);
  return 1.0 - upper_tail(b) - upper_tail(-a);
}

// Inverse CDF by bisection (only for the starting point).
double quantile(double p) {
  double lo = -40, hi = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (1.0 - upper_tail(mid) < p) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

LloydMaxCodebook compute(int bits) {
  const int K = 1 << bits;
  LloydMaxCodebook cb;
  cb.bits = bits;
  // Start from the high-rate optimum: point density ∝ p^(1/3), i.e. quantiles of N(0, 3).
  std::vector<double> c(K), t(K + 1);
  for (int k = 0; k < K; ++k) c[k] = std::sqrt(3.0) * quantile((k + 0.5) / K);
  std::vector<double> m(K);
  int it = 0;
  for (; it < 200000; ++it) {
    t[0] = -INFINITY;
    t[K] = INFINITY;
    for (int k = 1; k < K; ++k) t[k] = 0.5 * (c[k - 1] + c[k]);
    double change = 0;
    for (int k = 0; k < K; ++k) {
      m[k] = mass(t[k], t[k + 1]);
      const double next = (pdf(t[k]) - pdf(t[k + 1])) / m[k];  // E[X | t_k < X < t_k+1]
      change = std::max(change, std::fabs(next - c[k]));
      c[k] = next;
    }
    for (int k = 0; k < K / 2; ++k) {  // keep it exactly symmetric
      const double s = 0.5 * (c[K - 1 - k] - c[k]);
      c[k] = -s;
      c[K - 1 - k] = s;
    }
    if (change < 1e-12) break;
  }
  cb.iterations = it;
  cb.centroids_exact = c;
  double mse = 1.0;  // at the centroid condition, E[(X - Q)^2] = E[X^2] - E[Q^2]
  for (int k = 0; k < K; ++k) mse -= m[k] * c[k] * c[k];
  cb.mse = mse;
  cb.centroids.resize(K);
  cb.thresholds.resize(K - 1);
  for (int k = 0; k < K; ++k) cb.centroids[k] = static_cast<float>(c[k]);
  for (int k = 0; k + 1 < K; ++k) cb.thresholds[k] = static_cast<float>(0.5 * (c[k] + c[k + 1]));
  return cb;
}

}  // namespace

const LloydMaxCodebook& lloyd_max_gaussian(int bits) {
  if (bits < 1 || bits > 8) throw Error("Lloyd-Max codebook: bits must be 1..8, got " + std::to_string(bits));
  static std::array<std::once_flag, 9> once;
  static std::array<LloydMaxCodebook, 9> books;
  std::call_once(once[bits], [bits] { books[bits] = compute(bits); });
  return books[bits];
}

}  // namespace kvb
