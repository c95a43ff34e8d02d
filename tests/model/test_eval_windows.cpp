// Chunked evaluation (sim/model/model_eval.h, methods.md §4 "Windows"): the windows of
// a sequence, windowed evaluation against separate runs per window, the exact run's
// logits kept in a kl-base file and reused, and the standard errors of llama.cpp's
// report (sim/metrics/metric_table.cpp) against its own sums.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "io_test_files.h"
#include "model_test_files.h"
#include "sim/formats/registry.h"
#include "sim/io/tensor_store.h"
#include "sim/metrics/metric_table.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"
#include "sim/strategies/uniform.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

ModelEvalOptions windowed(int64_t n_ctx, ScoreRule score = ScoreRule::All, fs::path kl_base = {}) {
  ModelEvalOptions o;
  o.windows = WindowSpec{n_ctx, score};
  o.kl_base = std::move(kl_base);
  return o;
}

// llama.cpp's mean_and_uncertainty and covariance (tools/perplexity/perplexity.cpp)
// from running sums, as its KL-divergence report computes them.
std::pair<double, double> llama_mean_and_uncertainty(double sum, double sum2, double n) {
  const double f = sum / n, df = sum2 / n - f * f;
  return {f, df > 0 && n > 10 ? std::sqrt(df / (n - 1)) : 0.0};
}
double llama_covariance(double suma, double sumb, double sumab, double n) {
  return n < 10 ? 0.0 : (sumab / n - (suma / n) * (sumb / n)) / (n - 1);
}

}  // namespace

TEST_CASE("token_windows: consecutive windows of n_ctx tokens, the last shorter, a last lone token dropped") {
  const auto w = token_windows(10, 4);
  REQUIRE(w.size() == 3);
  CHECK(w[0].start == 0);
  CHECK(w[0].length == 4);
  CHECK(w[1].start == 4);
  CHECK(w[2].start == 8);
  CHECK(w[2].length == 2);
  CHECK(token_windows(9, 4).size() == 2);  // token 8 alone predicts nothing
  CHECK(token_windows(9, 0).size() == 1);
  CHECK(token_windows(9, 9).front().length == 9);
  CHECK(token_windows(9, 100).front().length == 9);
  CHECK_THROWS_AS(token_windows(9, 1), ConfigError);
  CHECK(WindowSpec{512, ScoreRule::SecondHalf}.first_scored() == 256);
  CHECK(WindowSpec{512, ScoreRule::All}.first_scored() == 0);
  CHECK(parse_score_rule("second_half", "x") == ScoreRule::SecondHalf);
  CHECK(error_of([] { (void)parse_score_rule("half", "--score"); }).find("--score") != std::string::npos);
}

TEST_CASE("the report's standard errors are llama.cpp's, computed from its running sums") {
  // 12 positions (llama.cpp reports no uncertainty for 10 or fewer).
  ErrorStats s;
  for (int i = 0; i < 12; ++i) {
    s.model.nll_base.push_back(0.5 + 0.25 * i);
    s.model.nll.push_back(0.5 + 0.25 * i + 0.1 * ((i * 7) % 5) - 0.05);
    s.model.kl.push_back(0.01 * ((i * 5) % 7));
    s.model.same_top.push_back(i % 4 == 0 ? 0 : 1);
  }
  double sum_nll = 0, sum_nll2 = 0, sum_base = 0, sum_base2 = 0, sum_cross = 0, sum_dp = 0, sum_dp2 = 0,
         sum_dp4 = 0;
  for (size_t i = 0; i < s.model.nll.size(); ++i) {
    const double a = s.model.nll[i], b = s.model.nll_base[i], dp = std::exp(-a) - std::exp(-b);
    sum_nll += a, sum_nll2 += a * a, sum_base += b, sum_base2 += b * b, sum_cross += a * b;
    sum_dp += dp, sum_dp2 += dp * dp, sum_dp4 += dp * dp * dp * dp;
  }
  const double n = 12;
  const auto log_ppl = llama_mean_and_uncertainty(sum_nll, sum_nll2, n);
  const auto log_ppl_base = llama_mean_and_uncertainty(sum_base, sum_base2, n);
  const double cov = llama_covariance(sum_nll, sum_base, sum_cross, n);
  const double ratio_unc = std::sqrt(log_ppl.second * log_ppl.second +
                                     log_ppl_base.second * log_ppl_base.second - 2 * cov);
  auto metric = [&](const char* name) { return find_metric(name)->compute(s); };
  auto se = [&](const char* name) { return find_metric(name)->standard_error(s); };
  CHECK(metric("ppl") == doctest::Approx(std::exp(log_ppl.first)).epsilon(1e-12));
  CHECK(se("ppl") == doctest::Approx(std::exp(log_ppl.first) * log_ppl.second).epsilon(1e-9));
  CHECK(se("ppl_base") == doctest::Approx(std::exp(log_ppl_base.first) * log_ppl_base.second).epsilon(1e-9));
  CHECK(metric("ln_ppl_ratio") == doctest::Approx(log_ppl.first - log_ppl_base.first).epsilon(1e-12));
  CHECK(se("ln_ppl_ratio") == doctest::Approx(ratio_unc).epsilon(1e-9));
  CHECK(se("ppl_ratio") == doctest::Approx(std::exp(log_ppl.first - log_ppl_base.first) * ratio_unc).epsilon(1e-9));
  const auto dp = llama_mean_and_uncertainty(sum_dp, sum_dp2, n);
  CHECK(metric("delta_p_mean") == doctest::Approx(dp.first).epsilon(1e-12));
  CHECK(se("delta_p_mean") == doctest::Approx(dp.second).epsilon(1e-9));
  const auto mse = llama_mean_and_uncertainty(sum_dp2, sum_dp4, n);
  CHECK(metric("delta_p_rms") == doctest::Approx(std::sqrt(mse.first)).epsilon(1e-12));
  CHECK(se("delta_p_rms") == doctest::Approx(0.5 / std::sqrt(mse.first) * mse.second).epsilon(1e-9));
  const double p_top = 9.0 / 12.0;
  CHECK(se("same_top_rate") == doctest::Approx(std::sqrt(p_top * (1 - p_top) / (n - 1))).epsilon(1e-12));
  // Percentiles interpolate linearly between order statistics, as llama.cpp's percentile().
  std::vector<double> sorted = s.model.kl;
  std::sort(sorted.begin(), sorted.end());
  const double at = 0.9 * 11;  // 9.9: between the 10th and 11th smallest
  CHECK(metric("next_token_kl_p90") == doctest::Approx(sorted[9] + (at - 9) * (sorted[10] - sorted[9])));
  CHECK(metric("next_token_kl_p1") == doctest::Approx(sorted[0] + 0.11 * (sorted[1] - sorted[0])));
  CHECK(metric("delta_p_min") <= metric("delta_p_p1"));
  CHECK(metric("delta_p_max") >= metric("delta_p_p99_9"));
}

TEST_CASE("windowed evaluation equals separate runs, one per window, with BOS at each window's start") {
  const auto model = fixture_model("llama-bytes");
  const std::vector<int64_t> ids = reference_ids("llama-bytes", 90);
  REQUIRE(ids.front() == *model->config().bos_token_id);
  const ModelEvaluator ev(model, ids, ContinuationSpec{}, "test", nullptr, windowed(40));
  REQUIRE(ev.windows().size() == 3);  // 40, 40, 10
  CHECK(ev.recording().tokens == 40);
  CHECK(ev.scored_positions().size() == 39 + 39 + 9);
  CHECK(std::isnan(ev.base_nll()[39]));  // position 39 ends the first window
  const Plan plan = uniform_plan(ev.recording(), "int4-asym-g32");
  RowMatrix logits;
  const ModelStats windowed_stats = ev.evaluate(plan, 0, &logits);
  ModelStats separate;
  for (const TokenWindow& w : ev.windows()) {
    std::vector<int64_t> part(ids.begin() + w.start, ids.begin() + w.start + w.length);
    part.front() = ids.front();  // BOS
    const ModelEvaluator one(model, part, ContinuationSpec{}, "test");
    RowMatrix part_logits;
    separate.merge(one.evaluate(plan, 0, &part_logits));
    CHECK(one.base_logits() == ev.base_logits().middleRows(w.start, w.length));
    CHECK(part_logits == logits.middleRows(w.start, w.length));
  }
  CHECK(windowed_stats.nll == separate.nll);
  CHECK(windowed_stats.nll_base == separate.nll_base);
  CHECK(windowed_stats.kl == separate.kl);
  CHECK(windowed_stats.same_top == separate.same_top);

  // llama.cpp's rule: positions 20..38 of each full window, 20..8 (none) of the last.
  const ModelEvaluator half(model, ids, ContinuationSpec{}, "test", nullptr, windowed(40, ScoreRule::SecondHalf));
  REQUIRE(half.scored_positions().size() == 19 + 19);
  CHECK(half.scored_positions().front() == 20);
  CHECK(half.scored_positions().back() == 40 + 38);
  const ModelStats half_stats = half.evaluate(plan, 0);
  CHECK(half_stats.kl.size() == 38);
  CHECK(half_stats.kl.front() == windowed_stats.kl[20]);
}

TEST_CASE("kl-base: written once, reused with identical numbers, refused for other tokens, windows or models") {
  const fs::path dir = scratch_dir("eval_kl_base");
  const fs::path file = dir / "base.safetensors";
  const auto model = fixture_model("llama-bytes");
  const std::vector<int64_t> ids = reference_ids("llama-bytes", 64);
  const ModelEvaluator fresh(model, ids, ContinuationSpec{}, "test", nullptr, windowed(32, ScoreRule::All, file));
  REQUIRE(fs::exists(file));
  CHECK_FALSE(fresh.kl_base_reused());
  const ModelEvaluator reused(model, ids, ContinuationSpec{}, "test", nullptr, windowed(32, ScoreRule::All, file));
  CHECK(reused.kl_base_reused());
  CHECK(reused.base_logits() == fresh.base_logits());
  const Plan plan = uniform_plan(fresh.recording(), "int4-asym-g32");
  ErrorStats a, b;
  a.model = fresh.evaluate(plan, 0);
  b.model = reused.evaluate(plan, 0);
  for (const char* name : {"ppl", "ppl_ratio", "next_token_kl_mean", "same_top_rate", "delta_p_mean"}) {
    CHECK(find_metric(name)->compute(a) == find_metric(name)->compute(b));
    CHECK(find_metric(name)->standard_error(a) == find_metric(name)->standard_error(b));
  }

  std::vector<int64_t> other = ids;
  other[17] = other[17] == 'a' ? 'b' : 'a';
  const std::string tokens_msg = error_of(
      [&] { (void)ModelEvaluator(model, other, ContinuationSpec{}, "test", nullptr, windowed(32, ScoreRule::All, file)); });
  CHECK(tokens_msg.find(file.string()) != std::string::npos);
  CHECK(tokens_msg.find("token 17") != std::string::npos);
  const std::string ctx_msg = error_of(
      [&] { (void)ModelEvaluator(model, ids, ContinuationSpec{}, "test", nullptr, windowed(16, ScoreRule::All, file)); });
  CHECK(ctx_msg.find("n_ctx = 32") != std::string::npos);
  const std::string model_msg = error_of([&] {
    (void)ModelEvaluator(fixture_model("gpt2-bytes"), ids, ContinuationSpec{}, "test", nullptr,
                         windowed(32, ScoreRule::All, file));
  });
  CHECK(model_msg.find("another shape") != std::string::npos);
  const std::string short_msg = error_of([&] {
    (void)ModelEvaluator(model, std::vector<int64_t>(ids.begin(), ids.begin() + 48), ContinuationSpec{}, "test",
                         nullptr, windowed(32, ScoreRule::All, file));
  });
  CHECK(short_msg.find("64 tokens") != std::string::npos);
}
