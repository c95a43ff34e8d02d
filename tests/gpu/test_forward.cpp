// The model forward pass on the device (kernels/model_forward.h) against the CPU's
// (sim/model/transformer.h): logits within 1e-5 relative to max |logit| and the same
// argmax at every position, on the bundled checkpoints (GPT-2, Llama) and on tiny
// Llama-family checkpoints of every option the CPU runs (Qwen2 biases with sliding
// layers, Mistral MQA with a window, llama3 and linear RoPE scaling, hybrid
// layer_types) with the exact cache; attention through plans (int, ggml, fp16 and
// chunked windows, prefill, segments) on identical inputs to 1e-5, and whole models
// through plans as close as quantization allows (check_plan_agree); capture; greedy
// generation token for token;
// the TF32 mode's measured error; and the error for a format without a twin.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "gpu_test_util.h"
#include "kernels/model_forward.h"
#include "model_test_files.h"
#include "sim/core/error.h"
#include "sim/formats/registry.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

constexpr double kLogitTolerance = 1e-5;  // relative to max |logit| of the row

std::shared_ptr<const Transformer> bundled(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Transformer>> cache;
  auto& m = cache[name];
  if (!m) m = Transformer::load(gpu_data_dir() / "models" / name);
  return m;
}

// Byte tokens of an English text, `n` of them.
std::vector<int64_t> text_tokens(int64_t n, int64_t vocab) {
  const std::string text =
      "The cache holds the keys and values of every token so far; attention reads them back at each step. "
      "Quantizing them saves memory, and the question is how much error the model tolerates. ";
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<unsigned char>(text[static_cast<size_t>(i) % text.size()]) % vocab);
  return ids;
}

// Every unit: one segment of `format` over the plan's tokens, an optional window.
Plan plan_for(const ModelConfig& c, int64_t tokens, const std::string& format, RecentWindow window = {},
              int64_t prefill = 0) {
  Plan plan(c.layers, c.kv_heads, tokens, c.head_dim);
  for (int64_t l = 0; l < c.layers; ++l)
    for (int64_t g = 0; g < c.kv_heads; ++g)
      for (Kind k : {Kind::Key, Kind::Value}) {
        UnitPlan& u = plan.unit(l, g, k);
        u.segments = {Segment{0, tokens, make_format(format)}};
        u.window = window;
      }
  plan.set_prefill(prefill);
  REQUIRE(plan.check().empty());
  return plan;
}

struct LogitAgreement {
  double worst = 0;           // max over rows of max |gpu - cpu| / max |cpu|
  double mean = 0;            // the same, averaged over rows
  int64_t argmax_differ = 0;  // rows whose argmax differs
};

LogitAgreement compare_logits(const RowMatrix& cpu, const RowMatrix& gpu) {
  REQUIRE(cpu.rows() == gpu.rows());
  REQUIRE(cpu.cols() == gpu.cols());
  LogitAgreement a;
  REQUIRE(gpu.allFinite());
  for (int64_t r = 0; r < cpu.rows(); ++r) {
    double diff = 0, scale = 0;
    for (int64_t v = 0; v < cpu.cols(); ++v) {
      diff = std::max(diff, static_cast<double>(std::fabs(gpu(r, v) - cpu(r, v))));
      scale = std::max(scale, static_cast<double>(std::fabs(cpu(r, v))));
    }
    a.worst = std::max(a.worst, diff / scale);
    a.mean += diff / scale / static_cast<double>(cpu.rows());
    if (argmax(cpu.row(r).data(), cpu.cols()) != argmax(gpu.row(r).data(), gpu.cols())) ++a.argmax_differ;
  }
  return a;
}

void check_agree(const RowMatrix& cpu, const RowMatrix& gpu, const std::string& label) {
  const LogitAgreement a = compare_logits(cpu, gpu);
  MESSAGE(label << ": worst relative logit difference " << a.worst);
  CHECK_MESSAGE(a.worst <= kLogitTolerance, label << ": " << a.worst);
  CHECK_MESSAGE(a.argmax_differ == 0, label << ": argmax differs at " << a.argmax_differ << " positions");
}

// Through a quantized cache the two passes cannot agree to fp32 rounding: their keys
// and values differ in the last bits (GEMMs sum in other orders), and a value that
// close to a rounding boundary of the format lands on the neighbouring code, a whole
// quantization step away. So at the model level the device's quantized logits must be
// far closer to the CPU's than the plan's own effect (CPU plan vs CPU exact), on
// average over positions; the attention-level test below checks the plan path on
// identical inputs to 1e-5.
void check_plan_agree(const RowMatrix& cpu_exact, const RowMatrix& cpu, const RowMatrix& gpu, const std::string& label) {
  const LogitAgreement a = compare_logits(cpu, gpu), effect = compare_logits(cpu_exact, cpu);
  MESSAGE(label << ": device vs CPU mean relative logit difference " << a.mean << " (worst " << a.worst
                << ", argmax differs at " << a.argmax_differ << " of " << cpu.rows()
                << "); the plan's own effect: mean " << effect.mean << " (worst " << effect.worst << ")");
  CHECK_MESSAGE(a.mean <= 0.25 * effect.mean, label);
}

// [rows, cols] N(0, sigma²) values.
std::vector<float> normal_values(int64_t count, uint64_t seed, float sigma) {
  return random_normal(static_cast<size_t>(count), seed, sigma);
}

}  // namespace

TEST_CASE("attention through plans, on the same inputs: the device's equals causal_attention's") {
  const int64_t q_heads = 4, kv_heads = 2, d = 64, T = 160, width = q_heads * d;
  const std::vector<float> queries = normal_values(T * width, 1, 2.0f);
  const std::vector<float> keys = normal_values(kv_heads * T * d, 2, 1.0f);  // [kv_heads, T, d]
  const std::vector<float> values = normal_values(kv_heads * T * d, 3, 1.0f);
  // Token-major copies [T, kv_heads * d], as the forward pass appends them to KvCache.
  std::vector<float> keys_rows(keys.size()), values_rows(values.size());
  for (int64_t g = 0; g < kv_heads; ++g)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < d; ++c) {
        keys_rows[static_cast<size_t>(t * kv_heads * d + g * d + c)] = keys[static_cast<size_t>((g * T + t) * d + c)];
        values_rows[static_cast<size_t>(t * kv_heads * d + g * d + c)] = values[static_cast<size_t>((g * T + t) * d + c)];
      }
  KvCache cache(1, kv_heads, d);
  cache.append(0, keys_rows.data(), values_rows.data(), kv_heads * d, T);

  auto unit_plan = [&](const std::string& key_format, const std::string& value_format, RecentWindow window,
                       int64_t prefill) {
    Plan plan(1, kv_heads, T, d);
    for (int64_t g = 0; g < kv_heads; ++g)
      for (Kind k : {Kind::Key, Kind::Value}) {
        UnitPlan& u = plan.unit(0, g, k);
        u.segments = {Segment{0, 8, make_format("keep-fp16")},
                      Segment{8, T, make_format(k == Kind::Key ? key_format : value_format)}};
        u.window = window;
      }
    plan.set_prefill(prefill);
    REQUIRE(plan.check().empty());
    return plan;
  };
  RecentWindow chunked{32, make_format("int8-asym-g32")};
  chunked.mode = RecentWindow::Mode::Chunked;
  RecentWindow extra{16, make_format("keep-fp16")};
  extra.extra_copy = true;
  const std::vector<std::pair<std::string, Plan>> plans = {
      {"int4 keys and values", unit_plan("int4-asym-g32", "int4-asym-g32", {}, 0)},
      {"int2 + keep-fp16 sliding window 16", unit_plan("int2-asym-g32", "int3-sym-g16", RecentWindow{16, make_format("keep-fp16")}, 0)},
      {"int3 + chunked int8 window 32, prefill 40", unit_plan("int3-sym-g16", "int4-asym-g32", chunked, 40)},
      {"q4_0 + extra-copy fp16 window 16", unit_plan("q4_0", "q8_0", extra, 0)},
  };
  for (int64_t window : {int64_t{0}, int64_t{50}})
    for (int64_t n : {T, int64_t{1}, int64_t{7}})
      for (const auto& [label, plan] : plans) {
        CAPTURE(label);
        CAPTURE(window);
        CAPTURE(n);
        const AttentionGeometry geo{q_heads, kv_heads, d, 0.125f, window};
        CacheQuantization q;
        q.plan = &plan;
        std::vector<float> scratch;
        const KvLayerView view = cache.view(0, q, scratch);
        std::vector<float> cpu(static_cast<size_t>(n * width));
        const float* rows = queries.data() + (T - n) * width;
        causal_attention(rows, width, n, T, view, geo, cpu.data());
        const std::vector<float> gpu = cuda::attention_on_device(rows, n, keys.data(), values.data(), T, geo, 0, q);
        REQUIRE(gpu.size() == cpu.size());
        double diff = 0, scale = 0;
        for (size_t i = 0; i < cpu.size(); ++i) {
          diff = std::max(diff, static_cast<double>(std::fabs(gpu[i] - cpu[i])));
          scale = std::max(scale, static_cast<double>(std::fabs(cpu[i])));
        }
        CHECK_MESSAGE(diff <= kLogitTolerance * scale, label << ": " << diff << " of " << scale);
        // The exact cache on the same inputs, for contrast: the plan must change the output.
        const KvLayerView exact = cache.view(0, CacheQuantization{}, scratch);
        std::vector<float> cpu_exact(cpu.size());
        causal_attention(rows, width, n, T, exact, geo, cpu_exact.data());
        double effect = 0;
        for (size_t i = 0; i < cpu.size(); ++i) effect = std::max(effect, static_cast<double>(std::fabs(cpu_exact[i] - cpu[i])));
        CHECK(effect > 100 * kLogitTolerance * scale);
      }
}

TEST_CASE("bundled checkpoints: CUDA logits equal the CPU's, exact cache and through plans") {
  for (const std::string name : {"gpt2-bytes", "llama-bytes", "reasoning-bytes"}) {
    CAPTURE(name);
    const auto host = bundled(name);
    const cuda::CudaTransformer gpu(host);
    const ModelConfig& c = host->config();
    const int64_t T = std::min<int64_t>(300, c.family == ModelFamily::Gpt2 ? c.max_positions : 300);
    const std::vector<int64_t> tokens = text_tokens(T, c.vocab_size);
    const RowMatrix cpu_exact = host->forward(tokens);
    check_agree(cpu_exact, gpu.forward(tokens), name + " exact");

    const Plan int4 = plan_for(c, T, "int4-asym-g32");
    const Plan windowed = plan_for(c, T, "int2-asym-g32", RecentWindow{16, make_format("keep-fp16")});
    RecentWindow chunked{32, make_format("int8-asym-g32")};
    chunked.mode = RecentWindow::Mode::Chunked;
    const Plan prompt = plan_for(c, T, "int3-sym-g16", chunked, 40);
    for (const auto& [label, plan] : {std::pair{"int4", &int4}, std::pair{"int2 + keep-fp16 window 16", &windowed},
                                      std::pair{"int3, chunked int8 window, prefill 40", &prompt}}) {
      ExtendOptions opt;
      opt.cache.plan = plan;
      check_plan_agree(cpu_exact, host->forward(tokens, opt), gpu.forward(tokens, opt), name + " " + label);
    }
  }
}

TEST_CASE("Llama-family options: Qwen2 biases and sliding layers, Mistral MQA, llama3 and linear RoPE, hybrids") {
  const fs::path root = fs::temp_directory_path() / "kvb_gpu_test_forward";
  fs::remove_all(root);
  TinyLlamaOptions llama;
  llama.layers = 3;
  llama.hidden = 64;
  llama.head_dim = 16;
  llama.vocab = 61;
  TinyLlamaOptions qwen = llama;
  qwen.architecture = "Qwen2ForCausalLM";
  qwen.qkv_bias = true;
  qwen.tied = true;
  TinyLlamaOptions mistral = llama;
  mistral.architecture = "MistralForCausalLM";
  mistral.kv_heads = 1;
  TinyLlamaOptions ministral = llama;
  ministral.architecture = "MinistralForCausalLM";
  struct Case {
    std::string name;
    TinyLlamaOptions opt;
    nlohmann::json extra;
  };
  const std::vector<Case> cases = {
      {"qwen2 biases, tied, sliding from layer 1", qwen,
       {{"rope_theta", 1000.0}, {"use_sliding_window", true}, {"sliding_window", 7}, {"max_window_layers", 1}}},
      {"mistral MQA, window 5", mistral, {{"rope_theta", 10000.0}, {"sliding_window", 5}}},
      {"llama3 scaling", llama,
       {{"rope_theta", 10000.0},
        {"rope_scaling",
         {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 64}}}}},
      {"linear scaling", llama, {{"rope_theta", 500.0}, {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}},
      {"ministral layer_types", ministral,
       {{"rope_theta", 10000.0},
        {"sliding_window", 4},
        {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}}}},
  };
  int index = 0;
  for (const Case& k : cases) {
    CAPTURE(k.name);
    TinyCheckpoint ck = tiny_llama(k.opt);
    ck.config.update(k.extra);
    const auto host = Transformer::load(ck.write(root / std::to_string(index++), DType::BF16));
    const cuda::CudaTransformer gpu(host);
    const std::vector<int64_t> tokens = text_tokens(70, k.opt.vocab);
    const RowMatrix cpu_exact = host->forward(tokens);
    check_agree(cpu_exact, gpu.forward(tokens), k.name + " exact");
    const Plan plan = plan_for(host->config(), 70, "int4-asym-g16", RecentWindow{8, make_format("keep-fp16")});
    ExtendOptions opt;
    opt.cache.plan = &plan;
    check_plan_agree(cpu_exact, host->forward(tokens, opt), gpu.forward(tokens, opt), k.name + " int4 + window");
  }
  fs::remove_all(root);
}

TEST_CASE("generation: a prompt, then one token at a time, gives the CPU's greedy tokens") {
  for (const std::string name : {"gpt2-bytes", "llama-bytes"}) {
    CAPTURE(name);
    const auto host = bundled(name);
    const cuda::CudaTransformer gpu(host);
    const ModelConfig& c = host->config();
    const std::vector<int64_t> prompt = text_tokens(60, c.vocab_size);
    const int64_t new_tokens = 40;
    CHECK(cuda::greedy_generate(gpu, prompt, new_tokens, {}) == greedy_continuation(*host, prompt, new_tokens, {}));
    const Plan plan = plan_for(c, 100, "int4-asym-g32", RecentWindow{8, make_format("keep-fp16")});
    CacheQuantization q;
    q.plan = &plan;
    CHECK(cuda::greedy_generate(gpu, prompt, new_tokens, q) == greedy_continuation(*host, prompt, new_tokens, q));
    // Step logits of the device state equal teacher forcing's last rows.
    cuda::CudaTransformer::State state = gpu.new_state();
    ExtendOptions last;
    last.all_logits = false;
    gpu.extend(state, std::span<const int64_t>(prompt.data(), 59), last);
    const RowMatrix step = gpu.extend(state, std::span<const int64_t>(prompt.data() + 59, 1), last);
    const RowMatrix all = host->forward(prompt);
    check_agree(all.bottomRows(1), step, name + " step after a 59-token prompt");
  }
}

TEST_CASE("capture: queries, keys, values and attention outputs as the CPU's") {
  const auto host = bundled("llama-bytes");
  const cuda::CudaTransformer gpu(host);
  const std::vector<int64_t> tokens = text_tokens(50, host->config().vocab_size);
  std::vector<LayerTensors> cpu_cap, gpu_cap;
  ExtendOptions a, b;
  a.capture = &cpu_cap;
  b.capture = &gpu_cap;
  host->forward(tokens, a);
  gpu.forward(tokens, b);
  REQUIRE(cpu_cap.size() == gpu_cap.size());
  for (size_t l = 0; l < cpu_cap.size(); ++l) {
    const std::pair<const Tensor*, const Tensor*> pairs[] = {{&cpu_cap[l].query, &gpu_cap[l].query},
                                                             {&cpu_cap[l].key, &gpu_cap[l].key},
                                                             {&cpu_cap[l].key_pre_rope, &gpu_cap[l].key_pre_rope},
                                                             {&cpu_cap[l].value, &gpu_cap[l].value},
                                                             {&cpu_cap[l].attn_output, &gpu_cap[l].attn_output}};
    for (const auto& [x, y] : pairs) {
      REQUIRE(x->shape == y->shape);
      double diff = 0, scale = 0;
      for (size_t i = 0; i < x->data.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(x->data[i] - y->data[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(x->data[i])));
      }
      CHECK_MESSAGE(diff <= 1e-5 * scale, "layer " << l << ": " << diff << " of " << scale);
    }
  }
}

TEST_CASE("tf32 mode: its logit error against fp32 is measured") {
  for (const std::string name : {"gpt2-bytes", "llama-bytes"}) {
    const auto host = bundled(name);
    const cuda::CudaTransformer fp32(host), tf32(host, cuda::ForwardMath::Tf32);
    const std::vector<int64_t> tokens = text_tokens(300, host->config().vocab_size);
    const LogitAgreement a = compare_logits(fp32.forward(tokens), tf32.forward(tokens));
    MESSAGE(name << ": tf32 vs fp32 worst relative logit difference " << a.worst << ", argmax differs at "
                 << a.argmax_differ << " of 300 positions");
    CHECK(a.worst < 1e-2);
  }
}

TEST_CASE("a plan with a format that has no CUDA twin fails naming the format and unit") {
  const auto host = bundled("llama-bytes");
  const cuda::CudaTransformer gpu(host);
  const ModelConfig& c = host->config();
  Plan plan = plan_for(c, 20, "int4-asym-g32");
  plan.unit(1, 1, Kind::Value).segments = {Segment{0, 20, std::make_shared<CpuOnlyFormat>()}};
  ExtendOptions opt;
  opt.cache.plan = &plan;
  const std::vector<int64_t> tokens = text_tokens(20, c.vocab_size);
  std::string message;
  try {
    gpu.forward(tokens, opt);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("cpu-only-double") != std::string::npos);
  CHECK(message.find("layer 1 kv_head 1 V") != std::string::npos);
  CHECK(cuda::forward_unsupported_reason(plan) != "");
  CHECK(cuda::forward_unsupported_reason(plan_for(c, 20, "int4-asym-g32")) == "");
}
