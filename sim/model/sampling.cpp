#include "sim/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"
#include "sim/core/rng.h"
#include "sim/core/strings.h"
#include "sim/model/transformer.h"

namespace kvb {

namespace {

// Names the sampler's stream among the seeded streams derived from one seed.
constexpr uint64_t kSamplingStream = 0x73616d706c696e67ull;  // "sampling"

}  // namespace

void SamplingSpec::check() const {
  if (!(temperature >= 0.0) || !std::isfinite(temperature))
    throw ConfigError("--temperature must be a finite number >= 0 (0 = greedy), got " + format_double(temperature));
  if (top_k < 0) throw ConfigError("--top-k must be >= 0 (0 = no limit), got " + std::to_string(top_k));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw ConfigError("--top-p must be in (0, 1] (1 = no limit), got " + format_double(top_p));
  if (temperature == 0.0 && (top_k > 1 || top_p < 1.0))
    throw ConfigError("--top-k and --top-p choose the tokens to sample from: give --temperature > 0 with them "
                      "(temperature 0 is greedy)");
}

std::string SamplingSpec::describe() const {
  if (greedy()) return temperature > 0.0 ? "greedy (top-k 1)" : "greedy";
  std::string s = "temperature " + format_double(temperature);
  if (top_k > 0) s += ", top-k " + std::to_string(top_k);
  if (top_p < 1.0) s += ", top-p " + format_double(top_p);
  return s + ", seed " + std::to_string(seed);
}

TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingSpec& spec) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (n == 0) throw Error("sampling: no logits (vocabulary of 0 tokens)");
  TokenDistribution d;
  if (spec.greedy()) {
    d.ids = {argmax(logits.data(), n)};
    d.probs = {1.0};
    return d;
  }
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(logits[static_cast<size_t>(i)]))
      throw Error("sampling: the logit of token " + std::to_string(i) + " is not finite (" +
                  format_double(logits[static_cast<size_t>(i)]) + ")");
  // Candidates, most likely first; the lower id first on ties (a total order, so the
  // result does not depend on the sort's implementation).
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  const auto before = [&](int64_t a, int64_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  const int64_t k = spec.top_k > 0 ? std::min(spec.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(static_cast<size_t>(k));
  // Softmax of logits / temperature over the candidates, in double.
  const double top = logits[static_cast<size_t>(order[0])];
  std::vector<double> probs(order.size());
  double sum = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    probs[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(order[i])]) - top) / spec.temperature);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  // Top-p: the fewest leading candidates whose probability reaches top_p.
  if (spec.top_p < 1.0) {
    size_t keep = 0;
    double cumulative = 0.0;
    while (keep < probs.size()) {
      cumulative += probs[keep++];
      if (cumulative >= spec.top_p) break;
    }
    order.resize(keep);
    probs.resize(keep);
    for (double& p : probs) p /= cumulative;
  }
  d.ids = std::move(order);
  d.probs = std::move(probs);
  return d;
}

double sampling_uniform(uint64_t seed, int64_t step) {
  const uint64_t bits = synth::derive_seed({seed, kSamplingStream, static_cast<uint64_t>(step)});
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int64_t sample_token(std::span<const float> logits, const SamplingSpec& spec, int64_t step) {
  if (spec.greedy()) return argmax(logits.data(), static_cast<int64_t>(logits.size()));
  const TokenDistribution d = sampling_distribution(logits, spec);
  const double u = sampling_uniform(spec.seed, step);
  double cumulative = 0.0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    cumulative += d.probs[i];
    if (u < cumulative) return d.ids[i];
  }
  return d.ids.back();  // u above a cumulative sum rounded below 1
}

std::vector<int64_t> sample_continuation(const Transformer& model, std::span<const int64_t> prompt,
                                         int64_t max_new_tokens, const CacheQuantization& cache,
                                         const SamplingSpec& spec,
                                         const std::function<bool(const std::vector<int64_t>&)>& stop) {
  const TokenChooser choose = [&spec](std::span<const float> logits, int64_t step) {
    return sample_token(logits, spec, step);
  };
  return generate(model, prompt, max_new_tokens, cache, choose, stop);
}

}  // namespace kvb
