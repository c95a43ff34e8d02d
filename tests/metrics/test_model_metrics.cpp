// Model-level metrics (sim/metrics/model_metrics.h and their metric-table entries)
// against cases computed by hand.
#include <random>
#include <cmath>

#include "sim/metrics/metric_table.h"
#include "sim/metrics/model_metrics.h"
#include "test_util.h"

using namespace kvb;
using Seqs = std::vector<std::vector<int64_t>>;

namespace {
// cand [1,2,3,4,5,6] vs ref [1,2,3,4,9,6]: p1..p4 = 5/6, 3/5, 2/4, 1/3.
const std::vector<int64_t> kCand = {1, 2, 3, 4, 5, 6}, kRef = {1, 2, 3, 4, 9, 6};
const double kBleuB = std::pow(5.0 / 6 * 3.0 / 5 * 2.0 / 4 * 1.0 / 3, 0.25);
double metric(const ErrorStats& s, const char* name) { return find_metric(name)->compute(s); }
}  // namespace

TEST_CASE("BLEU-4, standard and research variant, on small token lists") {
  // Identical sequences.
  CHECK(corpus_bleu4({{1, 2, 3, 4, 5}}, {{1, 2, 3, 4, 5}}) == doctest::Approx(1.0));
  CHECK(research_bleu4({{1, 2, 3, 4, 5}}, {{1, 2, 3, 4, 5}}) == doctest::Approx(1.0));
  // All four orders match partially.
  CHECK(kBleuB == doctest::Approx(0.5372849659));
  CHECK(corpus_bleu4({kCand}, {kRef}) == doctest::Approx(kBleuB));
  CHECK(research_bleu4({kCand}, {kRef}) == doctest::Approx(kBleuB));
  // No 4-gram match: standard BLEU is 0; the research variant drops the order and
  // takes the geometric mean of p1..p3 = 3/6, 2/5, 1/4.
  const Seqs c = {{1, 2, 3, 7, 8, 9}}, r = {{1, 2, 3, 4, 5, 6}};
  CHECK(corpus_bleu4(c, r) == 0.0);
  CHECK(research_bleu4(c, r) == doctest::Approx(std::cbrt(0.5 * 0.4 * 0.25)));
  // Nothing matches: 0 in both.
  CHECK(research_bleu4({{7, 7}}, {{1, 2}}) == 0.0);
  CHECK(corpus_bleu4({{7, 7}}, {{1, 2}}) == 0.0);
  // Clipping: four 1s against one 1 count once; only unigrams remain in the variant.
  CHECK(research_bleu4({{1, 1, 1, 1}}, {{1, 2, 3, 4}}) == doctest::Approx(0.25));
  // Brevity penalty: a perfect half-length candidate scores exp(1 - 8/4).
  CHECK(corpus_bleu4({{1, 2, 3, 4}}, {{1, 2, 3, 4, 5, 6, 7, 8}}) == doctest::Approx(std::exp(-1.0)));
  CHECK(research_bleu4({{1, 2, 3, 4}}, {{1, 2, 3, 4, 5, 6, 7, 8}}) == doctest::Approx(std::exp(-1.0)));
  // A corpus pools counts (10/11, 7/9, 5/7, 3/5); the variant averages sequence scores.
  const Seqs cands = {kCand, {1, 2, 3, 4, 5}}, refs = {kRef, {1, 2, 3, 4, 5}};
  CHECK(corpus_bleu4(cands, refs) == doctest::Approx(std::pow(10.0 / 11 * 7.0 / 9 * 5.0 / 7 * 3.0 / 5, 0.25)));
  CHECK(research_bleu4(cands, refs) == doctest::Approx((kBleuB + 1.0) / 2));
  CHECK(std::isnan(corpus_bleu4({}, {})));
}

TEST_CASE("token match, KL from log-probabilities, log-softmax, perplexity") {
  CHECK(token_match_rate({{1, 2, 3}}, {{1, 5, 3, 4}}) == doctest::Approx(0.5));
  CHECK(token_match_rate({{1, 2}, {3}}, {{1, 2}, {4}}) == doctest::Approx(2.0 / 3));
  // p = softmax(0, ln 2) = (1/3, 2/3), q = (1/2, 1/2).
  std::vector<double> lp, lq;
  const float a[2] = {0.0f, static_cast<float>(std::log(2.0))}, b[2] = {3.0f, 3.0f};
  log_softmax(a, 2, lp);
  log_softmax(b, 2, lq);
  CHECK(std::exp(lp[0]) == doctest::Approx(1.0 / 3));
  CHECK(lq[1] == doctest::Approx(std::log(0.5)));
  CHECK(kl_from_log_probs(lp, lq) == doctest::Approx(1.0 / 3 * std::log(2.0 / 3) + 2.0 / 3 * std::log(4.0 / 3)));
  CHECK(kl_from_log_probs(lp, lp) == 0.0);
  // Large logits do not overflow.
  const float big[3] = {1000.0f, 999.0f, -1000.0f};
  log_softmax(big, 3, lp);
  CHECK(std::isfinite(lp[2]));
  CHECK(std::exp(lp[0]) + std::exp(lp[1]) == doctest::Approx(1.0));
  CHECK(perplexity({std::log(2.0), std::log(8.0)}) == doctest::Approx(4.0));
}

TEST_CASE("metric table: model metrics reduce ErrorStats::model") {
  ErrorStats s;
  CHECK(std::isnan(metric(s, "ppl")));
  CHECK(std::isnan(metric(s, "gen_bleu4")));
  s.model.nll = {1, 2, 3};
  s.model.nll_base = {1, 1, 1};
  s.model.kl = {0.1, 0.4, 0.2};
  s.model.same_top = {1, 0, 1};
  s.model.continuations = {kCand, {1, 2, 3, 4, 5}};
  s.model.continuations_base = {kRef, {1, 2, 3, 4, 5}};
  CHECK(metric(s, "ppl") == doctest::Approx(std::exp(2.0)));
  CHECK(metric(s, "ppl_ratio") == doctest::Approx(std::exp(1.0)));
  CHECK(metric(s, "next_token_kl_mean") == doctest::Approx(0.7 / 3));
  CHECK(metric(s, "next_token_kl_median") == doctest::Approx(0.2));
  CHECK(metric(s, "next_token_kl_p99") == doctest::Approx(0.2 + 0.98 * 0.2));
  CHECK(metric(s, "next_token_kl_max") == doctest::Approx(0.4));
  CHECK(metric(s, "same_top_rate") == doctest::Approx(2.0 / 3));
  CHECK(metric(s, "gen_token_match") == doctest::Approx(10.0 / 11));
  CHECK(metric(s, "gen_bleu4") == doctest::Approx(corpus_bleu4(s.model.continuations, s.model.continuations_base)));
  CHECK(metric(s, "gen_bleu4_research") == doctest::Approx((kBleuB + 1.0) / 2));
  // Merging pools positions and continuations.
  ErrorStats twice = s;
  twice.merge(s);
  CHECK(twice.model.nll.size() == 6);
  CHECK(metric(twice, "ppl_ratio") == doctest::Approx(std::exp(1.0)));
  // Every model metric is in the table once, at the model level, with its direction.
  int model_metrics = 0;
  for (const MetricDef& m : metric_table()) {
    if (m.level != MetricLevel::Model) continue;
    ++model_metrics;
    CHECK(static_cast<bool>(m.compute));
    // Δp = p_quantized − p_exact of the right token: higher is better, but not its RMS.
    const bool higher = m.name == "same_top_rate" || m.name.rfind("gen_", 0) == 0 || m.name == "answer_accuracy" ||
                        m.name == "flips_wrong_to_right" || m.name == "ln_ppl_correlation" ||
                        (m.name.rfind("delta_p_", 0) == 0 && m.name != "delta_p_rms");
    CHECK((m.better == Better::Higher) == higher);
    CHECK(m.needs_continuations == (m.name.rfind("gen_", 0) == 0));
    CHECK(m.needs_task == (m.name == "answer_accuracy" || m.name.rfind("flips_", 0) == 0));
  }
  CHECK(model_metrics == 40);  // 13, and llama.cpp's detailed statistics: ppl_base, ln_ppl_ratio, ppl_diff,
                               // ln_ppl_correlation, 8 KL, 15 Δp
}

TEST_CASE("metric table: standard errors of the model metrics, as llama.cpp's perplexity tool") {
  ErrorStats s;
  s.model.nll = {1, 2, 3};
  s.model.nll_base = {1, 1, 1};
  s.model.kl = {0.1, 0.4, 0.2};
  s.model.same_top = {1, 0, 1};
  auto se = [&](const char* name) { return require_metric(name, "test").standard_error(s); };
  // Mean NLL 2, squared deviations 1 + 0 + 1 = 2: SE = sqrt(2 / 3 / 2) (population
  // variance over n − 1); PPL's by the delta method, e² · SE.
  CHECK(standard_error_of_mean(s.model.nll) == doctest::Approx(std::sqrt(1.0 / 3)));
  CHECK(se("ppl") == doctest::Approx(std::exp(2.0) * std::sqrt(1.0 / 3)));
  // nll − nll_base = {0, 1, 2}: ln(PPL ratio) = 1 ± sqrt(1/3); the ratio's SE is e · sqrt(1/3).
  CHECK(se("ppl_ratio") == doctest::Approx(std::exp(1.0) * std::sqrt(1.0 / 3)));
  CHECK(se("ppl_ratio") / metric(s, "ppl_ratio") == doctest::Approx(std::sqrt(1.0 / 3)));
  // KL {0.1, 0.4, 0.2}: squared deviations from 0.7/3 sum to 0.14/3; over n(n − 1) = 6.
  CHECK(se("next_token_kl_mean") == doctest::Approx(std::sqrt(0.14 / 18)));
  // Same top 2 of 3: sqrt(p(1 − p) / (n − 1)) = sqrt(2/9 / 2) = 1/3.
  CHECK(se("same_top_rate") == doctest::Approx(1.0 / 3));
  // The one-pass form llama.cpp evaluates, sqrt((Σx²/n − mean²) / (n − 1)), agrees.
  CHECK(standard_error_of_mean(s.model.kl) ==
        doctest::Approx(std::sqrt(((0.01 + 0.16 + 0.04) / 3 - (0.7 / 3) * (0.7 / 3)) / 2)));
  // Undefined without results, and for a single position.
  ErrorStats none;
  CHECK(std::isnan(require_metric("ppl", "test").standard_error(none)));
  CHECK(std::isnan(require_metric("same_top_rate", "test").standard_error(none)));
  ErrorStats one;
  one.model.nll = {2};
  one.model.nll_base = {1};
  one.model.kl = {0.5};
  one.model.same_top = {1};
  CHECK(std::isnan(require_metric("ppl_ratio", "test").standard_error(one)));
  CHECK(std::isnan(require_metric("same_top_rate", "test").standard_error(one)));
  CHECK(std::isnan(standard_error_of_mean({})));
  // Exactly these metrics have one (the last four are reported when a config names them).
  std::vector<std::string> with_se;
  for (const MetricDef& m : metric_table())
    if (m.standard_error) with_se.push_back(m.name);
  CHECK(with_se == std::vector<std::string>{"ppl", "ppl_ratio", "next_token_kl_mean", "same_top_rate", "ppl_base",
                                            "ln_ppl_ratio", "ppl_diff", "delta_p_mean", "delta_p_rms"});
}

TEST_CASE("metric table: every metric has an axis label with its quantity, unit and direction") {
  CHECK(metric_axis_label(require_metric("attn_kl_mean", "test")) == "attention KL, mean (nats, lower is better)");
  CHECK(metric_axis_label(require_metric("topk_overlap", "test")) ==
        "top-k attention overlap, fraction of k (higher is better)");
  for (const MetricDef& m : metric_table()) {
    CAPTURE(m.name);
    CHECK(!m.quantity.empty());
    const std::string label = metric_axis_label(m);
    CHECK(label.rfind(m.quantity + " (", 0) == 0);
    CHECK(label.find(m.unit) != std::string::npos);
    CHECK(label.find(m.better == Better::Lower ? "lower is better)" : "higher is better)") != std::string::npos);
  }
}

TEST_CASE("log_sum_exp and compare_next_token: the references' values up to the last bits") {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 259, 5000, 128256}) {
    CAPTURE(n);
    std::vector<float> exact(static_cast<size_t>(n)), quantized(exact.size());
    for (size_t i = 0; i < exact.size(); ++i) {
      exact[i] = logit(rng);
      quantized[i] = exact[i] + 0.1f * logit(rng);
    }
    if (n > 2) exact[1] = -800.0f;  // a probability that underflows to 0 in the exact row
    if (n > 3) quantized[2] = -INFINITY;  // a token the quantized row rules out
    if (n > 3) exact[2] = -INFINITY;
    // The references' index-order sums carry up to n roundings of their total: the bound.
    const double tol = 1e-14 + 1e-16 * static_cast<double>(n);
    const double lse_exact = kvb::log_sum_exp(exact.data(), n), lse_quant = kvb::log_sum_exp(quantized.data(), n);
    CHECK(std::fabs(lse_exact - kvb::log_sum_exp_reference(exact.data(), n)) <= tol);
    CHECK(std::fabs(lse_quant - kvb::log_sum_exp_reference(quantized.data(), n)) <= tol);
    std::vector<double> lp, lq;
    kvb::log_softmax(exact.data(), n, lp);
    kvb::log_softmax(quantized.data(), n, lq);
    const int64_t next = n / 2;
    const kvb::NextTokenComparison c =
        kvb::compare_next_token(exact.data(), lse_exact, quantized.data(), n, next);
    CHECK(std::fabs(c.nll - -lq[static_cast<size_t>(next)]) <= tol);
    const double kl = kvb::kl_from_log_probs(lp, lq);
    CHECK(std::fabs(c.kl - kl) <= 2 * tol + 1e-12 * kl);
    // The same rows: KL 0 (a row against itself is 0 up to rounding, clamped at 0).
    CHECK(kvb::compare_next_token(exact.data(), lse_exact, exact.data(), n, next).kl <= 1e-15);
  }
}

TEST_CASE("compare_next_token and kl_from_log_probs: a row with NaN or +inf gives NaN, never a perfect 0") {
  for (int64_t n : {5, 9, 259}) {
    CAPTURE(n);
    std::vector<float> exact(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) exact[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 7);
    const double lse_exact = kvb::log_sum_exp(exact.data(), n);
    std::vector<double> lp;
    kvb::log_softmax(exact.data(), n, lp);
    for (float bad : {NAN, INFINITY}) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        CAPTURE(bad);
        CAPTURE(at);
        std::vector<float> quantized = exact;
        quantized[static_cast<size_t>(at)] = bad;
        const kvb::NextTokenComparison c = kvb::compare_next_token(exact.data(), lse_exact, quantized.data(), n, 1);
        CHECK(std::isnan(c.nll));
        CHECK(std::isnan(c.kl));
        std::vector<double> lq;
        kvb::log_softmax(quantized.data(), n, lq);
        CHECK(std::isnan(kvb::kl_from_log_probs(lp, lq)));
        // The exact row's NaN as well (its log-sum-exp is NaN).
        CHECK(std::isnan(kvb::compare_next_token(quantized.data(), kvb::log_sum_exp(quantized.data(), n),
                                                 exact.data(), n, 1)
                             .kl));
      }
    }
    // -inf where the exact row has mass: an infinite KL, as it should be; a finite nll
    // when the next token is not that one.
    std::vector<float> ruled_out = exact;
    ruled_out[2] = -INFINITY;
    const kvb::NextTokenComparison c = kvb::compare_next_token(exact.data(), lse_exact, ruled_out.data(), n, 1);
    CHECK(std::isinf(c.kl));
    CHECK(std::isfinite(c.nll));
  }
}

TEST_CASE("metric table: llama.cpp's Cor(ln(PPL(Q)), ln(PPL(base))) and PPL(Q) - PPL(base) with its SE") {
  ErrorStats s;
  s.model.nll = {1, 2, 4};
  s.model.nll_base = {1, 3, 2};
  s.model.kl = {0.1, 0.4, 0.2};
  s.model.same_top = {1, 0, 1};
  // Deviations from the means 7/3 and 2: {-4/3, -1/3, 5/3} and {-1, 1, 0}; Σ products 1,
  // Σ squares 14/3 and 2. Pearson's r = 1 / sqrt(28/3).
  CHECK(metric(s, "ln_ppl_correlation") == doctest::Approx(std::sqrt(3.0 / 28)));
  CHECK(metric(s, "ppl_diff") == doctest::Approx(std::exp(7.0 / 3) - std::exp(2.0)));
  // SE(nll) = sqrt(14/3 / 6), SE(nll_base) = sqrt(2 / 6), covariance of the means 1/6:
  // sqrt(e^{14/3}·7/9 + e^4/3 − 2 e^{7/3} e^2 / 6).
  const double se = std::sqrt(std::exp(14.0 / 3) * 7 / 9 + std::exp(4.0) / 3 - 2 * std::exp(7.0 / 3 + 2) / 6);
  CHECK(require_metric("ppl_diff", "test").standard_error(s) == doctest::Approx(se));
  // The same NLLs in both runs: a difference of 0 ± 0 (not NaN from rounding below 0).
  s.model.nll_base = s.model.nll;
  CHECK(metric(s, "ppl_diff") == 0.0);
  CHECK(require_metric("ppl_diff", "test").standard_error(s) == 0.0);
  CHECK(metric(s, "ln_ppl_correlation") == doctest::Approx(1.0));
  // The KL's 95th, 0.1th percentiles and minimum: linear interpolation over {0.1, 0.2, 0.4}.
  CHECK(metric(s, "next_token_kl_p95") == doctest::Approx(0.2 + 0.9 * 0.2));
  CHECK(metric(s, "next_token_kl_p0_1") == doctest::Approx(0.1 + 0.002 * 0.1));
  CHECK(metric(s, "next_token_kl_min") == doctest::Approx(0.1));
}
