// Token sampling for generation (`kvbudget generate`): greedy, or seeded sampling
// with a temperature, top-k and top-p (nucleus) truncation.
//
// Random stream: the draw of a continuation's step i (its i-th new token, 0-based) is
// one uniform u_i in [0, 1) that depends only on (seed, i), never on the tokens drawn
// before. Two continuations of the same prompt with the same seed (the exact cache's
// and a quantized cache's) therefore use the same u_i at every step, so where their
// tokens differ, the distributions differed: the difference comes from the cache
// alone. The token is the inverse CDF of the truncated distribution at u_i, its
// candidates ordered by logit (highest first, the lower id first on ties), so a small
// change of the distribution moves the drawn token only when u_i falls near a
// boundary. Everything is sequential double arithmetic: the same logits give the same
// token on any machine and for any thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sim/model/kv_cache.h"

namespace kvb {

class Transformer;

struct SamplingSpec {
  double temperature = 0.0;  // logits are divided by it; 0 = greedy (argmax)
  int64_t top_k = 0;         // keep the k most likely tokens; 0 = no limit
  double top_p = 1.0;        // keep the fewest most likely tokens whose probability reaches top_p; 1 = no limit
  uint64_t seed = 0;         // of the random stream (above)

  // Whether the choice is the argmax: temperature 0, or top_k 1.
  bool greedy() const { return temperature <= 0.0 || top_k == 1; }
  // Throws kvb::ConfigError naming the option (--temperature, --top-k, --top-p) unless
  // temperature >= 0 and finite, top_k >= 0, 0 < top_p <= 1, and top_k > 1 or
  // top_p < 1 only with a temperature > 0 (they would do nothing).
  void check() const;
  // "greedy" or e.g. "temperature 0.8, top-k 40, top-p 0.95, seed 3".
  std::string describe() const;
};

// The truncated distribution one step samples from: candidate ids, most likely first
// (lower id first on ties), and their probabilities (summing to 1). Greedy: the
// argmax alone, probability 1. `logits` [vocab] must be finite.
struct TokenDistribution {
  std::vector<int64_t> ids;
  std::vector<double> probs;
};
TokenDistribution sampling_distribution(std::span<const float> logits, const SamplingSpec& spec);

// The uniform u_i in [0, 1) of step `step` of the stream of `seed` (53 random bits).
double sampling_uniform(uint64_t seed, int64_t step);

// The token of step `step`: the argmax when greedy (the first one on ties, as
// kvb::argmax), else the inverse CDF of sampling_distribution() at
// sampling_uniform(spec.seed, step).
int64_t sample_token(std::span<const float> logits, const SamplingSpec& spec, int64_t step);

// Generation with this sampler: the prompt, then at most max_new_tokens tokens, each
// fed back (the cache's prompt rule is greedy_generate's, transformer.h). After each
// new token, `stop(generated)`, when given, ends the generation when it returns true.
std::vector<int64_t> sample_continuation(const Transformer& model, std::span<const int64_t> prompt,
                                         int64_t max_new_tokens, const CacheQuantization& cache,
                                         const SamplingSpec& spec,
                                         const std::function<bool(const std::vector<int64_t>&)>& stop = nullptr);

}  // namespace kvb
