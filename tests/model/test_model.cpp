// The forward pass (sim/model/): parity with Hugging Face on the fixtures, the
// recorded tensors, exactness of lossless caches, generation against teacher forcing,
// every architecture option against a plain reference implementation, and errors.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>

#include "io_test_files.h"
#include "model_test_files.h"
#include "sim/core/half.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/io/recording_writer.h"
#include "sim/io/tensor_store.h"
#include "sim/metrics/metric_table.h"
#include "sim/model/model_eval.h"
#include "sim/model/rope_scaling.h"
#include "sim/model/transformer.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
#include "strategy_test_util.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

TEST_CASE("fixtures: logits match Hugging Face's reference to 1e-4 relative") {
  // Norm: for each position t, max_v |ours - ref| / max_v |ref|; the worst position
  // must be below 1e-4. The relative L2 error per row is reported beside it.
  // gpt2-bytes and llama-bytes: 512 tokens of Revelation, vocabulary 257; reasoning-bytes:
  // a 977-token think/answer trace, vocabulary 259 (<think> 257, </think> 258).
  for (const std::string name : {"gpt2-bytes", "llama-bytes", "reasoning-bytes"}) {
    CAPTURE(name);
    const auto ref = TensorStore::open(data_dir() / "reference" / (name + "-reference.safetensors"));
    const std::vector<int64_t> ids = ref->read_i64("input_ids");
    const Tensor want = ref->read_f32("logits");
    const Tensor want_nll = ref->read_f32("nll");
    const RowMatrix got = fixture_model(name)->forward(ids);
    REQUIRE(got.rows() == static_cast<int64_t>(ids.size()));
    REQUIRE(want.shape == std::vector<int64_t>{got.rows(), got.cols()});
    CHECK(got.cols() == (name == "reasoning-bytes" ? 259 : 257));
    double worst_max = 0, worst_l2 = 0;
    for (int64_t t = 0; t < got.rows(); ++t) {
      double diff = 0, scale = 0, e2 = 0, n2 = 0;
      for (int64_t v = 0; v < got.cols(); ++v) {
        const double r = want.data[static_cast<size_t>(t * got.cols() + v)], o = got(t, v);
        diff = std::max(diff, std::fabs(o - r));
        scale = std::max(scale, std::fabs(r));
        e2 += (o - r) * (o - r);
        n2 += r * r;
      }
      worst_max = std::max(worst_max, diff / scale);
      worst_l2 = std::max(worst_l2, std::sqrt(e2 / n2));
    }
    MESSAGE(name << ": worst max|d|/max|ref| per position " << worst_max << ", worst relative L2 per row " << worst_l2);
    CHECK(worst_max < 1e-4);
    CHECK(worst_l2 < 1e-4);
    // NLL of the next token, positions 0..T-2 (gpt2/llama-bytes' references hold a
    // 512th that targets a byte beyond the window).
    const std::vector<double> nll = next_token_nll(got, ids);
    REQUIRE(nll.size() == ids.size() - 1);
    REQUIRE(want_nll.data.size() >= nll.size());
    double worst_nll = 0;
    for (size_t t = 0; t < nll.size(); ++t) worst_nll = std::max(worst_nll, std::fabs(nll[t] - want_nll.data[t]));
    CHECK(worst_nll < 1e-4);
  }
}

TEST_CASE("record_exact_run: the capture's recording, named, with the exact run's next-token NLL") {
  const std::shared_ptr<const Transformer> model = fixture_model("gpt2-bytes");
  const std::vector<int64_t> all = reference_ids("gpt2-bytes");
  const std::vector<int64_t> ids(all.begin(), all.begin() + 48);
  const RecordedRun run = record_exact_run(*model, ids, "ckpt", "text.txt");
  std::vector<LayerTensors> capture;
  ExtendOptions opt;
  opt.capture = &capture;
  const RowMatrix logits = model->forward(ids, opt);
  const Recording want = recording_from_capture(model->config(), capture, ids, "x");
  REQUIRE(run.recording.num_layers() == want.num_layers());
  CHECK(run.recording.tokens == 48);
  CHECK(run.recording.layers[1].key.data == want.layers[1].key.data);
  CHECK(run.recording.source == "model ckpt on 48 tokens of text.txt");
  CHECK(run.nll == next_token_nll(logits, ids));
  REQUIRE(run.nll.size() == 47);
  double mean = 0;
  for (double v : run.nll) mean += v / 47.0;
  CHECK(run.mean_nll == mean);
  CHECK(run.recording.metadata.at("text") == "text.txt");
  CHECK(run.recording.metadata.at("nll_mean") == format_double(mean));
  CHECK(run.recording.metadata.count("bos") == (model->config().bos_token_id ? 1u : 0u));
}

TEST_CASE("fixtures: the captured q/k/v and attention outputs reproduce Hugging Face's recordings within fp16 rounding") {
  // data/reference/NAME-record-slice.safetensors: the first 128 tokens of Hugging Face's
  // recording, first and last layer, values as Hugging Face stored them (data/SOURCES.md).
  // Ours runs on the whole reference window; causal attention makes its first 128
  // positions those of a 128-token run.
  for (const std::string name : {"gpt2-bytes", "llama-bytes", "reasoning-bytes"}) {
    CAPTURE(name);
    const std::vector<int64_t> ids = reference_ids(name);
    std::vector<LayerTensors> capture;
    ExtendOptions opt;
    opt.capture = &capture;
    (void)fixture_model(name)->forward(ids, opt);
    const Recording ours = recording_from_capture(fixture_model(name)->config(), capture, ids, "test");
    RecordingSpec spec;
    spec.path = data_dir() / "reference" / (name + "-record-slice.safetensors");
    spec.layers = {0, static_cast<int>(ours.num_layers()) - 1};  // the slice's layers
    const Recording hf = load_recording(spec);
    Recording ours_prefix = ours;
    ours_prefix.truncate_tokens(hf.tokens);
    REQUIRE(hf.tokens == 128);
    REQUIRE(hf.layer_ids == std::vector<int>{0, static_cast<int>(ours.num_layers()) - 1});
    CHECK(hf.token_ids == std::vector<int64_t>(ids.begin(), ids.begin() + hf.tokens));
    REQUIRE(hf.has_pre_rope_keys() == ours.has_pre_rope_keys());
    // The recording stores HF's fp32 values rounded to fp16: each element is within
    // half an fp16 ulp (2^-11 relative, 2^-25 absolute below fp16's normal range) of
    // the fp32 value, plus the forward pass's own ~1e-5 relative difference.
    double worst = 0;
    auto compare = [&](const Tensor& a, const Tensor& b, const std::string& what) {
      REQUIRE(a.shape == b.shape);
      double absmax = 0;
      for (float v : b.data) absmax = std::max(absmax, static_cast<double>(std::fabs(v)));
      int64_t bad = 0;
      for (size_t i = 0; i < a.data.size(); ++i) {
        const double err = std::fabs(a.data[i] - b.data[i]);
        const double allowed = std::ldexp(std::fabs(b.data[i]), -11) + std::ldexp(1.0, -25) + 2e-5 * absmax;
        bad += err > allowed ? 1 : 0;
        worst = std::max(worst, err / absmax);
      }
      CHECK_MESSAGE(bad == 0, what << ": " << bad << " elements beyond fp16 rounding");
    };
    for (size_t i = 0; i < hf.layer_ids.size(); ++i) {
      const LayerTensors &a = ours_prefix.layers[static_cast<size_t>(hf.layer_ids[i])], &b = hf.layers[i];
      const std::string L = "layer " + std::to_string(hf.layer_ids[i]) + " ";
      compare(a.query, b.query, L + "query");
      compare(a.key, b.key, L + "key");
      compare(a.value, b.value, L + "value");
      compare(a.attn_output, b.attn_output, L + "attn_output");
      if (hf.has_pre_rope_keys()) compare(a.key_pre_rope, b.key_pre_rope, L + "key_pre_rope");
    }
    MESSAGE(name << ": worst |ours - recorded| / max|recorded| " << worst);

    // Written as F16 and read back by the loader, the recording keeps its layout.
    const fs::path file = scratch_dir("model_record_" + name) / "rec.safetensors";
    write_recording(file, ours, DType::F16, {{"text", "test"}});
    RecordingSpec back;
    back.path = file;
    const Recording reread = load_recording(back);
    CHECK(reread.token_ids == ids);
    CHECK(reread.rope.applied == ours.rope.applied);
    CHECK(reread.has_attn_output());
    const LayerTensors& last = ours.layers.back();
    for (size_t i = 0; i < last.key.data.size(); ++i)
      REQUIRE(reread.layers.back().key.data[i] == round_to_f16(last.key.data[i]));
  }
}

TEST_CASE("lossless caches: keep-fp32 is bit-exact; keep-fp16 changes PPL only by rounding") {
  const std::vector<int64_t> ids = reference_ids("llama-bytes");
  const ModelEvaluator ev(fixture_model("llama-bytes"), ids, ContinuationSpec{}, "test");
  const double base_ppl = perplexity(ev.base_nll());
  MESSAGE("llama-bytes exact PPL " << base_ppl);
  RowMatrix logits;
  ErrorStats fp32;
  fp32.model = ev.evaluate(uniform_plan(ev.recording(), "keep-fp32"), 0, &logits);
  CHECK(logits == ev.base_logits());
  CHECK(find_metric("ppl_ratio")->compute(fp32) == 1.0);
  CHECK(find_metric("next_token_kl_max")->compute(fp32) == 0.0);
  CHECK(find_metric("same_top_rate")->compute(fp32) == 1.0);

  ErrorStats fp16;
  fp16.model = ev.evaluate(uniform_plan(ev.recording(), "keep-fp16"), 0);
  const double ratio = find_metric("ppl_ratio")->compute(fp16);
  MESSAGE("keep-fp16 PPL ratio " << ratio << ", next-token KL mean " << find_metric("next_token_kl_mean")->compute(fp16));
  CHECK(std::fabs(ratio - 1.0) < 1e-4);
  CHECK(find_metric("next_token_kl_mean")->compute(fp16) < 1e-5);

  // A 2-bit cache is visibly worse, and more bits are better.
  ErrorStats int2, int8;
  int2.model = ev.evaluate(uniform_plan(ev.recording(), "int2-asym-g32"), 0);
  int8.model = ev.evaluate(uniform_plan(ev.recording(), "int8-asym-g32"), 0);
  CHECK(find_metric("ppl_ratio")->compute(int2) > 1.5);
  CHECK(find_metric("next_token_kl_mean")->compute(int2) > find_metric("next_token_kl_mean")->compute(int8));
  CHECK(find_metric("same_top_rate")->compute(int2) < find_metric("same_top_rate")->compute(int8));
}

TEST_CASE("quantization error propagates: layer 0's quantized cache changes layer 1's inputs") {
  const std::vector<int64_t> all = reference_ids("gpt2-bytes");
  const std::vector<int64_t> ids(all.begin(), all.begin() + 64);
  const auto model = fixture_model("gpt2-bytes");
  std::vector<LayerTensors> exact, quant;
  ExtendOptions a;
  a.capture = &exact;
  model->forward(ids, a);
  const Recording rec = recording_from_capture(model->config(), exact, ids, "test");
  // Only layer 0 is quantized (int2); every other unit keeps fp32.
  Plan plan = uniform_plan(rec, "keep-fp32");
  for (int64_t g = 0; g < rec.kv_heads; ++g)
    for (Kind k : {Kind::Key, Kind::Value}) plan.unit(0, g, k).segments = {Segment{0, 64, make_format("int2-asym-g32")}};
  ExtendOptions b;
  b.capture = &quant;
  b.cache.plan = &plan;
  model->forward(ids, b);
  // Captured keys are the exact ones computed from each layer's (perturbed) input.
  CHECK(quant[0].key.data == exact[0].key.data);
  CHECK(quant[0].attn_output.data != exact[0].attn_output.data);
  CHECK(quant[1].key.data != exact[1].key.data);
}

TEST_CASE("windows, prefill and segments: the model's attention equals the recording simulator's") {
  // Layer 0 of the quantized run reads the same q/k/v as the exact run, so its
  // attention-output error must be the one the recording simulator computes for
  // layer 0, query head by query head and position by position.
  const std::vector<int64_t> all = reference_ids("llama-bytes");
  const std::vector<int64_t> ids(all.begin(), all.begin() + 96);
  const auto model = fixture_model("llama-bytes");
  std::vector<LayerTensors> exact, quant;
  ExtendOptions a;
  a.capture = &exact;
  model->forward(ids, a);
  const Recording rec = recording_from_capture(model->config(), exact, ids, "test");
  const int64_t T = rec.tokens;
  struct Case {
    std::string name;
    int64_t prefill;
    RecentWindow key_window, value_window;
    std::string key_format = "int2-asym-g32";
  };
  const FormatPtr fp16 = make_format("keep-fp16"), fp32 = make_format("keep-fp32");
  const std::vector<Case> cases = {
      {"segments only", 0, {}, {}},
      {"prefill", 20, {}, {}},
      {"sliding K window, chunked extra-copy V window, prefill", 5,
       RecentWindow{8, fp16, RecentWindow::Mode::Sliding, false},
       RecentWindow{16, fp32, RecentWindow::Mode::Chunked, true}},
      {"keys quantized before RoPE", 0, {}, {}, "prerope:int2-asym-ch32"},
      {"QJL keys: logits from the score estimator", 0, {}, {}, "qjl-m128"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Plan plan(rec.num_layers(), rec.kv_heads, T, rec.head_dim);
    for (int64_t l = 0; l < rec.num_layers(); ++l)
      for (int64_t g = 0; g < rec.kv_heads; ++g)
        for (Kind k : {Kind::Key, Kind::Value}) {
          UnitPlan& u = plan.unit(l, g, k);
          u.segments = {Segment{0, 4, fp16}, Segment{4, T, make_format(k == Kind::Key ? c.key_format : "int3-sym-g16")}};
          u.window = k == Kind::Key ? c.key_window : c.value_window;
        }
    plan.set_prefill(c.prefill);
    REQUIRE(plan.check().empty());
    ExtendOptions b;
    b.capture = &quant;
    b.cache.plan = &plan;
    model->forward(ids, b);
    const ErrorStats sim = simulate_layer(rec, plan, 0, SimOptions{});
    REQUIRE(sim.rows.size() == static_cast<size_t>(rec.q_heads * T));
    const int64_t d = rec.head_dim, width = rec.q_heads * d;
    double worst = 0;
    for (const AttentionRow& row : sim.rows) {
      double err2 = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double diff = quant[0].attn_output.data[row.position * width + row.q_head * d + i] -
                            exact[0].attn_output.data[row.position * width + row.q_head * d + i];
        err2 += diff * diff;
      }
      worst = std::max(worst, std::fabs(std::sqrt(err2) - std::sqrt(row.out_err2)) / std::sqrt(row.out_norm2));
      if (row.position < c.prefill) CHECK(err2 == 0.0);
    }
    MESSAGE(c.name << ": worst | ||Δo|| model - simulator | / ||o|| = " << worst);
    CHECK(worst < 1e-4);
  }

  // A window covering everything at fp32, or a prefill covering everything, is the exact model.
  Plan whole = uniform_plan(rec, "int2-asym-g32");
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < rec.kv_heads; ++g)
      for (Kind k : {Kind::Key, Kind::Value}) whole.unit(l, g, k).window = RecentWindow{T, fp32};
  const RowMatrix base = model->forward(ids);
  ExtendOptions w;
  w.cache.plan = &whole;
  CHECK(model->forward(ids, w) == base);
  Plan prompt = uniform_plan(rec, "int2-asym-g32");
  prompt.set_prefill(T);
  w.cache.plan = &prompt;
  CHECK(model->forward(ids, w) == base);
}

TEST_CASE("results do not depend on the thread count") {
  const std::vector<int64_t> ids = reference_ids("llama-bytes");
  const auto model = fixture_model("llama-bytes");
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const RowMatrix one = model->forward(ids);
  omp_set_num_threads(2);
  const RowMatrix two = model->forward(ids);
  omp_set_num_threads(saved);
  CHECK(one == two);
}

TEST_CASE("forward_into and extend_into: forward's and extend's logits, every value written") {
  const std::vector<int64_t> ids = reference_ids("gpt2-bytes");
  const auto model = fixture_model("gpt2-bytes");
  const RowMatrix full = model->forward(ids);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  RowMatrix into = RowMatrix::Constant(full.rows(), full.cols(), nan);
  model->forward_into(ids, {}, into.data());
  CHECK(into == full);
  // Without all_logits: extend's one row (the last token's), and nothing after it.
  ExtendOptions opt;
  opt.all_logits = false;
  Transformer::State state = model->new_state(), other = model->new_state();
  const RowMatrix one = model->extend(other, ids, opt);
  REQUIRE(one.rows() == 1);
  std::vector<float> last(static_cast<size_t>(2 * full.cols()), nan);
  model->extend_into(state, ids, opt, last.data());
  CHECK(std::equal(last.begin(), last.begin() + full.cols(), one.data()));
  CHECK(state.length == other.length);
  CHECK(std::all_of(last.begin() + full.cols(), last.end(), [](float v) { return std::isnan(v); }));
}

TEST_CASE("generation: token-by-token decoding reproduces teacher forcing") {
  const std::vector<int64_t> ids = reference_ids("llama-bytes");
  const auto model = fixture_model("llama-bytes");
  const RowMatrix full = model->forward(ids);
  // The first 100 tokens at once, then the next 20 one by one.
  Transformer::State state = model->new_state();
  ExtendOptions opt;
  opt.all_logits = false;
  RowMatrix step = model->extend(state, std::span<const int64_t>(ids.data(), 100), opt);
  double worst = 0;
  for (int64_t t = 100; t <= 120; ++t) {
    REQUIRE(step.rows() == 1);
    double diff = 0, scale = 0;
    for (int64_t v = 0; v < full.cols(); ++v) {
      diff = std::max(diff, static_cast<double>(std::fabs(step(0, v) - full(t - 1, v))));
      scale = std::max(scale, static_cast<double>(std::fabs(full(t - 1, v))));
    }
    worst = std::max(worst, diff / scale);
    if (t < 120) step = model->extend(state, std::span<const int64_t>(&ids[t], 1), opt);
  }
  CHECK(state.length == 120);
  CHECK(worst < 1e-5);

  // Greedy continuation: feeding prompt + continuation back, each generated token is
  // the argmax of the position before it.
  const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 200);
  const std::vector<int64_t> gen = greedy_continuation(*model, prompt, 16, {});
  REQUIRE(gen.size() == 16);
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  const RowMatrix again = model->forward(all);
  for (size_t i = 0; i < gen.size(); ++i) CHECK(argmax(again.row(199 + i).data(), again.cols()) == gen[i]);
}

TEST_CASE("greedy continuations apply a plan's prompt relative to their own prompt") {
  // A plan with a prompt (prefill P) quantizes what every generated token reads. A
  // continuation whose prompt p is shorter than P must not run under P (which would
  // leave every one of its tokens exact): it runs as the same plan with prefill p.
  const std::vector<int64_t> all = reference_ids("llama-bytes");
  const auto model = fixture_model("llama-bytes");
  const std::vector<int64_t> ids(all.begin(), all.begin() + 256);
  std::vector<LayerTensors> capture;
  ExtendOptions a;
  a.capture = &capture;
  model->forward(ids, a);
  const Recording rec = recording_from_capture(model->config(), capture, ids, "test");
  const int64_t p = 40, n = 12;
  const std::vector<int64_t> prompt(ids.begin(), ids.begin() + p);
  Plan long_prompt = uniform_plan(rec, "int1-sym-g32");
  long_prompt.set_prefill(200);
  Plan own_prompt = uniform_plan(rec, "int1-sym-g32");
  own_prompt.set_prefill(p);
  const std::vector<int64_t> exact = greedy_continuation(*model, prompt, n, {});
  const std::vector<int64_t> with_long = greedy_continuation(*model, prompt, n, CacheQuantization{&long_prompt, 0});
  const std::vector<int64_t> with_own = greedy_continuation(*model, prompt, n, CacheQuantization{&own_prompt, 0});
  CHECK(with_own != exact);  // int1 changes what is generated
  CHECK(with_long == with_own);
  // An explicit prefill is honoured: the whole continuation as prompt is exact.
  CacheQuantization everything_exact{&long_prompt, 0};
  everything_exact.prefill = p + n;
  CHECK(greedy_continuation(*model, prompt, n, everything_exact) == exact);
}

TEST_CASE("a plan shorter or longer than the cache follows Plan::unit_at") {
  Plan plan(1, 1, 10, 4);
  plan.unit(0, 0, Kind::Key).segments = {Segment{0, 2, make_format("keep-fp32")},
                                         Segment{2, 10, make_format("int4-asym-g4")}};
  plan.unit(0, 0, Kind::Value).segments = {Segment{0, 10, make_format("keep-fp16")}};
  const UnitPlan shorter = plan.unit_at(0, 0, Kind::Key, 5);
  REQUIRE(shorter.segments.size() == 2);
  CHECK(shorter.segments[1].begin == 2);
  CHECK(shorter.segments[1].end == 5);
  const UnitPlan one = plan.unit_at(0, 0, Kind::Key, 1);
  REQUIRE(one.segments.size() == 1);
  CHECK(one.segments[0].end == 1);
  const UnitPlan longer = plan.unit_at(0, 0, Kind::Key, 25);
  CHECK(longer.segments.back().end == 25);
  CHECK(plan.storage_bits_at(25) ==
        make_format("keep-fp32")->storage_bits(2, 4) + make_format("int4-asym-g4")->storage_bits(23, 4) +
            make_format("keep-fp16")->storage_bits(25, 4));
}

TEST_CASE("Llama family options against a plain reference forward pass") {
  const fs::path root = scratch_dir("model_tiny");
  const std::vector<int64_t> tokens = some_tokens(13, 23, 7);
  struct Case {
    std::string name;
    TinyLlamaOptions opt;
    nlohmann::json extra;
    std::vector<double> inv_freq;
    std::vector<int64_t> window;
  };
  TinyLlamaOptions llama;
  TinyLlamaOptions qwen;
  qwen.architecture = "Qwen2ForCausalLM";
  qwen.qkv_bias = true;
  qwen.tied = true;
  TinyLlamaOptions mistral;
  mistral.architecture = "MistralForCausalLM";
  mistral.kv_heads = 1;
  TinyLlamaOptions ministral;
  ministral.architecture = "MinistralForCausalLM";
  // llama3 scaling with a short original context so that every branch is taken.
  std::vector<double> l3 = llama_inv_freq(10000.0, 8);
  const double factor = 8, low = 1, high = 4, old_ctx = 64;
  for (double& f : l3) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen > old_ctx / low) f /= factor;
    else if (wavelen >= old_ctx / high) {
      const double s = (old_ctx / wavelen - low) / (high - low);
      f = (1 - s) * f / factor + s * f;
    }
  }
  std::vector<double> linear = llama_inv_freq(500.0, 8);
  for (double& f : linear) f /= 2.0;
  const std::vector<Case> cases = {
      {"llama GQA untied, rope_parameters", llama,
       {{"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}}, llama_inv_freq(10000.0, 8), {0, 0}},
      {"qwen2 q/k/v biases, tied, sliding window from layer 1", qwen,
       {{"rope_theta", 1000.0}, {"use_sliding_window", true}, {"sliding_window", 4}, {"max_window_layers", 1}},
       llama_inv_freq(1000.0, 8), {0, 4}},
      {"mistral sliding window, MQA", mistral, {{"rope_theta", 10000.0}, {"sliding_window", 3}},
       llama_inv_freq(10000.0, 8), {3, 3}},
      {"llama3 scaling (transformers 4 keys)", llama,
       {{"rope_theta", 10000.0},
        {"rope_scaling",
         {{"rope_type", "llama3"}, {"factor", factor}, {"low_freq_factor", low}, {"high_freq_factor", high},
          {"original_max_position_embeddings", 64}}}},
       l3, {0, 0}},
      {"linear scaling", llama, {{"rope_theta", 500.0}, {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}},
       linear, {0, 0}},
      {"ministral layer_types", ministral,
       {{"rope_theta", 10000.0}, {"sliding_window", 2}, {"layer_types", {"sliding_attention", "full_attention"}}},
       llama_inv_freq(10000.0, 8), {2, 0}},
  };
  int index = 0;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    TinyCheckpoint ck = tiny_llama(c.opt);
    ck.config.update(c.extra);
    const fs::path dir = ck.write(root / std::to_string(index++));
    const auto model = Transformer::load(dir);
    CHECK(model->config().sliding_window == c.window);
    const std::vector<float> got_freq = rope_inverse_frequencies(model->config().rope, 8);
    for (size_t i = 0; i < got_freq.size(); ++i) CHECK(got_freq[i] == doctest::Approx(c.inv_freq[i]).epsilon(1e-6));
    const RowMatrix got = model->forward(tokens);
    const auto want = reference_llama(ck, c.opt, c.inv_freq, c.window, tokens);
    CHECK(worst_relative_row_error(want, got.data(), got.cols()) < 1e-5);
  }
}

TEST_CASE("sliding-window models: recordings beyond W tokens are refused, naming the model and W") {
  // A recording file holds full causal attention; a Mistral layer attends to the last W
  // tokens only, so beyond W the file would misstate what the model attends to.
  // (Evaluation past W works: tests/model/test_sliding_eval.cpp.)
  TinyLlamaOptions mistral;
  mistral.architecture = "MistralForCausalLM";
  mistral.kv_heads = 1;
  TinyCheckpoint ck = tiny_llama(mistral);
  ck.config.update(nlohmann::json{{"rope_theta", 10000.0}, {"sliding_window", 6}});
  const auto model = Transformer::load(ck.write(scratch_dir("model_sliding_refused")));
  const std::vector<int64_t> tokens = some_tokens(9, mistral.vocab, 4);
  const std::string msg = error_of([&] { (void)record_exact_run(*model, tokens, "ck", "ids"); });
  CHECK(has(msg, "model_sliding_refused"));
  CHECK(has(msg, "W = 6"));
  CHECK(has(msg, "9 tokens are recorded"));
  // The in-memory recording of an evaluation carries the window instead.
  std::vector<LayerTensors> capture;
  ExtendOptions a;
  a.capture = &capture;
  model->forward(tokens, a);
  const Recording rec = recording_from_capture(model->config(), capture, tokens, "test");
  CHECK(rec.attention_windows == std::vector<int64_t>{6, 6});
  CHECK(rec.full_causal_queries() == 6);
  // Within the window the recording is exact.
  const std::vector<int64_t> short_tokens(tokens.begin(), tokens.begin() + 6);
  const ModelEvaluator ok(model, short_tokens, ContinuationSpec{}, "test");
  CHECK(ok.recording().tokens == 6);
  CHECK(ok.recording().full_causal_queries() == 6);
}

TEST_CASE("prerope formats rotate back with the model's own (scaled) RoPE frequencies") {
  // llama3 scaling: the frequencies are not theta's. prerope:keep-fp32 quantizes the
  // pre-RoPE keys losslessly and rotates them back, which must give the model's keys.
  TinyLlamaOptions o;
  TinyCheckpoint ck = tiny_llama(o);
  ck.config["rope_theta"] = 10000.0;
  ck.config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  const auto model = Transformer::load(ck.write(scratch_dir("model_prerope")));
  const std::vector<int64_t> tokens = some_tokens(40, o.vocab, 5);
  const RowMatrix exact = model->forward(tokens);
  Plan plan(o.layers, o.kv_heads, 40, o.head_dim);
  plan.assign_all(Kind::Key, make_format("prerope:keep-fp32"));
  plan.assign_all(Kind::Value, make_format("keep-fp32"));
  ExtendOptions opt;
  opt.cache.plan = &plan;
  const RowMatrix rotated_back = model->forward(tokens, opt);
  CHECK((rotated_back - exact).cwiseAbs().maxCoeff() < 1e-5 * exact.cwiseAbs().maxCoeff());
  // Generation reads the same context.
  const std::vector<int64_t> prompt(tokens.begin(), tokens.begin() + 20);
  CHECK(greedy_continuation(*model, prompt, 6, opt.cache) == greedy_continuation(*model, prompt, 6, {}));
  // The recording of this model carries the scaled frequencies, also through a file, so
  // the recording-level simulator rotates back with them too: lossless keys.
  const ModelEvaluator eval(model, tokens, ContinuationSpec{}, "scaled");
  const Recording& rec = eval.recording();
  CHECK(rec.rope.inv_freq == rope_inverse_frequencies(model->config().rope, o.head_dim));
  const fs::path file = scratch_dir("model_prerope") / "scaled-record.safetensors";
  write_recording(file, rec, DType::F32);
  RecordingSpec spec;
  spec.path = file;
  const Recording reread = load_recording(spec);
  CHECK(reread.rope.inv_freq == rec.rope.inv_freq);
  for (const Recording* r : {&rec, &reread}) {
    const ErrorStats stats = simulate(*r, plan, SimOptions{});
    CHECK(find_metric("k_rel_mse")->compute(stats) < 1e-12);
    CHECK(find_metric("attn_kl_max")->compute(stats) < 1e-9);
  }
  // A theta given by the config means unscaled RoPE: the file's frequencies are not used,
  // so the keys (rotated with the scaled ones) are refused, naming that cause.
  spec.rope_theta = 10000.0;
  const std::string unscaled = error_of([&] { load_recording(spec); });
  CHECK(has(unscaled, "layer 0: RoPE (theta 10000, positions 0..39) of the pre-RoPE keys does not give"));
  CHECK(has(unscaled, "[data] rope_theta overrides it and the file's scaled rope_inv_freq"));
  // A malformed rope_inv_freq is named.
  write_recording(file, rec, DType::F32, {{"rope_inv_freq", "0.5,x"}});
  spec.rope_theta.reset();
  CHECK(has(error_of([&] { load_recording(spec); }), "metadata rope_inv_freq: entry 1 is not a positive number"));
  // A model without RoPE has no pre-RoPE keys: a clear error.
  const auto gpt2 = fixture_model("gpt2-bytes");
  Plan gplan(6, 6, 8, 64);
  gplan.assign_all(Kind::Key, make_format("prerope:int4-asym-g32"));
  gplan.assign_all(Kind::Value, make_format("keep-fp16"));
  ExtendOptions g;
  g.cache.plan = &gplan;
  const std::string msg = error_of([&] { gpt2->forward(std::vector<int64_t>{256, 1, 2, 3, 4, 5, 6, 7}, g); });
  CHECK(has(msg, "layer 0 kv_head 0 K"));
  CHECK(has(msg, "recording 'gpt2-bytes' has no RoPE"));
}

TEST_CASE("F16 and BF16 checkpoints compute in fp32") {
  for (DType dt : {DType::F16, DType::BF16}) {
    CAPTURE(dtype_name(dt));
    TinyLlamaOptions o;
    TinyCheckpoint ck = tiny_llama(o);
    ck.config["rope_theta"] = 10000.0;
    for (auto& [name, v] : ck.values)
      for (float& x : v) x = dt == DType::F16 ? round_to_f16(x) : round_to_bf16(x);
    const fs::path dir = ck.write(scratch_dir(std::string("model_half_") + dtype_name(dt)), dt);
    CHECK(TensorStore::open(dir / "model.safetensors")->info("lm_head.weight").dtype == dt);
    const std::vector<int64_t> tokens = some_tokens(9, o.vocab, 3);
    const RowMatrix got = Transformer::load(dir)->forward(tokens);
    const auto want = reference_llama(ck, o, llama_inv_freq(10000.0, 8), {0, 0}, tokens);
    CHECK(worst_relative_row_error(want, got.data(), got.cols()) < 1e-5);
  }
}

TEST_CASE("GPT-2 against a plain reference: Conv1D [in, out], LayerNorm, gelu_new, learned positions") {
  const int64_t H = 16, heads = 2, d = 8, I = 40, V = 19, P = 12, L = 2;
  TinyCheckpoint ck;
  ck.config = {{"architectures", {"GPT2LMHeadModel"}}, {"n_embd", H}, {"n_head", heads}, {"n_layer", L},
               {"n_positions", P}, {"n_inner", I}, {"vocab_size", V}, {"layer_norm_epsilon", 1e-5},
               {"activation_function", "gelu_new"}};
  ck.add("transformer.wte.weight", {V, H}, 1.0f);
  ck.add("transformer.wpe.weight", {P, H}, 0.5f);
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    ck.add(b + "ln_1.weight", {H}, 0.1f, 1.0f);
    ck.add(b + "ln_1.bias", {H}, 0.1f);
    ck.add(b + "attn.c_attn.weight", {H, 3 * H}, 0.3f);
    ck.add(b + "attn.c_attn.bias", {3 * H}, 0.1f);
    ck.add(b + "attn.c_proj.weight", {H, H}, 0.3f);
    ck.add(b + "attn.c_proj.bias", {H}, 0.1f);
    ck.add(b + "ln_2.weight", {H}, 0.1f, 1.0f);
    ck.add(b + "ln_2.bias", {H}, 0.1f);
    ck.add(b + "mlp.c_fc.weight", {H, I}, 0.3f);
    ck.add(b + "mlp.c_fc.bias", {I}, 0.1f);
    ck.add(b + "mlp.c_proj.weight", {I, H}, 0.3f);
    ck.add(b + "mlp.c_proj.bias", {H}, 0.1f);
  }
  ck.add("transformer.ln_f.weight", {H}, 0.1f, 1.0f);
  ck.add("transformer.ln_f.bias", {H}, 0.1f);
  const fs::path dir = ck.write(scratch_dir("model_gpt2_tiny"));
  const std::vector<int64_t> tokens = some_tokens(P, V, 11);

  // Conv1D: y = x · W + b with W [in, out].
  auto conv = [&](const std::string& w, const std::vector<double>& x, int64_t out) {
    std::vector<double> y(ck.at(w.substr(0, w.size() - 6) + "bias").begin(), ck.at(w.substr(0, w.size() - 6) + "bias").end());
    for (int64_t o = 0; o < out; ++o)
      for (size_t i = 0; i < x.size(); ++i) y[o] += x[i] * ck.at(w)[i * out + o];
    return y;
  };
  auto ln = [&](const std::vector<double>& x, const std::string& p) {
    double mean = 0, var = 0;
    for (double v : x) mean += v / H;
    for (double v : x) var += (v - mean) * (v - mean) / H;
    std::vector<double> y(x.size());
    for (int64_t i = 0; i < H; ++i)
      y[i] = (x[i] - mean) / std::sqrt(var + 1e-5) * ck.at(p + ".weight")[i] + ck.at(p + ".bias")[i];
    return y;
  };
  const int64_t T = static_cast<int64_t>(tokens.size());
  std::vector<std::vector<double>> x(T, std::vector<double>(H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i)
      x[t][i] = ck.at("transformer.wte.weight")[tokens[t] * H + i] + ck.at("transformer.wpe.weight")[t * H + i];
  for (int64_t l = 0; l < L; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    std::vector<std::vector<double>> qkv;
    for (int64_t t = 0; t < T; ++t) qkv.push_back(conv(b + "attn.c_attn.weight", ln(x[t], b + "ln_1"), 3 * H));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> attn(H, 0.0);
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> s;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += qkv[t][h * d + i] * qkv[j][H + h * d + i];
          s.push_back(dot / std::sqrt(double(d)));
        }
        double mx = *std::max_element(s.begin(), s.end()), z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < d; ++i) attn[h * d + i] += s[j] / z * qkv[j][2 * H + h * d + i];
      }
      const std::vector<double> o = conv(b + "attn.c_proj.weight", attn, H);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> m = conv(b + "mlp.c_fc.weight", ln(x[t], b + "ln_2"), I);
      for (double& v : m) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      const std::vector<double> o = conv(b + "mlp.c_proj.weight", m, H);
      for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
    }
  }
  std::vector<std::vector<double>> want;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> h = ln(x[t], "transformer.ln_f");
    std::vector<double> row(V, 0.0);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t i = 0; i < H; ++i) row[v] += h[i] * ck.at("transformer.wte.weight")[v * H + i];
    want.push_back(row);
  }
  const auto model = Transformer::load(dir);
  const RowMatrix got = model->forward(tokens);
  CHECK(worst_relative_row_error(want, got.data(), got.cols()) < 1e-5);
  // Beyond the learned position table.
  const std::string msg = error_of([&] { model->forward(some_tokens(P + 1, V, 1)); });
  CHECK(has(msg, "13 tokens exceed the learned position table (n_positions 12"));
}

TEST_CASE("errors: architecture, config.json, weights and token ids are named") {
  const fs::path root = scratch_dir("model_errors");
  TinyLlamaOptions o;
  auto write = [&](const std::string& name, const std::function<void(TinyCheckpoint&)>& edit) {
    TinyCheckpoint ck = tiny_llama(o);
    edit(ck);
    return ck.write(root / name);
  };
  SUBCASE("unsupported architecture") {
    const fs::path dir = write("bert", [](TinyCheckpoint& c) { c.config["architectures"] = {"BertForMaskedLM"}; });
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, (dir / "config.json").string()));
    CHECK(has(msg, "key 'architectures'"));
    CHECK(has(msg, "unsupported architecture 'BertForMaskedLM'"));
    CHECK(has(msg, "LlamaForCausalLM"));
  }
  SUBCASE("model_type that is not the architecture's") {
    const fs::path dir = write("bert_type", [](TinyCheckpoint& c) { c.config["model_type"] = "bert"; });
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, (dir / "config.json").string()));
    CHECK(has(msg, "model_type 'bert' does not match architecture 'LlamaForCausalLM' (expected 'llama')"));
  }
  SUBCASE("missing weight") {
    const fs::path dir = write("missing", [](TinyCheckpoint& c) {
      c.values.erase("model.layers.1.mlp.up_proj.weight");
      c.shapes.erase("model.layers.1.mlp.up_proj.weight");
    });
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, (dir / "model.safetensors").string()));
    CHECK(has(msg, "missing weight 'model.layers.1.mlp.up_proj.weight' [48, 32]"));
  }
  SUBCASE("config.json with fewer layers than the weights, or absurdly many") {
    const fs::path dir = write("fewer_layers", [](TinyCheckpoint& c) {
      c.config["num_hidden_layers"] = c.config["num_hidden_layers"].get<int64_t>() - 1;
    });
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, (dir / "model.safetensors").string()));
    CHECK(has(msg, "belongs to layer 1, but " + (dir / "config.json").string() + " says num_hidden_layers = 1"));
    const fs::path huge = write("huge_layers", [](TinyCheckpoint& c) { c.config["num_hidden_layers"] = int64_t{1} << 40; });
    CHECK(has(error_of([&] { Transformer::load(huge); }), "key 'num_hidden_layers': 1099511627776 is more than"));
  }
  SUBCASE("a key repeated in config.json") {
    const fs::path dir = write("dup_key", [](TinyCheckpoint&) {});
    std::ifstream in(dir / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t open = text.find('{');
    text.insert(open + 1, "\"vocab_size\": 7, ");
    std::ofstream(dir / "config.json") << text;
    CHECK(has(error_of([&] { Transformer::load(dir); }), (dir / "config.json").string() + ": duplicate key 'vocab_size'"));
  }
  SUBCASE("weight with the wrong shape") {
    const fs::path dir = write("shape", [](TinyCheckpoint& c) { c.shapes["model.norm.weight"] = {2, 16}; });
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, "weight 'model.norm.weight' has shape [2, 16]"));
    CHECK(has(msg, "implies [32]"));
  }
  SUBCASE("NaN or Inf in a weight, after the last attention layer included") {
    // The final norm and lm_head feed no recording, so only a load-time check sees them.
    const fs::path dir = write("nan_norm", [](TinyCheckpoint& c) {
      c.values["model.norm.weight"][5] = std::numeric_limits<float>::quiet_NaN();
    });
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, (dir / "model.safetensors").string()));
    CHECK(has(msg, "weight 'model.norm.weight'[5] is NaN (shape [32]); weights must be finite"));
    for (const DType dt : {DType::BF16, DType::F16}) {
      CAPTURE(dtype_name(dt));
      TinyCheckpoint ck = tiny_llama(o);
      ck.values["lm_head.weight"][2 * 32 + 7] = -std::numeric_limits<float>::infinity();
      const fs::path d = ck.write(root / (std::string("inf_head_") + dtype_name(dt)), dt);
      CHECK(has(error_of([&] { Transformer::load(d); }), "weight 'lm_head.weight'[2, 7] is -Inf (shape [23, 32])"));
    }
    // An F16 checkpoint holding +Inf (as an fp32 1e6 becomes when another tool stores it
    // in F16; our writer refuses to overflow a finite value, so the Inf is written as is).
    TinyCheckpoint big = tiny_llama(o);
    big.values["model.layers.1.mlp.down_proj.weight"][3] = std::numeric_limits<float>::infinity();
    const fs::path d16 = big.write(root / "f16_overflow", DType::F16);
    CHECK(has(error_of([&] { Transformer::load(d16); }), "weight 'model.layers.1.mlp.down_proj.weight'[0, 3] is +Inf"));
  }
  SUBCASE("RoPE numbers that are not positive") {
    const fs::path d1 = write("rope_neg", [](TinyCheckpoint& c) {
      c.config["rope_parameters"] = {{"rope_theta", -1.0}, {"rope_type", "default"}};
    });
    CHECK(has(error_of([&] { Transformer::load(d1); }),
              (d1 / "config.json").string() + ": key 'rope_parameters.rope_theta': must be a finite number > 0, got -1"));
    const fs::path d2 = write("rope_zero", [](TinyCheckpoint& c) { c.config["rope_theta"] = 0.0; });
    CHECK(has(error_of([&] { Transformer::load(d2); }), "key 'rope_theta': must be a finite number > 0, got 0"));
    const fs::path d3 = write("rope_factor", [](TinyCheckpoint& c) {
      c.config["rope_theta"] = 10000.0;
      c.config["rope_scaling"] = {{"type", "linear"}, {"factor", 0.0}};
    });
    CHECK(has(error_of([&] { Transformer::load(d3); }), "key 'rope_scaling.factor': must be a finite number > 0"));
    const fs::path d4 = write("rope_llama3", [](TinyCheckpoint& c) {
      c.config["rope_parameters"] = {{"rope_theta", 10000.0},      {"rope_type", "llama3"},
                                     {"factor", 8.0},               {"low_freq_factor", -1.0},
                                     {"high_freq_factor", 4.0},     {"original_max_position_embeddings", 16}};
    });
    CHECK(has(error_of([&] { Transformer::load(d4); }),
              "key 'rope_parameters.low_freq_factor': must be a finite number > 0, got -1"));
    const fs::path d5 = write("rope_origmax", [](TinyCheckpoint& c) {
      c.config["rope_parameters"] = {{"rope_theta", 10000.0},      {"rope_type", "llama3"},
                                     {"factor", 8.0},               {"low_freq_factor", 1.0},
                                     {"high_freq_factor", 4.0},     {"original_max_position_embeddings", 0}};
    });
    CHECK(has(error_of([&] { Transformer::load(d5); }),
              "key 'rope_parameters.original_max_position_embeddings': must be > 0"));
    // (JSON has no NaN or Inf literals, and nlohmann::json refuses an overflowing
    // 1e999 as malformed JSON, so non-finite values cannot be written here.)
  }
  SUBCASE("malformed config.json") {
    const fs::path dir = write("malformed", [](TinyCheckpoint&) {});
    std::ofstream(dir / "config.json") << "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ";
    const std::string msg = error_of([&] { Transformer::load(dir); });
    CHECK(has(msg, (dir / "config.json").string() + ": malformed JSON"));
  }
  SUBCASE("missing and mistyped keys") {
    const fs::path dir = write("no_hidden", [](TinyCheckpoint& c) { c.config.erase("hidden_size"); });
    CHECK(has(error_of([&] { Transformer::load(dir); }), "config.json: missing key 'hidden_size'"));
    const fs::path dir2 = write("typed", [](TinyCheckpoint& c) { c.config["num_attention_heads"] = "four"; });
    CHECK(has(error_of([&] { Transformer::load(dir2); }), "key 'num_attention_heads': expected an integer, got \"four\""));
    const fs::path dir3 = write("rope", [](TinyCheckpoint& c) {
      c.config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    });
    CHECK(has(error_of([&] { Transformer::load(dir3); }), "key 'rope_scaling.rope_type': unsupported RoPE type 'yarn'"));
    const fs::path dir4 = write("gqa", [](TinyCheckpoint& c) { c.config["num_key_value_heads"] = 3; });
    CHECK(has(error_of([&] { Transformer::load(dir4); }), "key 'num_key_value_heads': 3 does not divide"));
  }
  SUBCASE("no checkpoint files") {
    const fs::path dir = root / "empty";
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << tiny_llama(o).config.dump();
    CHECK(has(error_of([&] { Transformer::load(dir); }), "no model.safetensors or model.safetensors.index.json"));
    CHECK(has(error_of([&] { Transformer::load(root / "nowhere"); }), "not a checkpoint directory"));
  }
  SUBCASE("token id out of the vocabulary") {
    const auto model = fixture_model("llama-bytes");
    const std::string msg = error_of([&] { model->forward(std::vector<int64_t>{256, 72, 300, 5}); });
    CHECK(has(msg, "token id 300 at index 2 is outside the vocabulary"));
    CHECK(has(msg, "vocab_size 257"));
    CHECK(has(error_of([&] { model->forward(std::vector<int64_t>{-1}); }), "token id -1 at index 0"));
  }
  SUBCASE("a plan for another model") {
    const auto model = fixture_model("gpt2-bytes");
    Plan plan(6, 2, 8, 64);
    ExtendOptions opt;
    opt.cache.plan = &plan;
    CHECK(has(error_of([&] { model->forward(std::vector<int64_t>{256, 1, 2}, opt); }),
              "the plan is for 6 layers x 2 KV heads x head_dim 64, but the model's cache has 6 x 6 x 64"));
  }
}

TEST_CASE("fixture checkpoints: sharded loading and configs") {
  const ModelConfig g = fixture_model("gpt2-bytes")->config();
  CHECK(g.family == ModelFamily::Gpt2);
  CHECK(g.tied_embeddings);
  CHECK(g.head_dim == 64);
  CHECK(g.intermediate_size == 1536);
  CHECK(fixture_model("gpt2-bytes")->weights().lm_head.empty());
  const ModelConfig l = fixture_model("llama-bytes")->config();
  CHECK(l.kv_heads == 2);
  CHECK(!l.tied_embeddings);
  CHECK(l.rope.enabled);
  CHECK(l.rope.theta == 10000.0);
  CHECK(l.bos_token_id == 256);
  CHECK(l.summary() == "LlamaForCausalLM: 6 layers, 6/2 q/kv heads, head_dim 64, hidden 384, mlp 1024, vocab 257, "
                       "RoPE theta 10000");
}

namespace {

// The fixture gpt2-bytes in a scratch directory `name`: its shards linked, its config.json
// edited by `edit`; the directory.
fs::path gpt2_bytes_with_config(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path fixture = data_dir() / "models" / "gpt2-bytes";
  const fs::path dir = scratch_dir(name);
  for (const char* f : {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                        "model-00002-of-00002.safetensors"})
    fs::create_symlink(fs::absolute(fixture / f), dir / f);
  std::ifstream in(fixture / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  edit(config);
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir;
}

}  // namespace

TEST_CASE("config.json: a null flag is false, as Hugging Face's truth tests read None") {
  // The fixture's GPT-2 config with scale_attn_weights null or absent.
  auto with_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    return load_model_config(gpt2_bytes_with_config(name, edit));
  };
  CHECK(with_config("config_scale_null", [](nlohmann::json& c) { c["scale_attn_weights"] = nullptr; })
            .scale_attn_weights == false);
  CHECK(with_config("config_scale_absent", [](nlohmann::json& c) { c.erase("scale_attn_weights"); })
            .scale_attn_weights == true);  // GPT2Config's default
  CHECK(with_config("config_tie_null", [](nlohmann::json& c) { c["tie_word_embeddings"] = nullptr; })
            .tied_embeddings == false);
}

TEST_CASE("eos_token_ids: config.json's id or list, and generation_config.json's, as Hugging Face's generate stops") {
  auto load = [&](const std::string& name, const nlohmann::json& eos, const nlohmann::json* generation_eos) {
    const fs::path dir = gpt2_bytes_with_config(name, [&](nlohmann::json& c) { c["eos_token_id"] = eos; });
    if (generation_eos)
      std::ofstream(dir / "generation_config.json") << nlohmann::json{{"eos_token_id", *generation_eos}}.dump();
    return load_model_config(dir);
  };
  const ModelConfig one = load("eos_one", 256, nullptr);
  CHECK(one.eos_token_ids == std::vector<int64_t>{256});
  CHECK(one.eos_token_id == 256);
  const ModelConfig list = load("eos_list", nlohmann::json::array({10, 11}), nullptr);
  CHECK(list.eos_token_ids == std::vector<int64_t>{10, 11});
  CHECK(list.eos_token_id == 10);
  CHECK(list.is_eos(11));
  CHECK_FALSE(list.is_eos(12));
  const nlohmann::json generation = nlohmann::json::array({11, 12});
  const ModelConfig both = load("eos_generation", nlohmann::json::array({10, 11}), &generation);
  CHECK(both.eos_token_ids == std::vector<int64_t>{10, 11, 12});
  const nlohmann::json outside = 5000;
  CHECK(has(error_of([&] { (void)load("eos_outside", 10, &outside); }), "eos_token_id 5000 is outside the vocabulary"));
}

TEST_CASE("a checkpoint with both model.safetensors and a shard index reads the single file, with a warning") {
  TinyLlamaOptions o;
  const TinyCheckpoint single = tiny_llama(o);
  TinyCheckpoint other = single;  // the shards: the same tensors, other values
  for (auto& [name, v] : other.values)
    for (float& x : v) x *= 2.0f;
  const fs::path shard_dir = other.write(scratch_dir("both_files_shard"));
  const fs::path dir = single.write(scratch_dir("both_files"));
  fs::copy_file(shard_dir / "model.safetensors", dir / "model-00001-of-00001.safetensors");
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, v] : other.values) index["weight_map"][name] = "model-00001-of-00001.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);

  const auto model = Transformer::load(dir);
  CHECK(model->weights().final_norm.weight(0) == single.at("model.norm.weight")[0]);  // the single file's values
  REQUIRE(model->load_warnings().size() == 1);
  CHECK(has(model->load_warnings()[0], dir.string() + " holds both model.safetensors and "
                                       "model.safetensors.index.json; reading model.safetensors, as Hugging Face does"));
  fs::remove(dir / "model.safetensors");  // the index alone: its shards, without a word
  const auto sharded = Transformer::load(dir);
  CHECK(sharded->weights().final_norm.weight(0) == other.at("model.norm.weight")[0]);
  CHECK(sharded->load_warnings().empty());
}

TEST_CASE("RoPE models beyond max_position_embeddings get a warning; GPT-2 refuses instead") {
  const ModelConfig& llama = fixture_model("llama-bytes")->config();
  REQUIRE(llama.max_positions == 2048);
  CHECK(llama.context_warning(2048).empty());
  const std::string w = llama.context_warning(2049);
  CHECK(w.find("2049 tokens exceed max_position_embeddings 2048") != std::string::npos);
  CHECK(fixture_model("gpt2-bytes")->config().context_warning(5000).empty());
}
