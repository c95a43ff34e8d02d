#include "sim/metrics/metric_table.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

namespace {

double ratio(double num, double den) { return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0); }
double snr_db(double err2, double norm2) {
  return err2 > 0 ? 10.0 * std::log10(norm2 / err2) : std::numeric_limits<double>::infinity();
}

template <typename F>
std::vector<double> per_row(const ErrorStats& s, F f) {
  std::vector<double> v;
  v.reserve(s.rows.size());
  for (const AttentionRow& r : s.rows) v.push_back(f(r));
  return v;
}

// mean(per_row(s, f)) and max_of(per_row(s, f)) without the row-sized vector (the
// same additions and comparisons in the same order: the same bits).
template <typename F>
double mean_rows(const ErrorStats& s, F f) {
  double sum = 0;
  for (const AttentionRow& r : s.rows) sum += f(r);
  return s.rows.empty() ? 0.0 : sum / static_cast<double>(s.rows.size());
}
template <typename F>
double max_rows(const ErrorStats& s, F f) {
  if (s.rows.empty()) return 0.0;
  double m = f(s.rows.front());
  for (size_t i = 1; i < s.rows.size(); ++i)
    if (const double v = f(s.rows[i]); m < v) m = v;  // std::max_element's choice
  return m;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}
double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

double kl(const AttentionRow& r) { return r.kl; }
double out_rel(const AttentionRow& r) { return r.out_norm2 > 0 ? std::sqrt(r.out_err2 / r.out_norm2) : 0.0; }

// Row reductions of the attention metrics, for the bootstrap (RowReduction).
double one(const AttentionRow&) { return 1.0; }
double topk_of(const AttentionRow& r) { return r.topk_overlap; }
double logit_err2_of(const AttentionRow& r) { return r.logit_err2; }
double logit_pairs_of(const AttentionRow& r) { return static_cast<double>(r.position) + 1; }  // keys j <= t
double logit_err_max_of(const AttentionRow& r) { return r.logit_err_max; }
double out_err2_of(const AttentionRow& r) { return r.out_err2; }
double out_norm2_of(const AttentionRow& r) { return r.out_norm2; }
double square_root(double x) { return std::sqrt(x); }
RowReduction mean_of(double (*value)(const AttentionRow&)) {
  return {RowReduction::Kind::RatioOfSums, value, &one, nullptr, 0};
}
RowReduction quantile_of(double (*value)(const AttentionRow&), double q) {
  return {RowReduction::Kind::Quantile, value, nullptr, nullptr, q};
}
RowReduction sqrt_ratio_of(double (*num)(const AttentionRow&), double (*den)(const AttentionRow&)) {
  return {RowReduction::Kind::RatioOfSums, num, den, &square_root, 0};
}
// A reduction whose numerator is an additive per-row error named `error` (AdditiveError).
RowReduction additive(RowReduction r, const char* error) {
  r.additive_error = error;
  return r;
}

double k_rel_mse(const ErrorStats& s) { return ratio(s.k_err2, s.k_norm2); }
double v_rel_mse(const ErrorStats& s) { return ratio(s.v_err2, s.v_norm2); }
double k_snr(const ErrorStats& s) { return snr_db(s.k_err2, s.k_norm2); }
double v_snr(const ErrorStats& s) { return snr_db(s.v_err2, s.v_norm2); }
double logit_rmse(const ErrorStats& s) {
  double sum = 0;
  for (const AttentionRow& r : s.rows) sum += r.logit_err2;
  return s.logit_pairs ? std::sqrt(sum / static_cast<double>(s.logit_pairs)) : 0.0;
}
double logit_max(const ErrorStats& s) {
  double m = 0;
  for (const AttentionRow& r : s.rows) m = std::max(m, static_cast<double>(r.logit_err_max));
  return m;
}
double kl_mean(const ErrorStats& s) { return mean_rows(s, kl); }
double kl_p99(const ErrorStats& s) { return quantile(per_row(s, kl), 0.99); }
double kl_max(const ErrorStats& s) { return max_rows(s, kl); }
double topk(const ErrorStats& s) { return mean_rows(s, [](const AttentionRow& r) { return double(r.topk_overlap); }); }
double out_rel_mean(const ErrorStats& s) { return mean_rows(s, out_rel); }
double out_rel_p99(const ErrorStats& s) { return quantile(per_row(s, out_rel), 0.99); }
double out_rel_total(const ErrorStats& s) {
  double e = 0, n = 0;
  for (const AttentionRow& r : s.rows) {
    e += r.out_err2;
    n += r.out_norm2;
  }
  return n > 0 ? std::sqrt(e / n) : 0.0;
}

// Model level (ErrorStats::model). NaN when the point has no model results.
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
double ppl(const ErrorStats& s) { return perplexity(s.model.nll); }
double ppl_ratio(const ErrorStats& s) {
  const ModelStats& m = s.model;
  if (!m.has_positions()) return kNaN;
  double diff = 0;  // exp(mean(nll) - mean(nll_base)) = PPL / PPL_base
  for (size_t i = 0; i < m.nll.size(); ++i) diff += m.nll[i] - m.nll_base[i];
  return std::exp(diff / static_cast<double>(m.nll.size()));
}
double token_kl_mean(const ErrorStats& s) { return s.model.has_positions() ? mean(s.model.kl) : kNaN; }
double token_kl_median(const ErrorStats& s) { return s.model.has_positions() ? quantile(s.model.kl, 0.5) : kNaN; }
double token_kl_p99(const ErrorStats& s) { return s.model.has_positions() ? quantile(s.model.kl, 0.99) : kNaN; }
double token_kl_max(const ErrorStats& s) { return s.model.has_positions() ? max_of(s.model.kl) : kNaN; }
double same_top(const ErrorStats& s) {
  if (!s.model.has_positions()) return kNaN;
  double same = 0;
  for (uint8_t v : s.model.same_top) same += v;
  return same / static_cast<double>(s.model.same_top.size());
}
// Standard errors (llama.cpp's perplexity tool, methods.md §4 "Uncertainty"); NaN
// without model results or with fewer than 2 positions.
double ppl_se(const ErrorStats& s) {  // delta method: d exp(m) = exp(m) dm
  return s.model.has_positions() ? ppl(s) * standard_error_of_mean(s.model.nll) : kNaN;
}
double ppl_ratio_se(const ErrorStats& s) {  // ratio · SE of ln(ratio) = mean(nll − nll_base)
  const ModelStats& m = s.model;
  if (!m.has_positions()) return kNaN;
  std::vector<double> diff(m.nll.size());
  for (size_t i = 0; i < m.nll.size(); ++i) diff[i] = m.nll[i] - m.nll_base[i];
  return ppl_ratio(s) * standard_error_of_mean(diff);
}
double token_kl_mean_se(const ErrorStats& s) {
  return s.model.has_positions() ? standard_error_of_mean(s.model.kl) : kNaN;
}
double same_top_se(const ErrorStats& s) {  // binomial, n − 1 as llama.cpp: sqrt(p(1 − p) / (n − 1))
  const double n = static_cast<double>(s.model.same_top.size());
  if (n < 2) return kNaN;
  const double p = same_top(s);
  return std::sqrt(p * (1 - p) / (n - 1));
}
// ln(PPL / PPL_base) = mean(nll − nll_base); its SE is llama.cpp's
// sqrt(SE(nll)² + SE(nll_base)² − 2 cov), which equals the SE of the mean of the differences.
double ln_ppl_ratio(const ErrorStats& s) {
  const double r = ppl_ratio(s);
  return std::isnan(r) ? kNaN : std::log(r);
}
double ln_ppl_ratio_se(const ErrorStats& s) {
  const ModelStats& m = s.model;
  if (!m.has_positions()) return kNaN;
  std::vector<double> diff(m.nll.size());
  for (size_t i = 0; i < m.nll.size(); ++i) diff[i] = m.nll[i] - m.nll_base[i];
  return standard_error_of_mean(diff);
}
double ppl_base(const ErrorStats& s) { return perplexity(s.model.nll_base); }
double ppl_base_se(const ErrorStats& s) {
  return s.model.has_positions() ? ppl_base(s) * standard_error_of_mean(s.model.nll_base) : kNaN;
}
// Sums of the products of nll's and nll_base's deviations from their means (two passes).
struct NllDeviations {
  double aa = 0, bb = 0, ab = 0;
};
NllDeviations nll_deviations(const ModelStats& m) {
  const double a = mean(m.nll), b = mean(m.nll_base);
  NllDeviations d;
  for (size_t i = 0; i < m.nll.size(); ++i) {
    const double da = m.nll[i] - a, db = m.nll_base[i] - b;
    d.aa += da * da;
    d.bb += db * db;
    d.ab += da * db;
  }
  return d;
}
// llama.cpp's Cor(ln(PPL(Q)), ln(PPL(base))), the covariance of the mean NLLs over the
// product of their SEs: Pearson's correlation of nll and nll_base.
double ln_ppl_correlation(const ErrorStats& s) {
  if (s.model.nll.size() < 2) return kNaN;
  const NllDeviations d = nll_deviations(s.model);
  return d.ab / std::sqrt(d.aa * d.bb);
}
// PPL − PPL_base; SE as llama.cpp: sqrt(SE² + SE_base² − 2 PPL PPL_base cov), with
// SE = PPL · SE(mean nll) and cov = Σ (a − ā)(b − b̄) / (n (n − 1)) the covariance of the
// mean NLLs, written over one denominator so that identical runs give exactly 0.
double ppl_diff(const ErrorStats& s) { return s.model.has_positions() ? ppl(s) - ppl_base(s) : kNaN; }
double ppl_diff_se(const ErrorStats& s) {
  const size_t n = s.model.nll.size();
  if (n < 2) return kNaN;
  const NllDeviations d = nll_deviations(s.model);
  const double q = ppl(s), b = ppl_base(s);
  const double var = (q * q * d.aa + b * b * d.bb - 2 * q * b * d.ab) /
                     (static_cast<double>(n) * static_cast<double>(n - 1));
  return var < 0 ? 0.0 : std::sqrt(var);
}
template <int Permille>
double token_kl_quantile(const ErrorStats& s) {
  return s.model.has_positions() ? quantile(s.model.kl, Permille / 1000.0) : kNaN;
}
// Δp = p_quantized(next token) − p_exact(next token) per position (llama.cpp's
// "token probability statistics").
std::vector<double> delta_p(const ModelStats& m) {
  std::vector<double> d(m.nll.size());
  for (size_t i = 0; i < m.nll.size(); ++i) d[i] = std::exp(-m.nll[i]) - std::exp(-m.nll_base[i]);
  return d;
}
double delta_p_mean(const ErrorStats& s) { return s.model.has_positions() ? mean(delta_p(s.model)) : kNaN; }
double delta_p_mean_se(const ErrorStats& s) {
  return s.model.has_positions() ? standard_error_of_mean(delta_p(s.model)) : kNaN;
}
template <int Permille>
double delta_p_quantile(const ErrorStats& s) {
  return s.model.has_positions() ? quantile(delta_p(s.model), Permille / 1000.0) : kNaN;
}
// RMS of Δp, SE by the delta method as llama.cpp: SE(mean Δp²) / (2 RMS).
double delta_p_rms(const ErrorStats& s) {
  if (!s.model.has_positions()) return kNaN;
  double sum = 0;
  for (double d : delta_p(s.model)) sum += d * d;
  return std::sqrt(sum / static_cast<double>(s.model.nll.size()));
}
double delta_p_rms_se(const ErrorStats& s) {
  if (!s.model.has_positions()) return kNaN;
  std::vector<double> squares = delta_p(s.model);
  for (double& d : squares) d *= d;
  return 0.5 / delta_p_rms(s) * standard_error_of_mean(squares);
}
double gen_match(const ErrorStats& s) {
  return s.model.has_continuations() ? token_match_rate(s.model.continuations, s.model.continuations_base) : kNaN;
}
double gen_bleu(const ErrorStats& s) {
  return s.model.has_continuations() ? corpus_bleu4(s.model.continuations, s.model.continuations_base) : kNaN;
}
double gen_bleu_research(const ErrorStats& s) {
  return s.model.has_continuations() ? research_bleu4(s.model.continuations, s.model.continuations_base) : kNaN;
}

// Answer task: NaN without one.
double answer_accuracy(const ErrorStats& s) {
  if (!s.model.has_answers()) return kNaN;
  double right = 0;
  for (uint8_t v : s.model.answers_correct) right += v;
  return right / static_cast<double>(s.model.answers_correct.size());
}
Interval answer_accuracy_interval(const ErrorStats& s) {
  int64_t right = 0;
  for (uint8_t v : s.model.answers_correct) right += v;
  return wilson_interval(right, static_cast<int64_t>(s.model.answers_correct.size()), 0.95);
}
// Problems answered right with the exact cache and wrong with the quantized one
// (right_to_wrong), or the other way round.
double answer_flips(const ErrorStats& s, bool right_to_wrong) {
  const ModelStats& m = s.model;
  if (!m.has_answers()) return kNaN;
  if (m.answers_correct.size() != m.answers_correct_base.size())
    throw Error("internal: " + std::to_string(m.answers_correct.size()) + " quantized answers but " +
                std::to_string(m.answers_correct_base.size()) + " exact ones");
  double flips = 0;
  for (size_t i = 0; i < m.answers_correct.size(); ++i)
    flips += (right_to_wrong ? m.answers_correct_base[i] && !m.answers_correct[i]
                             : !m.answers_correct_base[i] && m.answers_correct[i])
                 ? 1
                 : 0;
  return flips;
}
double flips_right_to_wrong(const ErrorStats& s) { return answer_flips(s, true); }
double flips_wrong_to_right(const ErrorStats& s) { return answer_flips(s, false); }

// A detailed statistic of llama.cpp's report: in the table, not in a default report.
MetricDef detail_metric(std::string name, std::string unit, std::string quantity, std::string description, Better better,
                        double (*compute)(const ErrorStats&), double (*standard_error)(const ErrorStats&) = nullptr) {
  MetricDef m{std::move(name),     std::move(unit), std::move(quantity), std::move(description), better,
              MetricLevel::Model, compute,         standard_error};
  m.in_default_report = false;
  return m;
}

MetricDef task_metric(std::string name, std::string unit, std::string quantity, std::string description, Better better,
                      double (*compute)(const ErrorStats&), Interval (*interval)(const ErrorStats&) = nullptr,
                      SampleReduction samples = {}) {
  MetricDef m{std::move(name), std::move(unit), std::move(quantity), std::move(description), better, MetricLevel::Model,
              compute};
  m.needs_task = true;
  m.interval = interval;
  m.samples = samples;
  return m;
}

// A model metric that is finish(mean of a per-position value), with its standard error.
MetricDef position_mean_metric(std::string name, std::string unit, std::string quantity, std::string description,
                               Better better, double (*compute)(const ErrorStats&),
                               double (*standard_error)(const ErrorStats&), double (*value)(const ModelStats&, size_t),
                               double (*finish)(double) = nullptr) {
  MetricDef m{std::move(name),     std::move(unit), std::move(quantity), std::move(description), better,
              MetricLevel::Model, compute,         standard_error};
  m.samples = {SampleReduction::Unit::Positions, value, finish};
  return m;
}

// Per-sample values of the model metrics (SampleReduction).
double nll_at(const ModelStats& m, size_t i) { return m.nll[i]; }
double nll_excess_at(const ModelStats& m, size_t i) { return m.nll[i] - m.nll_base[i]; }
double kl_at(const ModelStats& m, size_t i) { return m.kl[i]; }
double same_top_at(const ModelStats& m, size_t i) { return m.same_top[i]; }
double answer_correct_at(const ModelStats& m, size_t i) { return m.answers_correct[i]; }
double exponential(double x) { return std::exp(x); }

}  // namespace

const std::vector<MetricDef>& metric_table() {
  using B = Better;
  using L = MetricLevel;
  static const std::vector<MetricDef> table = {
      {"k_rel_mse", "", "key relative MSE", "relative MSE of the stored keys ||K - K̂||² / ||K||² (segment formats, all tokens; windows not included)", B::Lower, L::Tensor, &k_rel_mse},
      {"v_rel_mse", "", "value relative MSE", "relative MSE of the stored values ||V - V̂||² / ||V||² (segment formats, all tokens; windows not included)", B::Lower, L::Tensor, &v_rel_mse},
      {"k_snr_db", "dB", "key SNR", "key signal-to-noise ratio 10 log10(||K||² / ||K - K̂||²) of the stored keys", B::Higher, L::Tensor, &k_snr},
      {"v_snr_db", "dB", "value SNR", "value signal-to-noise ratio of the stored values", B::Higher, L::Tensor, &v_snr},
      {"logit_rmse", "", "attention logit error, RMS", "RMS of ŝ - s over causal (t, j) of the evaluated rows, s = q·k/√d", B::Lower, L::Attention,
       &logit_rmse, nullptr, additive(sqrt_ratio_of(&logit_err2_of, &logit_pairs_of), "logit_err2")},
      {"logit_err_max", "", "attention logit error, max", "max |ŝ - s| over causal (t, j) of the evaluated rows", B::Lower, L::Attention,
       &logit_max, nullptr, quantile_of(&logit_err_max_of, 1.0)},
      {"attn_kl_mean", "nats", "attention KL, mean", "mean over (layer, head, t) of KL(p || p̂)", B::Lower, L::Attention, &kl_mean,
       nullptr, additive(mean_of(&kl), "kl")},
      {"attn_kl_p99", "nats", "attention KL, 99th percentile", "99th percentile of KL(p || p̂)", B::Lower, L::Attention, &kl_p99, nullptr,
       quantile_of(&kl, 0.99)},
      {"attn_kl_max", "nats", "attention KL, max", "max of KL(p || p̂)", B::Lower, L::Attention, &kl_max, nullptr, quantile_of(&kl, 1.0)},
      {"topk_overlap", "", "top-k attention overlap, fraction of k", "mean |topk(p) ∩ topk(p̂)| / k over evaluated rows (k = metrics.topk, at most t + 1 keys)",
       B::Higher, L::Attention, &topk, nullptr, mean_of(&topk_of)},
      {"attn_out_rel_err", "", "attention-output relative error, mean", "mean over (layer, head, t) of ||o - ô|| / ||o||, o = softmax(s)·v", B::Lower,
       L::Attention, &out_rel_mean, nullptr, additive(mean_of(&out_rel), "out_rel")},
      {"attn_out_rel_err_p99", "", "attention-output relative error, 99th percentile", "99th percentile of ||o - ô|| / ||o||", B::Lower, L::Attention, &out_rel_p99,
       nullptr, quantile_of(&out_rel, 0.99)},
      {"attn_out_rel_fro", "", "attention-output relative error, Frobenius", "sqrt(sum ||o - ô||² / sum ||o||²) over all rows", B::Lower, L::Attention,
       &out_rel_total, nullptr, additive(sqrt_ratio_of(&out_err2_of, &out_norm2_of), "out_err2")},
      position_mean_metric("ppl", "", "perplexity",
                           "perplexity exp(mean NLL) of the next token, teacher-forced, quantized cache", B::Lower, &ppl,
                           &ppl_se, &nll_at, &exponential),
      position_mean_metric("ppl_ratio", "", "perplexity ratio, quantized / exact",
                           "PPL with the quantized cache / PPL with the exact cache", B::Lower, &ppl_ratio,
                           &ppl_ratio_se, &nll_excess_at, &exponential),
      position_mean_metric("next_token_kl_mean", "nats", "next-token KL, mean",
                           "mean over positions of KL(p_base || p_quantized) of the next token", B::Lower,
                           &token_kl_mean, &token_kl_mean_se, &kl_at),
      {"next_token_kl_median", "nats", "next-token KL, median", "median of the next-token KL", B::Lower, L::Model, &token_kl_median},
      {"next_token_kl_p99", "nats", "next-token KL, 99th percentile", "99th percentile of the next-token KL", B::Lower, L::Model, &token_kl_p99},
      {"next_token_kl_max", "nats", "next-token KL, max", "max of the next-token KL", B::Lower, L::Model, &token_kl_max},
      position_mean_metric("same_top_rate", "", "same top-1 token, fraction of positions",
                           "fraction of positions where the quantized and exact argmax tokens agree", B::Higher,
                           &same_top, &same_top_se, &same_top_at),
      detail_metric("ppl_base", "", "perplexity, exact cache", "perplexity with the exact cache on the same positions", B::Lower, &ppl_base,
                    &ppl_base_se),
      detail_metric("ln_ppl_ratio", "", "ln perplexity ratio, quantized / exact", "ln(PPL(quantized) / PPL(exact)) = mean(nll - nll_base) (llama.cpp's report)",
                    B::Lower, &ln_ppl_ratio, &ln_ppl_ratio_se),
      detail_metric("ppl_diff", "", "perplexity difference, quantized − exact", "PPL(quantized) − PPL(exact) on the same positions (llama.cpp's report)",
                    B::Lower, &ppl_diff, &ppl_diff_se),
      detail_metric("ln_ppl_correlation", "", "correlation of the per-position NLLs, quantized and exact",
                    "Pearson correlation of nll and nll_base over the positions: llama.cpp's Cor(ln(PPL(Q)), ln(PPL(base)))",
                    B::Higher, &ln_ppl_correlation),
      detail_metric("next_token_kl_p99_9", "nats", "next-token KL, 99.9th percentile", "99.9th percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<999>),
      detail_metric("next_token_kl_p95", "nats", "next-token KL, 95th percentile", "95th percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<950>),
      detail_metric("next_token_kl_p90", "nats", "next-token KL, 90th percentile", "90th percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<900>),
      detail_metric("next_token_kl_p10", "nats", "next-token KL, 10th percentile", "10th percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<100>),
      detail_metric("next_token_kl_p5", "nats", "next-token KL, 5th percentile", "5th percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<50>),
      detail_metric("next_token_kl_p1", "nats", "next-token KL, 1st percentile", "1st percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<10>),
      detail_metric("next_token_kl_p0_1", "nats", "next-token KL, 0.1th percentile", "0.1th percentile of the next-token KL", B::Lower,
                    &token_kl_quantile<1>),
      detail_metric("next_token_kl_min", "nats", "next-token KL, min", "min of the next-token KL", B::Lower,
                    &token_kl_quantile<0>),
      detail_metric("delta_p_mean", "", "Δp of the next token, mean",
                    "mean over positions of Δp = p_quantized(next token) - p_exact(next token)", B::Higher,
                    &delta_p_mean, &delta_p_mean_se),
      detail_metric("delta_p_rms", "", "Δp of the next token, RMS", "root mean square of Δp", B::Lower, &delta_p_rms, &delta_p_rms_se),
      detail_metric("delta_p_max", "", "Δp of the next token, max", "max of Δp", B::Higher, &delta_p_quantile<1000>),
      detail_metric("delta_p_p99_9", "", "Δp of the next token, 99.9th percentile", "99.9th percentile of Δp", B::Higher, &delta_p_quantile<999>),
      detail_metric("delta_p_p99", "", "Δp of the next token, 99th percentile", "99th percentile of Δp", B::Higher, &delta_p_quantile<990>),
      detail_metric("delta_p_p95", "", "Δp of the next token, 95th percentile", "95th percentile of Δp", B::Higher, &delta_p_quantile<950>),
      detail_metric("delta_p_p90", "", "Δp of the next token, 90th percentile", "90th percentile of Δp", B::Higher, &delta_p_quantile<900>),
      detail_metric("delta_p_p75", "", "Δp of the next token, 75th percentile", "75th percentile of Δp", B::Higher, &delta_p_quantile<750>),
      detail_metric("delta_p_median", "", "Δp of the next token, median", "median of Δp", B::Higher, &delta_p_quantile<500>),
      detail_metric("delta_p_p25", "", "Δp of the next token, 25th percentile", "25th percentile of Δp", B::Higher, &delta_p_quantile<250>),
      detail_metric("delta_p_p10", "", "Δp of the next token, 10th percentile", "10th percentile of Δp", B::Higher, &delta_p_quantile<100>),
      detail_metric("delta_p_p5", "", "Δp of the next token, 5th percentile", "5th percentile of Δp", B::Higher, &delta_p_quantile<50>),
      detail_metric("delta_p_p1", "", "Δp of the next token, 1st percentile", "1st percentile of Δp", B::Higher, &delta_p_quantile<10>),
      detail_metric("delta_p_p0_1", "", "Δp of the next token, 0.1th percentile", "0.1th percentile of Δp", B::Higher, &delta_p_quantile<1>),
      detail_metric("delta_p_min", "", "Δp of the next token, min", "min of Δp (the largest drop of the correct token's probability)", B::Higher,
                    &delta_p_quantile<0>),
      {"gen_token_match", "", "greedy continuation token match, fraction", "greedy continuations: fraction of tokens equal to the exact model's at the same index",
       B::Higher, L::Model, &gen_match, nullptr, {}, true},
      {"gen_bleu4", "", "greedy continuation BLEU-4 (corpus)", "greedy continuations: corpus BLEU-4 on token ids against the exact model's", B::Higher,
       L::Model, &gen_bleu, nullptr, {}, true, 4},
      {"gen_bleu4_research", "", "greedy continuation BLEU-4 (per sequence, research variant)",
       "greedy continuations: per-sequence BLEU-4, orders without matches dropped, averaged (the research's variant)",
       B::Higher, L::Model, &gen_bleu_research, nullptr, {}, true},
      task_metric("answer_accuracy", "", "answer accuracy, fraction of problems",
                  "answer task: fraction of problems whose greedily generated answer equals the expected one "
                  "(quantized cache); _lo/_hi: 95 % Wilson score interval over problems",
                  B::Higher, &answer_accuracy, &answer_accuracy_interval,
                  {SampleReduction::Unit::Problems, &answer_correct_at, nullptr}),
      task_metric("flips_right_to_wrong", "problems", "answers flipped right to wrong",
                  "answer task: problems answered right with the exact cache and wrong with the quantized one",
                  B::Lower, &flips_right_to_wrong),
      task_metric("flips_wrong_to_right", "problems", "answers flipped wrong to right",
                  "answer task: problems answered wrong with the exact cache and right with the quantized one",
                  B::Higher, &flips_wrong_to_right),
  };
  return table;
}

double AdditiveError::sum(const std::vector<AttentionRow>& rows) const {
  double total = 0;
  for (const AttentionRow& r : rows) total += of_row(r);
  return total;
}

const std::vector<AdditiveError>& additive_errors() {
  static const std::vector<AdditiveError> errors = [] {
    std::vector<AdditiveError> e;
    for (const MetricDef& m : metric_table()) {
      if (!m.rows.additive_error) continue;
      if (m.rows.kind != RowReduction::Kind::RatioOfSums || m.better != Better::Lower)
        throw Error("internal: metric '" + m.name + "' names an additive error but is no lower-is-better sum over rows");
      e.push_back({m.rows.additive_error, &m, m.rows.numerator});
    }
    return e;
  }();
  return errors;
}

const AdditiveError* find_additive_error(std::string_view metric) {
  for (const AdditiveError& e : additive_errors())
    if (e.metric->name == metric) return &e;
  return nullptr;
}

const AdditiveError& require_additive_error(std::string_view metric, const std::string& where) {
  if (const AdditiveError* e = find_additive_error(metric)) return *e;
  std::vector<std::string> names;
  for (const AdditiveError& e : additive_errors()) names.push_back(e.metric->name);
  std::string msg = where + ": '" + std::string(metric) + "' is not an additive attention metric";
  msg += did_you_mean(metric, names);
  msg += "; additive metrics: " + join(names, ", ");
  throw ConfigError(msg);
}

const MetricDef* find_metric(std::string_view name) {
  for (const MetricDef& m : metric_table())
    if (m.name == name) return &m;
  return nullptr;
}

const MetricDef& require_metric(std::string_view name, const std::string& where) {
  if (const MetricDef* m = find_metric(name)) return *m;
  std::vector<std::string> names;
  for (const MetricDef& m : metric_table()) names.push_back(m.name);
  std::string msg = where + ": unknown metric '" + std::string(name) + "'";
  msg += did_you_mean(name, names);
  msg += "; known metrics: " + join(names, ", ");
  throw ConfigError(msg);
}

const char* level_name(MetricLevel l) {
  switch (l) {
    case MetricLevel::Tensor: return "tensor";
    case MetricLevel::Attention: return "attention";
    default: return "model";
  }
}

std::string metric_axis_label(const MetricDef& m) {
  return m.quantity + " (" + (m.unit.empty() ? "" : m.unit + ", ") +
         (m.better == Better::Lower ? "lower" : "higher") + " is better)";
}

double standard_error_of_mean(const std::vector<double>& values) {
  const size_t n = values.size();
  if (n < 2) return kNaN;
  const double m = mean(values);
  double squares = 0;
  for (double x : values) squares += (x - m) * (x - m);
  return std::sqrt(squares / static_cast<double>(n) / static_cast<double>(n - 1));
}

double quantile(std::vector<double> v, double q) { return quantile_in_place(v, q); }

double quantile_in_place(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  // NaN has no order: a quantile of values holding one is NaN, like their mean.
  if (std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); })) return std::nan("");
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(lo), v.end());
  const double a = v[lo];
  double b = a;
  if (hi != lo) b = *std::min_element(v.begin() + static_cast<long>(lo) + 1, v.end());
  return a + (pos - static_cast<double>(lo)) * (b - a);
}

}  // namespace kvb
