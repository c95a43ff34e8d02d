// Model-level raw results and the reductions behind the model metrics of the metric
// table (methods.md §4): perplexity, next-token KL and top-token agreement from
// teacher forcing, and agreement of greedy continuations (token match, BLEU-4).
#pragma once
#include <cstdint>
#include <vector>

namespace kvb {

// What a forward pass with a quantized cache produced next to the unquantized one.
struct ModelStats {
  // Teacher forcing, one entry per evaluated position t = 0 .. T-2 (each predicts
  // token t + 1), in position order.
  std::vector<double> nll;        // -log p_quantized(token t+1), nats
  std::vector<double> nll_base;   // -log p_base(token t+1), nats
  std::vector<double> kl;         // KL(p_base(·|t) || p_quantized(·|t)), nats
  std::vector<uint8_t> same_top;  // 1 when argmax p_base == argmax p_quantized
  // Greedy continuations of the same prompts, quantized and unquantized.
  std::vector<std::vector<int64_t>> continuations;
  std::vector<std::vector<int64_t>> continuations_base;
  // Answer task (sim/model/answer_task.h), one entry per problem in task order: 1 when
  // the answer generated with the quantized / the exact cache matched the expected one.
  std::vector<uint8_t> answers_correct;
  std::vector<uint8_t> answers_correct_base;

  bool has_positions() const { return !nll.empty(); }
  bool has_continuations() const { return !continuations.empty(); }
  bool has_answers() const { return !answers_correct.empty(); }
  // Appends another result (e.g. another text): positions and continuations pooled.
  void merge(const ModelStats& other);
};

// A confidence interval [lo, hi] of a metric.
struct Interval {
  double lo = 0, hi = 0;
};

// Wilson score interval of a binomial proportion: `successes` of `n` trials at
// two-sided coverage `level` (0.95). {NaN, NaN} for n = 0.
Interval wilson_interval(int64_t successes, int64_t n, double level = 0.95);
// z with P(|Z| <= z) = level for a standard normal Z (1.959964 for 0.95): a mean ± z·SE
// is its `level` interval. Throws kvb::Error unless 0 < level < 1.
double two_sided_normal_z(double level);

// exp(mean nll).
double perplexity(const std::vector<double>& nll);

// The plain references, std::exp per logit in index order: log-softmax of n logits
// (double), log Σ exp(logits) as log_softmax computes it (its out[i] is logits[i] −
// this), and KL(p || q) = Σ p (log p − log q) from log-probabilities (>= 0 up to
// rounding, clamped at 0; NaN when a log-probability is NaN).
void log_softmax(const float* logits, int64_t n, std::vector<double>& out);
double log_sum_exp_reference(const float* logits, int64_t n);
double kl_from_log_probs(const std::vector<double>& log_p, const std::vector<double>& log_q);

// The fast forms the evaluator runs (a 128256-token vocabulary's row is two passes of
// 128256 exps per scored position and point): the same sums in vector lanes, fp64
// e^x within 1 ulp (simd::exp, sim/metrics/row_simd.h), lanes summed in a fixed
// order. They differ from the references in the last bits only;
// tests/metrics/test_model_metrics.cpp bounds the difference.
double log_sum_exp(const float* logits, int64_t n);

// One scored position of a quantized run against the exact one: what the model-level
// metrics take from the two rows of n logits, with the next token `next`.
struct NextTokenComparison {
  double nll = 0;  // −log q(next)
  double kl = 0;   // KL(p || q), clamped at 0; NaN when either row holds NaN or +inf
};
// What log_softmax and kl_from_log_probs give on these rows (up to the last bits, as
// log_sum_exp), without the two vectors of n log-probabilities. exact_log_sum_exp is
// log_sum_exp(exact, n): the same for every quantized run.
NextTokenComparison compare_next_token(const float* exact, double exact_log_sum_exp, const float* quantized, int64_t n,
                                       int64_t next);

// Fraction of positions i < |reference| where candidate[i] == reference[i], pooled
// over all pairs (a candidate shorter than its reference misses the rest).
double token_match_rate(const std::vector<std::vector<int64_t>>& candidates,
                        const std::vector<std::vector<int64_t>>& references);

// Standard corpus BLEU-4 (Papineni et al. 2002) on token ids, one reference per
// candidate: clipped n-gram matches and candidate n-gram counts summed over the corpus
// for n = 1..4, p_n = matches / counts, BLEU = BP · exp(¼ Σ log p_n), BP =
// min(1, exp(1 − r/c)) with r, c the total reference and candidate lengths. No
// smoothing: 0 when some order has no match.
double corpus_bleu4(const std::vector<std::vector<int64_t>>& candidates,
                    const std::vector<std::vector<int64_t>>& references);

// The research's variant (methods.md §6): BLEU-4 per sequence, where orders with no
// matching n-gram are dropped and the geometric mean is taken over the remaining
// orders (0 when not even a unigram matches), times that sequence's BP; the scores
// are then averaged over sequences.
double research_bleu4(const std::vector<std::vector<int64_t>>& candidates,
                      const std::vector<std::vector<int64_t>>& references);

}  // namespace kvb
