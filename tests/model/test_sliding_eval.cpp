// Model-level evaluation of sliding-window models past their window (issue 21):
// the exact run against a plain reference, a quantized cache whose effect on a sliding
// layer ends W tokens later, what a sliding layer's cache holds (memory), strategies
// that calibrate on the queries before W, and what stays refused (recording files).
// The checkpoints are tiny random-weight ones written by the test.
#include <cmath>
#include <cstring>
#include <random>

#include "experiments/query_positions.h"
#include "io_test_files.h"
#include "model_test_files.h"
#include "sim/formats/registry.h"
#include "sim/model/layer_selection.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"
#include "sim/strategies/statistics.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;
using Values = std::map<std::string, ParamValue>;

namespace {

constexpr int64_t kWindow = 8, kTokens = 32;

// Every layer sliding over the last kWindow tokens (Mistral), or sliding, full,
// sliding (a Ministral hybrid).
struct SlidingModel {
  TinyLlamaOptions options;
  TinyCheckpoint checkpoint;
  std::shared_ptr<const Transformer> model;
};

SlidingModel sliding_model(bool hybrid) {
  SlidingModel m;
  m.options.architecture = hybrid ? "MinistralForCausalLM" : "MistralForCausalLM";
  m.options.layers = hybrid ? 3 : 2;
  m.checkpoint = tiny_llama(m.options);
  m.checkpoint.config["rope_theta"] = 10000.0;
  m.checkpoint.config["sliding_window"] = kWindow;
  if (hybrid) m.checkpoint.config["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  m.model = Transformer::load(m.checkpoint.write(scratch_dir("model_sliding_eval") / (hybrid ? "hybrid" : "mistral")));
  return m;
}

bool rows_identical(const RowMatrix& a, const RowMatrix& b, int64_t row) {
  return std::memcmp(a.row(row).data(), b.row(row).data(), sizeof(float) * static_cast<size_t>(a.cols())) == 0;
}

}  // namespace

TEST_CASE("sliding-window model past W: the exact run's NLL is a plain reference's, the recording carries the windows") {
  const SlidingModel m = sliding_model(true);
  const std::vector<int64_t> tokens = some_tokens(kTokens, m.options.vocab, 3);
  const ModelEvaluator ev(m.model, tokens, ContinuationSpec{2, 4, 6}, "sliding");
  // The reference: per-layer windows {8, 0, 8}, in double precision, log-softmax by hand.
  const auto ref = reference_llama(m.checkpoint, m.options, llama_inv_freq(10000.0, m.options.head_dim),
                                   {kWindow, 0, kWindow}, tokens);
  const std::vector<double> nll = ev.base_scored_nll();
  REQUIRE(nll.size() == static_cast<size_t>(kTokens - 1));
  double ref_sum = 0, sum = 0;
  for (int64_t t = 0; t + 1 < kTokens; ++t) {
    const std::vector<double>& row = ref[static_cast<size_t>(t)];
    double top = row.front();
    for (double v : row) top = std::max(top, v);
    double z = 0;
    for (double v : row) z += std::exp(v - top);
    const double want = -(row[static_cast<size_t>(tokens[static_cast<size_t>(t + 1)])] - top - std::log(z));
    CAPTURE(t);
    CHECK(nll[static_cast<size_t>(t)] == doctest::Approx(want).epsilon(1e-5));
    ref_sum += want;
    sum += nll[static_cast<size_t>(t)];
  }
  CHECK(std::exp(sum / (kTokens - 1)) == doctest::Approx(std::exp(ref_sum / (kTokens - 1))).epsilon(1e-6));
  // The recording holds the model's tensors with its windows: full causal attention is
  // the model's for the queries before W only.
  const Recording& rec = ev.recording();
  CHECK(rec.tokens == kTokens);
  CHECK(rec.attention_windows == std::vector<int64_t>{kWindow, 0, kWindow});
  CHECK(rec.full_causal_queries() == kWindow);
  // The exact cache through a lossless plan is the exact run.
  Plan lossless(3, m.options.kv_heads, kTokens, m.options.head_dim);
  lossless.assign_all(Kind::Key, make_format("keep-fp32"));
  lossless.assign_all(Kind::Value, make_format("keep-fp32"));
  const ModelStats s = ev.evaluate(lossless, 0);
  CHECK(s.nll == s.nll_base);
  CHECK(s.continuations == s.continuations_base);
}

TEST_CASE("a quantized cache past W: a sliding layer's quantized tokens stop mattering W tokens later") {
  // Every layer slides over 8 tokens. Tokens 0..3 at int2, the rest exact: layer 0's
  // queries t >= 4 + 7 no longer see them, layer 1's queries t >= 4 + 2 * 7 no longer
  // see a layer-0 output that did; from there on the logits are the exact run's, bit
  // for bit, and before it they are not.
  const SlidingModel m = sliding_model(false);
  const int64_t L = m.options.layers, G = m.options.kv_heads, d = m.options.head_dim, quantized = 4;
  const std::vector<int64_t> tokens = some_tokens(kTokens, m.options.vocab, 4);
  const ModelEvaluator ev(m.model, tokens, ContinuationSpec{}, "sliding");
  Plan plan(L, G, kTokens, d);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < G; ++g)
      for (Kind kind : {Kind::Key, Kind::Value})
        plan.unit(l, g, kind).segments = {Segment{0, quantized, make_format("int2-asym-g8")},
                                          Segment{quantized, kTokens, make_format("keep-fp32")}};
  REQUIRE(plan.check().empty());
  RowMatrix logits;
  const ModelStats s = ev.evaluate(plan, 0, &logits);
  const int64_t unaffected = quantized + L * (kWindow - 1);
  for (int64_t t = 0; t < kTokens; ++t) {
    CAPTURE(t);
    CHECK(rows_identical(logits, ev.base_logits(), t) == (t >= unaffected));
  }
  // The statistics come from those logits: NLL and KL differ before, vanish after.
  REQUIRE(s.kl.size() == static_cast<size_t>(kTokens - 1));
  CHECK(s.kl[0] > 0);
  CHECK(s.kl[static_cast<size_t>(unaffected)] == 0);
  CHECK(s.nll[static_cast<size_t>(unaffected)] == s.nll_base[static_cast<size_t>(unaffected)]);
}

TEST_CASE("memory of a sliding layer: its cache holds the last W tokens, never more") {
  const int64_t L = 3, G = 2, d = 8, T = kTokens;
  const FormatPtr int4 = make_format("int4-asym-g8"), fp16 = make_format("keep-fp16");
  Plan plan(L, G, T, d);
  plan.assign_all(Kind::Key, int4);
  plan.assign_all(Kind::Value, int4);
  const uint64_t dense_bits = plan.storage_bits();
  CHECK(dense_bits == static_cast<uint64_t>(L * G * 2) * int4->storage_bits(T, d));
  plan.set_attention_windows({kWindow, 0, kWindow});
  // Two sliding layers hold 8 tokens, the full one all 32.
  const uint64_t bits = 2 * G * 2 * int4->storage_bits(kWindow, d) + G * 2 * int4->storage_bits(T, d);
  CHECK(plan.storage_bits() == bits);
  CHECK(plan.bytes_at(T) == doctest::Approx(static_cast<double>(bits) / 8));
  CHECK(plan.bpe() == doctest::Approx(static_cast<double>(bits) / static_cast<double>(G * 2 * d * (2 * kWindow + T))));
  // Within the window nothing changes; at a longer target context only the full layer grows.
  CHECK(plan.storage_bits_at(kWindow) == static_cast<uint64_t>(L * G * 2) * int4->storage_bits(kWindow, d));
  CHECK(plan.storage_bits_at(4096) ==
        2 * G * 2 * int4->storage_bits(kWindow, d) + G * 2 * int4->storage_bits(4096, d));
  CHECK(plan.held_tokens(0, 4096) == kWindow);
  CHECK(plan.held_tokens(1, 4096) == 4096);
  CHECK(plan.describe() == "K:int4-asym-g8 V:int4-asym-g8 sliding:W8(layers 0,2)");
  // A recency window larger than W holds W tokens: a 16-token fp16 window over 8-token
  // sliding layers leaves nothing of those layers at int4.
  Plan windowed = plan;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < G; ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) windowed.unit(l, g, kind).window = RecentWindow{16, fp16};
  const uint64_t full_layer = static_cast<uint64_t>(G * 2) * (int4->storage_bits(T - 16, d) + fp16->storage_bits(16, d));
  CHECK(windowed.storage_bits() == 2 * G * 2 * fp16->storage_bits(kWindow, d) + full_layer);
  // Sink tokens beyond the window are not held: the first 4 tokens at fp16 cost nothing
  // on a sliding layer at T = 32.
  Plan sinks = plan;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < G; ++g)
      for (Kind kind : {Kind::Key, Kind::Value})
        sinks.unit(l, g, kind).segments = {Segment{0, 4, fp16, SegmentRole::SinkToken}, Segment{4, T, int4}};
  CHECK(sinks.storage_bits() == 2 * G * 2 * int4->storage_bits(kWindow, d) +
                                    static_cast<uint64_t>(G * 2) * (fp16->storage_bits(4, d) + int4->storage_bits(T - 4, d)));
  CHECK_THROWS_AS(plan.set_attention_windows({kWindow, 0}), Error);
}

TEST_CASE("strategies on a sliding model past W: the plan carries the windows, statistics come from queries before W") {
  const SlidingModel m = sliding_model(true);
  const std::vector<int64_t> tokens = some_tokens(kTokens, m.options.vocab, 5);
  const ModelEvaluator ev(m.model, tokens, ContinuationSpec{}, "sliding");
  const Recording& rec = ev.recording();
  // A fixed format: memory counts what each layer holds.
  RecordingStats stats(rec, {3, 7, 15, 23});
  CHECK(stats.calibration() == std::vector<int64_t>{3, 7});
  CHECK(stats.calibration_outside_window() == 2);
  const Plan uniform = build_plan("uniform", {{"format", std::string("int4-asym-g8")}}, rec, stats);
  CHECK(uniform.attention_windows() == rec.attention_windows);
  const FormatPtr int4 = make_format("int4-asym-g8");
  const int64_t G = m.options.kv_heads, d = m.options.head_dim;
  CHECK(uniform.storage_bits() ==
        2 * G * 2 * int4->storage_bits(kWindow, d) + G * 2 * int4->storage_bits(kTokens, d));
  // An allocating strategy reads entropies measured on the queries before W: the same
  // as a recording of those positions alone would give.
  RecordingStats before_window(rec, {3, 7});
  const auto& ent = stats.head_entropies();
  const auto& want = before_window.head_entropies();
  for (size_t l = 0; l < ent.size(); ++l)
    for (size_t h = 0; h < ent[l].size(); ++h) CHECK(ent[l][h].mean.shannon == want[l][h].mean.shannon);
  const Values entropy = {{"budget_bpe", 8.0}, {"family", std::string("int{b}-asym-g8")}};
  const Plan allocated = build_plan("entropy", entropy, rec, stats);
  CHECK(allocated.describe() == build_plan("entropy", entropy, rec, before_window).describe());
  // ... and runs through the model past W.
  const ModelStats s = ev.evaluate(allocated, 0);
  CHECK(s.nll.size() == static_cast<size_t>(kTokens - 1));
  for (double v : s.kl) CHECK(std::isfinite(v));
  // The CLI's plan: every 8th position from 7 calibrates, those at or beyond W are left out.
  const std::unique_ptr<Strategy> strat = require_strategy_type("entropy", "test").make(params_of("entropy", entropy));
  const CalibratedPlan built = build_calibrated_plan(*strat, rec, 0, "test");
  CHECK(built.positions.calibration == std::vector<int64_t>{7, 15, 23, 31});
  CHECK(built.calibration_beyond_window == 3);
  CHECK(built.plan.describe() == allocated.describe());
  // No calibration position below W: the error names W.
  RecordingStats none(rec, {15, 23});
  CHECK(has(error_of([&] { (void)build_plan("entropy", entropy, rec, none); }),
            "the model slides over the last W = 8 tokens and none of the 2 calibration positions lies below W"));
}

TEST_CASE("recording files of a sliding model past W stay refused; evaluation is not") {
  const SlidingModel m = sliding_model(false);
  const std::vector<int64_t> tokens = some_tokens(kWindow + 1, m.options.vocab, 4);
  const std::string msg = error_of([&] { (void)record_exact_run(*m.model, tokens, "ck", "ids"); });
  CHECK(has(msg, "mistral: layer 0 uses sliding-window attention over the last W = 8 tokens"));
  CHECK(has(msg, "9 tokens are recorded"));
  CHECK(has(msg, "record at most 8 tokens (--max-tokens)"));
  CHECK_NOTHROW((void)ModelEvaluator(m.model, tokens, ContinuationSpec{}, "test"));
  // Within the window a recording file is the model's.
  const std::vector<int64_t> short_tokens(tokens.begin(), tokens.begin() + kWindow);
  CHECK(record_exact_run(*m.model, short_tokens, "ck", "ids").recording.tokens == kWindow);
}
