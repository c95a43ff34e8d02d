#include "sim/metrics/model_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "sim/core/error.h"
#include "sim/metrics/row_simd.h"

namespace kvb {

namespace {

constexpr int kMaxOrder = 4;

struct NgramCounts {
  int64_t matches[kMaxOrder] = {0, 0, 0, 0};  // clipped
  int64_t totals[kMaxOrder] = {0, 0, 0, 0};   // candidate n-grams
};

// Clipped n-gram matches of one candidate against one reference, n = 1..4.
NgramCounts count_ngrams(const std::vector<int64_t>& cand, const std::vector<int64_t>& ref) {
  NgramCounts c;
  for (int n = 1; n <= kMaxOrder; ++n) {
    std::map<std::vector<int64_t>, int64_t> ref_counts, cand_counts;
    for (size_t i = 0; i + n <= ref.size(); ++i) ++ref_counts[std::vector<int64_t>(ref.begin() + i, ref.begin() + i + n)];
    for (size_t i = 0; i + n <= cand.size(); ++i)
      ++cand_counts[std::vector<int64_t>(cand.begin() + i, cand.begin() + i + n)];
    for (const auto& [gram, count] : cand_counts) {
      const auto it = ref_counts.find(gram);
      if (it != ref_counts.end()) c.matches[n - 1] += std::min(count, it->second);
      c.totals[n - 1] += count;
    }
  }
  return c;
}

double brevity_penalty(double candidate_len, double reference_len) {
  if (candidate_len <= 0) return 0.0;
  return candidate_len > reference_len ? 1.0 : std::exp(1.0 - reference_len / candidate_len);
}

void require_pairs(const std::vector<std::vector<int64_t>>& c, const std::vector<std::vector<int64_t>>& r) {
  if (c.size() != r.size())
    throw Error("internal: " + std::to_string(c.size()) + " candidates but " + std::to_string(r.size()) +
                " references");
}

}  // namespace

void ModelStats::merge(const ModelStats& o) {
  nll.insert(nll.end(), o.nll.begin(), o.nll.end());
  nll_base.insert(nll_base.end(), o.nll_base.begin(), o.nll_base.end());
  kl.insert(kl.end(), o.kl.begin(), o.kl.end());
  same_top.insert(same_top.end(), o.same_top.begin(), o.same_top.end());
  continuations.insert(continuations.end(), o.continuations.begin(), o.continuations.end());
  continuations_base.insert(continuations_base.end(), o.continuations_base.begin(), o.continuations_base.end());
  answers_correct.insert(answers_correct.end(), o.answers_correct.begin(), o.answers_correct.end());
  answers_correct_base.insert(answers_correct_base.end(), o.answers_correct_base.begin(), o.answers_correct_base.end());
}

double two_sided_normal_z(double level) {
  if (!(level > 0 && level < 1)) throw Error("two_sided_normal_z: level must be in (0, 1)");
  // z = Φ⁻¹((1 + level) / 2), by bisection on erfc (Φ(z) = 1 − erfc(z/√2)/2).
  double lo_z = 0, hi_z = 40;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo_z + hi_z);
    (1.0 - 0.5 * std::erfc(mid / std::sqrt(2.0)) < 0.5 * (1.0 + level) ? lo_z : hi_z) = mid;
  }
  return 0.5 * (lo_z + hi_z);
}

Interval wilson_interval(int64_t successes, int64_t n, double level) {
  if (n <= 0) return {std::nan(""), std::nan("")};
  if (!(level > 0 && level < 1)) throw Error("wilson_interval: level must be in (0, 1)");
  const double z = two_sided_normal_z(level), nn = static_cast<double>(n);
  const double p = static_cast<double>(successes) / nn, z2 = z * z;
  const double center = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z / (1 + z2 / nn) * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

double perplexity(const std::vector<double>& nll) {
  if (nll.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (double v : nll) sum += v;
  return std::exp(sum / static_cast<double>(nll.size()));
}

namespace {
// A summed KL: rounding can leave it just below 0, clamped to 0; NaN (a row with NaN
// or +inf logits) stays NaN, where std::max(0.0, NaN) would report a perfect 0.
double kl_or_nan(double kl) { return kl < 0 ? 0.0 : kl; }
}  // namespace

double log_sum_exp_reference(const float* logits, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(z);
}

void log_softmax(const float* logits, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  const double log_z = log_sum_exp_reference(logits, n);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - log_z;
}

double kl_from_log_probs(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    const double p = std::exp(log_p[i]);
    if (p != 0) kl += p * (log_p[i] - log_q[i]);  // NaN p (a NaN row) makes the KL NaN
  }
  return kl_or_nan(kl);
}

// The fast forms: kLanes logits at a time (sim/metrics/row_simd.h), each widened to
// fp64 and summed per lane in fp64, the lanes added in a fixed order at the end. A
// tail is padded with -inf, whose e^x is 0.
namespace {

using simd::f64v;

f64v widen_logits(const float* logits, int64_t i, int64_t n) {
  return simd::widen(simd::load(logits + i, std::min(simd::kLanes, n - i), -INFINITY));
}

}  // namespace

double log_sum_exp(const float* logits, int64_t n) {
  simd::f32v mx = simd::splat(-INFINITY);
  for (int64_t i = 0; i < n; i += simd::kLanes)
    mx = simd::vmax(mx, simd::load(logits + i, std::min(simd::kLanes, n - i), -INFINITY));
  const double m = simd::hmax(mx);
  const simd::f64h mv = simd::splat64(m);
  f64v z{};
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    const f64v x = widen_logits(logits, i, n);
    z += f64v{simd::exp(x.lo - mv), simd::exp(x.hi - mv)};
  }
  return m + std::log(simd::hsum(z));
}

NextTokenComparison compare_next_token(const float* exact, double exact_log_sum_exp, const float* quantized, int64_t n,
                                       int64_t next) {
  const double log_zq = log_sum_exp(quantized, n);
  NextTokenComparison c;
  c.nll = -(static_cast<double>(quantized[next]) - log_zq);
  // KL = Σ p (log p − log q) over the terms with p > 0, as kl_from_log_probs.
  const simd::f64h zp = simd::splat64(exact_log_sum_exp), zq = simd::splat64(log_zq), zero{};
  auto terms = [&](simd::f64h x, simd::f64h y) {
    const simd::f64h log_p = x - zp, log_q = y - zq, p = simd::exp(log_p);
    return p != zero ? p * (log_p - log_q) : zero;  // NaN p (a NaN row) makes the KL NaN
  };
  f64v kl{};
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    const f64v x = widen_logits(exact, i, n), y = widen_logits(quantized, i, n);
    kl += f64v{terms(x.lo, y.lo), terms(x.hi, y.hi)};
  }
  c.kl = kl_or_nan(simd::hsum(kl));
  return c;
}

double token_match_rate(const std::vector<std::vector<int64_t>>& candidates,
                        const std::vector<std::vector<int64_t>>& references) {
  require_pairs(candidates, references);
  int64_t same = 0, total = 0;
  for (size_t s = 0; s < references.size(); ++s) {
    const auto& c = candidates[s];
    const auto& r = references[s];
    for (size_t i = 0; i < r.size(); ++i) same += (i < c.size() && c[i] == r[i]) ? 1 : 0;
    total += static_cast<int64_t>(r.size());
  }
  return total ? static_cast<double>(same) / static_cast<double>(total) : std::numeric_limits<double>::quiet_NaN();
}

double corpus_bleu4(const std::vector<std::vector<int64_t>>& candidates,
                    const std::vector<std::vector<int64_t>>& references) {
  require_pairs(candidates, references);
  if (candidates.empty()) return std::numeric_limits<double>::quiet_NaN();
  int64_t matches[kMaxOrder] = {0, 0, 0, 0}, totals[kMaxOrder] = {0, 0, 0, 0};
  double c_len = 0, r_len = 0;
  for (size_t s = 0; s < candidates.size(); ++s) {
    const NgramCounts c = count_ngrams(candidates[s], references[s]);
    for (int n = 0; n < kMaxOrder; ++n) {
      matches[n] += c.matches[n];
      totals[n] += c.totals[n];
    }
    c_len += static_cast<double>(candidates[s].size());
    r_len += static_cast<double>(references[s].size());
  }
  double log_sum = 0;
  for (int n = 0; n < kMaxOrder; ++n) {
    if (matches[n] == 0) return 0.0;
    log_sum += std::log(static_cast<double>(matches[n]) / static_cast<double>(totals[n]));
  }
  return brevity_penalty(c_len, r_len) * std::exp(log_sum / kMaxOrder);
}

double research_bleu4(const std::vector<std::vector<int64_t>>& candidates,
                      const std::vector<std::vector<int64_t>>& references) {
  require_pairs(candidates, references);
  if (candidates.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (size_t s = 0; s < candidates.size(); ++s) {
    const NgramCounts c = count_ngrams(candidates[s], references[s]);
    double log_sum = 0;
    int kept = 0;
    for (int n = 0; n < kMaxOrder; ++n) {
      if (c.matches[n] == 0) continue;
      log_sum += std::log(static_cast<double>(c.matches[n]) / static_cast<double>(c.totals[n]));
      ++kept;
    }
    if (kept == 0) continue;  // scores 0
    sum += brevity_penalty(static_cast<double>(candidates[s].size()), static_cast<double>(references[s].size())) *
           std::exp(log_sum / kept);
  }
  return sum / static_cast<double>(candidates.size());
}

}  // namespace kvb
