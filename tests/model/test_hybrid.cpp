// Hybrid models (issue 21 item 6): per-layer attention types read as transformers'
// config classes derive them (layer_types, Qwen2's use_sliding_window +
// max_window_layers, Mistral's single window), per-layer sliding windows in teacher
// forcing and generation against a plain reference, and plans that quantize only
// chosen layers (sim/model/layer_selection.h). The checkpoints are tiny random-weight
// ones written by the test (tests/model_test_files.h).
#include <cstring>
#include <random>

#include "io_test_files.h"
#include "model_test_files.h"
#include "sim/formats/registry.h"
#include "sim/model/layer_selection.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kTokens = 17;

TinyLlamaOptions three_layers(const std::string& architecture, bool qkv_bias = false) {
  TinyLlamaOptions o;
  o.architecture = architecture;
  o.layers = 3;
  o.qkv_bias = qkv_bias;
  return o;
}

// The checkpoint `base` with `extra` config keys (a null value is written as null), in
// its own directory.
fs::path write_with(const TinyCheckpoint& base, const nlohmann::json& extra, const std::string& name) {
  TinyCheckpoint ck = base;
  for (const auto& [key, value] : extra.items()) ck.config[key] = value;
  return ck.write(scratch_dir("model_hybrid") / name);
}

ModelConfig config_with(const TinyCheckpoint& base, const nlohmann::json& extra, const std::string& name) {
  return load_model_config(write_with(base, extra, name));
}

std::string config_error(const TinyCheckpoint& base, const nlohmann::json& extra, const std::string& name) {
  return error_of([&] { (void)config_with(base, extra, name); });
}

bool bit_identical(const RowMatrix& a, const RowMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.size())) == 0;
}

const nlohmann::json kSlidingFullSliding = {"sliding_attention", "full_attention", "sliding_attention"};

}  // namespace

TEST_CASE("layer_types of full_attention only: logits bit-identical to the same checkpoint without them") {
  for (const bool qwen : {false, true}) {
    const TinyLlamaOptions o = three_layers(qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM", qwen);
    const TinyCheckpoint base = tiny_llama(o);
    const std::vector<int64_t> tokens = some_tokens(kTokens, o.vocab, 3);
    const RowMatrix plain = Transformer::load(write_with(base, {}, "plain"))->forward(tokens);
    const nlohmann::json all_full = {"full_attention", "full_attention", "full_attention"};
    std::vector<nlohmann::json> variants = {{{"layer_types", all_full}}};
    if (qwen)  // a window that no layer uses
      variants.push_back({{"layer_types", all_full}, {"use_sliding_window", true}, {"sliding_window", 2}});
    else  // Ministral is Llama without biases, whatever its window, when every layer is full
      variants.push_back({{"architectures", {"MinistralForCausalLM"}}, {"layer_types", all_full}, {"sliding_window", 2}});
    for (const nlohmann::json& extra : variants) {
      CAPTURE(extra.dump());
      const auto model = Transformer::load(write_with(base, extra, "all_full"));
      CHECK(model->config().sliding_layers() == 0);
      CHECK(bit_identical(model->forward(tokens), plain));
    }
  }
}

TEST_CASE("a sliding layer whose window holds every token equals full attention") {
  const TinyLlamaOptions o = three_layers("MinistralForCausalLM");
  const TinyCheckpoint base = tiny_llama(o);
  const std::vector<int64_t> tokens = some_tokens(kTokens, o.vocab, 4);
  const RowMatrix full = Transformer::load(write_with(base, {{"sliding_window", nullptr}}, "full"))->forward(tokens);
  for (const int64_t w : {kTokens, kTokens + 1, int64_t{4096}}) {
    CAPTURE(w);
    const auto model =
        Transformer::load(write_with(base, {{"sliding_window", w}, {"layer_types", kSlidingFullSliding}}, "wide"));
    CHECK(model->config().sliding_window == std::vector<int64_t>{w, 0, w});
    CHECK(bit_identical(model->forward(tokens), full));
  }
}

TEST_CASE("per-layer sliding windows against a plain reference, in teacher forcing and generation") {
  const TinyLlamaOptions o = three_layers("MinistralForCausalLM");
  const TinyCheckpoint base = tiny_llama(o);
  const std::vector<int64_t> tokens = some_tokens(kTokens, o.vocab, 5);
  const int64_t w = 3;
  const auto model =
      Transformer::load(write_with(base, {{"sliding_window", w}, {"layer_types", kSlidingFullSliding}}, "hybrid"));
  const ModelConfig& c = model->config();
  CHECK(c.attention_kinds ==
        std::vector<AttentionKind>{AttentionKind::Sliding, AttentionKind::Full, AttentionKind::Sliding});
  CHECK(c.sliding_window == std::vector<int64_t>{w, 0, w});
  CHECK(has(c.summary(), "hybrid: 2 sliding-window layers (W 3: 0,2), 1 full"));
  // Teacher forcing: query t of a sliding layer sees keys t - 3 < j <= t (reference_llama).
  const RowMatrix got = model->forward(tokens);
  const auto want = reference_llama(base, o, llama_inv_freq(10000.0, o.head_dim), {w, 0, w}, tokens);
  CHECK(worst_relative_row_error(want, got.data(), got.cols()) < 1e-5);
  // The window matters: full attention everywhere is far from it.
  const auto full = reference_llama(base, o, llama_inv_freq(10000.0, o.head_dim), {0, 0, 0}, tokens);
  CHECK(worst_relative_row_error(full, got.data(), got.cols()) > 1e-3);
  // Generation: a prompt, then one token at a time, reads the same windows.
  Transformer::State state = model->new_state();
  const int64_t prompt = 5;
  RowMatrix step = model->extend(state, std::span(tokens).first(static_cast<size_t>(prompt)), {});
  for (int64_t t = prompt; t < kTokens; ++t) {
    ExtendOptions one;
    one.all_logits = false;
    step = model->extend(state, std::span(tokens).subspan(static_cast<size_t>(t), 1), one);
    const std::vector<std::vector<double>> ref_row = {want[static_cast<size_t>(t)]};
    CAPTURE(t);
    CHECK(worst_relative_row_error(ref_row, step.data(), step.cols()) < 1e-5);
  }
  // Every layer sliding: the Ministral path equals Mistral's single window.
  const RowMatrix ministral =
      Transformer::load(write_with(base, {{"sliding_window", w}, {"layer_types", nullptr}}, "all_sliding"))->forward(tokens);
  const RowMatrix mistral =
      Transformer::load(write_with(base, {{"architectures", {"MistralForCausalLM"}}, {"sliding_window", w}}, "mistral"))
          ->forward(tokens);
  CHECK(bit_identical(ministral, mistral));
}

TEST_CASE("attention types as transformers' config classes derive them") {
  const TinyCheckpoint qwen = tiny_llama(three_layers("Qwen2ForCausalLM", true));
  using W = std::vector<int64_t>;
  // Qwen2: the window applies only with use_sliding_window, from max_window_layers on.
  CHECK(config_with(qwen, {{"use_sliding_window", true}, {"sliding_window", 4}, {"max_window_layers", 1}}, "q1")
            .sliding_window == W{0, 4, 4});
  CHECK(config_with(qwen, {{"use_sliding_window", false}, {"sliding_window", 4}, {"max_window_layers", 0}}, "q2")
            .sliding_window == W{0, 0, 0});
  // max_window_layers defaults to 28 (transformers' Qwen2Config): no layer of three slides.
  CHECK(config_with(qwen, {{"use_sliding_window", true}, {"sliding_window", 4}}, "q3").sliding_window == W{0, 0, 0});
  // use_sliding_window without a window: none.
  CHECK(config_with(qwen, {{"use_sliding_window", true}, {"sliding_window", nullptr}, {"max_window_layers", 0}}, "q4")
            .sliding_window == W{0, 0, 0});
  // layer_types wins over max_window_layers.
  CHECK(config_with(qwen,
                    {{"use_sliding_window", true},
                     {"sliding_window", 4},
                     {"max_window_layers", 0},
                     {"layer_types", {"sliding_attention", "full_attention", "full_attention"}}},
                    "q5")
            .sliding_window == W{4, 0, 0});
  // Mistral: one window on every layer, 4096 when the key is absent, none when null.
  const TinyCheckpoint mistral = tiny_llama(three_layers("MistralForCausalLM"));
  CHECK(config_with(mistral, {}, "m1").sliding_window == W{4096, 4096, 4096});
  CHECK(config_with(mistral, {{"sliding_window", nullptr}}, "m2").sliding_window == W{0, 0, 0});
  CHECK(config_with(mistral, {{"sliding_window", 5}, {"layer_types", {"sliding_attention", "sliding_attention",
                                                                       "sliding_attention"}}},
                    "m3")
            .sliding_window == W{5, 5, 5});
  // Ministral: every layer slides without layer_types (none with a null window).
  const TinyCheckpoint ministral = tiny_llama(three_layers("MinistralForCausalLM"));
  CHECK(config_with(ministral, {{"sliding_window", 5}}, "n1").sliding_window == W{5, 5, 5});
  CHECK(config_with(ministral, {{"sliding_window", nullptr}}, "n2").sliding_window == W{0, 0, 0});
  // transformers 5 writes Ministral's RoPE per layer type: one RoPE for both is read.
  const nlohmann::json rope = {{"rope_theta", 500.0}, {"rope_type", "default"}};
  CHECK(config_with(ministral, {{"rope_parameters", {{"full_attention", rope}, {"sliding_attention", rope}}}}, "n3")
            .rope.theta == 500.0);
  nlohmann::json other = rope;
  other["rope_theta"] = 1000.0;
  CHECK(has(config_error(ministral, {{"rope_parameters", {{"full_attention", rope}, {"sliding_attention", other}}}},
                         "n4"),
            "rope_parameters.sliding_attention': differs from full_attention"));
}

TEST_CASE("bad attention types are errors naming the file, the key and the entry") {
  const TinyCheckpoint ministral = tiny_llama(three_layers("MinistralForCausalLM"));
  std::string msg = config_error(
      ministral, {{"sliding_window", 3}, {"layer_types", {"full_attention", "sliding", "full_attention"}}}, "e1");
  CHECK(has(msg, "e1/config.json: key 'layer_types': entry 1: unsupported layer type \"sliding\""));
  CHECK(has(msg, "\"full_attention\", \"sliding_attention\""));
  msg = config_error(ministral, {{"sliding_window", 3}, {"layer_types", {"full_attention", 7, "full_attention"}}}, "e2");
  CHECK(has(msg, "entry 1: unsupported layer type 7"));
  msg = config_error(ministral, {{"layer_types", {"full_attention", "full_attention"}}}, "e3");
  CHECK(has(msg, "e3/config.json: key 'layer_types': has 2 entries, but num_hidden_layers is 3"));
  CHECK(has(config_error(ministral, {{"layer_types", "full_attention"}}, "e4"), "expected a list of layer types"));
  CHECK(has(config_error(ministral, {{"sliding_window", nullptr}, {"layer_types", kSlidingFullSliding}}, "e5"),
            "entry 0 is sliding_attention, but there is no window: sliding_window is null"));
  CHECK(has(config_error(ministral, {{"sliding_window", 0}}, "e6"), "key 'sliding_window': must be > 0"));
  // Qwen2's window exists only with use_sliding_window (Hugging Face fails on it too).
  const TinyCheckpoint qwen = tiny_llama(three_layers("Qwen2ForCausalLM", true));
  CHECK(has(config_error(qwen, {{"sliding_window", 4}, {"layer_types", kSlidingFullSliding}}, "e7"),
            "entry 0 is sliding_attention, but there is no window: use_sliding_window is false"));
  // Mistral slides on every layer (HF ignores layer_types there): a list that says otherwise is refused.
  const TinyCheckpoint mistral = tiny_llama(three_layers("MistralForCausalLM"));
  msg = config_error(mistral, {{"sliding_window", 4}, {"layer_types", kSlidingFullSliding}}, "e8");
  CHECK(has(msg, "entry 1 is full_attention, but MistralForCausalLM gives every layer sliding_attention"));
  CHECK(has(msg, "MinistralForCausalLM"));
  // Llama has no window in Hugging Face.
  const TinyCheckpoint llama = tiny_llama(three_layers("LlamaForCausalLM"));
  CHECK(has(config_error(llama, {{"sliding_window", 4}, {"layer_types", kSlidingFullSliding}}, "e9"),
            "entry 0 is sliding_attention, but LlamaForCausalLM has no sliding-window attention"));
  CHECK(has(config_error(llama, {{"sliding_window", 4}}, "e10"),
            "key 'sliding_window': LlamaForCausalLM has no sliding-window attention"));
  CHECK(config_with(llama, {{"sliding_window", nullptr}}, "e11").sliding_layers() == 0);
}

TEST_CASE("layer selections: all, full, sliding, indices and ranges; bad ones named") {
  const TinyCheckpoint ministral = tiny_llama(three_layers("MinistralForCausalLM"));
  const ModelConfig c = config_with(ministral, {{"sliding_window", 3}, {"layer_types", kSlidingFullSliding}}, "sel");
  using V = std::vector<int64_t>;
  CHECK(parse_layer_selection("all", c, "--layers") == V{0, 1, 2});
  CHECK(parse_layer_selection("full", c, "--layers") == V{1});
  CHECK(parse_layer_selection("sliding", c, "--layers") == V{0, 2});
  CHECK(parse_layer_selection(" 2, 0-1 ", c, "--layers") == V{0, 1, 2});
  CHECK(parse_layer_selection("1,1", c, "--layers") == V{1});
  CHECK(format_layer_list({0, 2, 5, 6, 7}) == "0,2,5-7");
  CHECK(has(error_of([&] { parse_layer_selection("3", c, "--layers"); }),
            "--layers '3': layer 3 does not exist: " + c.dir.string() + " has 3 layers (0..2)"));
  CHECK(has(error_of([&] { parse_layer_selection("0-5", c, "--layers"); }), "layer 5 does not exist"));
  CHECK(has(error_of([&] { parse_layer_selection("2-1", c, "--layers"); }), "range '2-1' runs backwards"));
  for (const char* bad : {"x", "-1", "1-", "1,,2", "full,0"})
    CHECK(has(error_of([&] { parse_layer_selection(bad, c, "--layers"); }), "is not a layer index or range"));
  CHECK(has(error_of([&] { parse_layer_selection("  ", c, "--layers"); }), "--layers: empty"));
  const ModelConfig dense = config_with(ministral, {{"sliding_window", nullptr}}, "sel_dense");
  CHECK(has(error_of([&] { parse_layer_selection("sliding", dense, "quantize_layers"); }),
            "quantize_layers sliding: " + dense.dir.string() + " has no sliding-window layers (0 of its 3 layers slide)"));
}

TEST_CASE("quantizing only chosen layers: the others stay exact, memory counts them at their format") {
  const int64_t L = 3, G = 2, d = 8, T = kTokens;
  Plan plan(L, G, T, d);
  const FormatPtr int2 = make_format("int2-asym-g8");
  plan.assign_all(Kind::Key, int2);
  plan.assign_all(Kind::Value, int2);
  for (const char* kept : {"keep-fp32", "keep-fp16"}) {
    CAPTURE(kept);
    Plan only = plan;
    quantize_only_layers(only, {0, 2}, make_format(kept));
    CHECK(only.check().empty());
    // Bits of the whole cache: two layers at int2, one at the kept format, every head and kind.
    const uint64_t want = 2 * G * 2 * int2->storage_bits(T, d) + G * 2 * make_format(kept)->storage_bits(T, d);
    CHECK(only.storage_bits() == want);
    CHECK(only.bpe() == doctest::Approx(static_cast<double>(want) / static_cast<double>(L * G * 2 * T * d)));
  }
  // Every layer chosen: the plan is unchanged.
  Plan all = plan;
  quantize_only_layers(all, {0, 1, 2}, make_format("keep-fp16"));
  CHECK(all.describe() == plan.describe());
  CHECK(all.storage_bits() == plan.storage_bits());
  CHECK_THROWS_AS(quantize_only_layers(all, {3}, make_format("keep-fp16")), Error);

  // The cache: a kept layer's keys and values read at keep-fp32 are its exact ones, bit for bit.
  Plan sliding_only = plan;
  quantize_only_layers(sliding_only, {0, 2}, make_format("keep-fp32"));
  KvCache cache(L, G, d);
  for (int64_t l = 0; l < L; ++l) {
    const std::vector<float> k = random_normal(static_cast<size_t>(T * G * d), 10 + static_cast<uint64_t>(l));
    const std::vector<float> v = random_normal(static_cast<size_t>(T * G * d), 20 + static_cast<uint64_t>(l));
    cache.append(l, k.data(), v.data(), G * d, T);
  }
  std::vector<float> scratch;
  const CacheQuantization q{&sliding_only, 0};
  for (int64_t l = 0; l < L; ++l) {
    const KvLayerView view = cache.view(l, q, scratch);
    for (int64_t g = 0; g < G; ++g)
      for (const KvUnitView* u : {&view.keys[static_cast<size_t>(g)], &view.values[static_cast<size_t>(g)]}) {
        CAPTURE(l);
        const bool same = std::memcmp(u->stored, u->exact, sizeof(float) * static_cast<size_t>(T * d)) == 0;
        CHECK(same == (l == 1));
      }
  }
}

TEST_CASE("a model with only chosen layers quantized: layers before the first stay exact; all layers = no selection") {
  const TinyLlamaOptions o = three_layers("MinistralForCausalLM");
  const TinyCheckpoint base = tiny_llama(o);
  // The window holds every evaluated token, so the recording (full causal attention) is the model's.
  const auto model =
      Transformer::load(write_with(base, {{"sliding_window", kTokens}, {"layer_types", kSlidingFullSliding}}, "eval"));
  const std::vector<int64_t> tokens = some_tokens(kTokens, o.vocab, 6);
  const ModelEvaluator evaluator(model, tokens, ContinuationSpec{}, "hybrid");
  Plan plan(3, o.kv_heads, kTokens, o.head_dim);
  plan.assign_all(Kind::Key, make_format("int2-asym-g8"));
  plan.assign_all(Kind::Value, make_format("int2-asym-g8"));
  // All layers chosen: what evaluate() reports is the same as without a selection.
  Plan all = plan;
  quantize_only_layers(all, parse_layer_selection("all", model->config(), "--layers"), make_format("keep-fp16"));
  RowMatrix with_all, without;
  const ModelStats a = evaluator.evaluate(all, 0, &with_all);
  const ModelStats b = evaluator.evaluate(plan, 0, &without);
  CHECK(bit_identical(with_all, without));
  CHECK(a.nll == b.nll);
  // Only the full layer (1): layer 0's cache is exact, so its attention output is the
  // exact run's, bit for bit; layer 1 reads int2 and differs.
  Plan full_only = plan;
  quantize_only_layers(full_only, parse_layer_selection("full", model->config(), "--layers"), make_format("keep-fp32"));
  std::vector<LayerTensors> exact_capture, quant_capture;
  ExtendOptions exact_opt, quant_opt;
  exact_opt.capture = &exact_capture;
  quant_opt.capture = &quant_capture;
  quant_opt.cache.plan = &full_only;
  const RowMatrix exact_logits = model->forward(tokens, exact_opt);
  const RowMatrix quant_logits = model->forward(tokens, quant_opt);
  CHECK(exact_capture[0].attn_output.data == quant_capture[0].attn_output.data);
  CHECK(exact_capture[1].attn_output.data != quant_capture[1].attn_output.data);
  CHECK(!bit_identical(exact_logits, quant_logits));
}
