// The sampler of `kvbudget generate` (sim/model/sampling.h): determinism, greedy as
// its limits (temperature 0, top-k 1), the truncated distribution of a known logit
// vector and the frequencies drawn from it, the shared random stream, and generation
// on a tiny checkpoint (any thread count, a lossless plan equal to the exact cache).
#include <omp.h>

#include <cmath>
#include <map>

#include "io_test_files.h"
#include "model_test_files.h"
#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/model/model_eval.h"
#include "sim/model/sampling.h"
#include "sim/model/transformer.h"
#include "sim/strategies/uniform.h"

using namespace kvb;
using namespace kvb::test;

namespace {

// Logits log(p) of a distribution p (ids 2 and 3 tie).
const std::vector<double> kProbs = {0.5, 0.25, 0.125, 0.125};
std::vector<float> known_logits() {
  std::vector<float> l;
  for (double p : kProbs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

SamplingSpec spec_of(double temperature, int64_t top_k = 0, double top_p = 1.0, uint64_t seed = 0) {
  SamplingSpec s;
  s.temperature = temperature;
  s.top_k = top_k;
  s.top_p = top_p;
  s.seed = seed;
  return s;
}

// Frequencies of each id over `draws` steps.
std::map<int64_t, double> frequencies(const std::vector<float>& logits, const SamplingSpec& spec, int64_t draws) {
  std::map<int64_t, double> f;
  for (int64_t step = 0; step < draws; ++step) f[sample_token(logits, spec, step)] += 1.0 / static_cast<double>(draws);
  return f;
}

// Each frequency within 5 binomial standard deviations of its probability, and no
// token drawn outside the distribution.
void check_frequencies(const std::map<int64_t, double>& freq, const TokenDistribution& d, int64_t draws) {
  std::map<int64_t, double> want;
  for (size_t i = 0; i < d.ids.size(); ++i) want[d.ids[i]] = d.probs[i];
  for (const auto& [id, f] : freq) CHECK_MESSAGE(want.count(id) == 1, "token " << id << " drawn outside the distribution");
  for (const auto& [id, p] : want) {
    const double sd = std::sqrt(p * (1 - p) / static_cast<double>(draws));
    const double got = freq.count(id) ? freq.at(id) : 0.0;
    CHECK_MESSAGE(std::fabs(got - p) <= 5 * sd + 1e-12, "token " << id << ": frequency " << got << ", probability " << p);
  }
}

std::vector<int64_t> some_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids;
  for (float x : random_normal(static_cast<size_t>(n), seed)) ids.push_back(static_cast<int64_t>(std::fabs(x) * 1000) % vocab);
  return ids;
}

}  // namespace

TEST_CASE("sampling: the same logits, seed and step give the same token; another seed another stream") {
  const std::vector<float> logits = random_normal(50, 3);
  const SamplingSpec spec = spec_of(1.0, 0, 1.0, 7);
  std::vector<int64_t> first, second, other_seed;
  for (int64_t step = 0; step < 200; ++step) {
    first.push_back(sample_token(logits, spec, step));
    second.push_back(sample_token(logits, spec, step));
    other_seed.push_back(sample_token(logits, spec_of(1.0, 0, 1.0, 8), step));
  }
  CHECK(first == second);
  CHECK(first != other_seed);
  // The step's uniform depends on (seed, step) alone, in [0, 1).
  double sum = 0;
  for (int64_t step = 0; step < 4000; ++step) {
    const double u = sampling_uniform(7, step);
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
    sum += u;
  }
  CHECK(std::fabs(sum / 4000 - 0.5) < 5 * std::sqrt(1.0 / 12 / 4000));
  CHECK(sampling_uniform(7, 11) == sampling_uniform(7, 11));
  CHECK(sampling_uniform(7, 11) != sampling_uniform(7, 12));
}

TEST_CASE("sampling: temperature 0 and top-k 1 are greedy (argmax, first on ties), whatever the seed") {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = random_normal(64, 100 + seed);
    if (seed % 2) logits[40] = logits[9] = 10.0f;  // a tie for the maximum: the lower id wins
    const int64_t best = argmax(logits.data(), 64);
    for (int64_t step = 0; step < 10; ++step) {
      CHECK(sample_token(logits, spec_of(0.0, 0, 1.0, seed), step) == best);
      CHECK(sample_token(logits, spec_of(1.5, 1, 1.0, seed), step) == best);
      CHECK(sample_token(logits, spec_of(0.0, 5, 0.3, seed), step) == best);
    }
    const TokenDistribution d = sampling_distribution(logits, spec_of(0.0, 0, 1.0, seed));
    CHECK(d.ids == std::vector<int64_t>{best});
    CHECK(d.probs == std::vector<double>{1.0});
    // The sorted candidates start with the argmax (the lower id first on ties), so top-k 1 truncation agrees.
    CHECK(sampling_distribution(logits, spec_of(1.0, 2)).ids[0] == best);
  }
  CHECK(spec_of(0.0).greedy());
  CHECK(spec_of(2.0, 1).greedy());
  CHECK_FALSE(spec_of(0.5).greedy());
}

TEST_CASE("sampling: the distribution of a known logit vector, truncated, and the frequencies drawn from it") {
  const std::vector<float> logits = known_logits();
  const int64_t draws = 20000;
  SUBCASE("temperature 1: p itself, most likely first, the lower id first on ties") {
    const TokenDistribution d = sampling_distribution(logits, spec_of(1.0));
    CHECK(d.ids == std::vector<int64_t>{0, 1, 2, 3});
    for (size_t i = 0; i < kProbs.size(); ++i) CHECK(d.probs[i] == doctest::Approx(kProbs[i]).epsilon(1e-6));
    check_frequencies(frequencies(logits, spec_of(1.0, 0, 1.0, 5), draws), d, draws);
  }
  SUBCASE("temperature 2: p^(1/2), renormalized") {
    const TokenDistribution d = sampling_distribution(logits, spec_of(2.0));
    double z = 0;
    for (double p : kProbs) z += std::sqrt(p);
    for (size_t i = 0; i < kProbs.size(); ++i) CHECK(d.probs[i] == doctest::Approx(std::sqrt(kProbs[i]) / z).epsilon(1e-6));
    check_frequencies(frequencies(logits, spec_of(2.0, 0, 1.0, 6), draws), d, draws);
  }
  SUBCASE("top-k 2: the two most likely, renormalized") {
    const TokenDistribution d = sampling_distribution(logits, spec_of(1.0, 2));
    CHECK(d.ids == std::vector<int64_t>{0, 1});
    CHECK(d.probs[0] == doctest::Approx(2.0 / 3).epsilon(1e-6));
    CHECK(d.probs[1] == doctest::Approx(1.0 / 3).epsilon(1e-6));
    check_frequencies(frequencies(logits, spec_of(1.0, 2, 1.0, 7), draws), d, draws);
  }
  SUBCASE("top-p: the fewest most likely tokens whose probability reaches p") {
    CHECK(sampling_distribution(logits, spec_of(1.0, 0, 0.45)).ids == std::vector<int64_t>{0});
    const TokenDistribution d = sampling_distribution(logits, spec_of(1.0, 0, 0.7));
    CHECK(d.ids == std::vector<int64_t>{0, 1});
    CHECK(d.probs[0] == doctest::Approx(2.0 / 3).epsilon(1e-6));
    check_frequencies(frequencies(logits, spec_of(1.0, 0, 0.7, 8), draws), d, draws);
    CHECK(sampling_distribution(logits, spec_of(1.0, 0, 0.8)).ids == std::vector<int64_t>{0, 1, 2});
    // top-k first, then top-p within it.
    CHECK(sampling_distribution(logits, spec_of(1.0, 3, 0.9)).ids == std::vector<int64_t>{0, 1, 2});
  }
}

TEST_CASE("sampling: the same uniform picks the same token wherever the two distributions agree on it") {
  // A second distribution that moves probability from id 3 to id 2 only: steps whose
  // uniform falls in the first 0.75 (ids 0 and 1, unchanged) draw the same token.
  const std::vector<float> a = known_logits();
  std::vector<float> b = a;
  b[2] = static_cast<float>(std::log(0.2));
  b[3] = static_cast<float>(std::log(0.05));
  const SamplingSpec spec = spec_of(1.0, 0, 1.0, 9);
  int64_t unchanged = 0;
  for (int64_t step = 0; step < 2000; ++step) {
    const int64_t ta = sample_token(a, spec, step), tb = sample_token(b, spec, step);
    if (sampling_uniform(spec.seed, step) < 0.74) {
      CHECK(ta == tb);
      ++unchanged;
    }
  }
  CHECK(unchanged > 1000);
}

TEST_CASE("sampling: settings out of range are refused with the option's name") {
  CHECK_NOTHROW(spec_of(0.7, 40, 0.95).check());
  CHECK(has(error_of([] { spec_of(-1.0).check(); }), "--temperature"));
  CHECK(has(error_of([] { spec_of(std::nan("")).check(); }), "--temperature"));
  CHECK(has(error_of([] { spec_of(1.0, -2).check(); }), "--top-k"));
  CHECK(has(error_of([] { spec_of(1.0, 0, 0.0).check(); }), "--top-p"));
  CHECK(has(error_of([] { spec_of(1.0, 0, 1.5).check(); }), "--top-p"));
  CHECK(has(error_of([] { spec_of(0.0, 40).check(); }), "give --temperature > 0"));
  CHECK(has(error_of([] { spec_of(0.0, 0, 0.9).check(); }), "give --temperature > 0"));
  CHECK_NOTHROW(spec_of(0.0, 1).check());
  CHECK_THROWS_AS(spec_of(-1.0).check(), ConfigError);
  std::vector<float> bad = known_logits();
  bad[1] = std::nanf("");
  CHECK(has(error_of([&] { sampling_distribution(bad, spec_of(1.0)); }), "token 1"));
  CHECK(spec_of(0.0).describe() == "greedy");
  CHECK(spec_of(0.8, 40, 0.95, 3).describe() == "temperature 0.8, top-k 40, top-p 0.95, seed 3");
}

TEST_CASE("sampled generation: any thread count, greedy equals greedy_continuation, a lossless cache equals the exact one") {
  TinyLlamaOptions o;
  o.vocab = 40;
  TinyCheckpoint ck = tiny_llama(o);
  ck.config["rope_theta"] = 10000.0;
  ck.config["eos_token_id"] = 1;
  const auto model = Transformer::load(ck.write(scratch_dir("sampling_tiny_llama")));
  const std::vector<int64_t> prompt = some_ids(12, o.vocab, 21);
  const SamplingSpec sampled = spec_of(1.0, 0, 0.95, 4);

  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<int64_t> one = sample_continuation(*model, prompt, 24, {}, sampled);
  omp_set_num_threads(2);
  const std::vector<int64_t> two = sample_continuation(*model, prompt, 24, {}, sampled);
  omp_set_num_threads(saved);
  CHECK(one.size() == 24);
  CHECK(one == two);
  // Random weights give a flat distribution: sampling is not the argmax.
  CHECK(one != greedy_continuation(*model, prompt, 24, {}));
  CHECK(sample_continuation(*model, prompt, 24, {}, spec_of(0.0)) == greedy_continuation(*model, prompt, 24, {}));

  // keep-fp32 stores the cache bit for bit: with the same seed the quantized run
  // draws the same tokens, so a difference could only come from the cache.
  std::vector<LayerTensors> capture;
  ExtendOptions a;
  a.capture = &capture;
  model->forward(prompt, a);
  const Recording rec = recording_from_capture(model->config(), capture, prompt, "test");
  const Plan lossless = UniformStrategy(make_format("keep-fp32"), make_format("keep-fp32")).build({rec, 0});
  const Plan lossy = UniformStrategy(make_format("int2-asym-g8"), make_format("int2-asym-g8")).build({rec, 0});
  CacheQuantization q;
  q.plan = &lossless;
  CHECK(sample_continuation(*model, prompt, 24, q, sampled) == one);
  q.plan = &lossy;
  CHECK(sample_continuation(*model, prompt, 24, q, sampled) != one);

  // The stop callback ends a continuation (at EOS, as `generate` stops).
  const auto stop_at = [](int64_t id) {
    return [id](const std::vector<int64_t>& generated) { return generated.back() == id; };
  };
  const std::vector<int64_t> stopped = sample_continuation(*model, prompt, 24, {}, sampled, stop_at(one[5]));
  CHECK(stopped.size() <= 6);
  CHECK(stopped.back() == one[5]);
  CHECK(std::vector<int64_t>(one.begin(), one.begin() + static_cast<long>(stopped.size())) == stopped);
}
