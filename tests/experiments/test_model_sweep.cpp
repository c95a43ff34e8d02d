// [data] source = "model" (experiments/experiment.*, sweep.*): config keys and their
// errors, and sweeps whose points carry model-level metrics.
#include <omp.h>

#include <cmath>

#include "experiments/data_building.h"
#include "experiments/experiment.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "test_util.h"

using namespace kvb;

namespace {

const std::string kModelData =
    "[data]\nsource = \"model\"\nmodel = \"data/models/llama-bytes\"\ntext = \"data/text/eval_kjv_revelation.txt\"\n";

ExperimentSpec parse(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto doc = ConfigDoc::parse(text, "test.toml");
  for (const std::string& s : sets) doc->apply_override(s);
  return parse_experiment(doc);
}

std::string config_error(const std::string& text) {
  try {
    (void)expand_sweep(parse(text));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kUniform = "[[strategy]]\ntype = \"uniform\"\nformat = \"keep-fp32\"\n";

}  // namespace

TEST_CASE("model data: keys, defaults and the default metrics") {
  const ExperimentSpec e = parse(kModelData + "max_tokens = 128\ncontinuations = 2\ncontinuation_prompt = 16\n" +
                                 kUniform);
  REQUIRE(e.data.source == DataSpec::Source::Model);
  CHECK(e.data.model.checkpoint.filename() == "llama-bytes");
  CHECK(e.data.model.tokens.text.filename() == "eval_kjv_revelation.txt");
  CHECK(e.data.model.tokens.tokenizer == "bytes");
  CHECK(e.data.model.tokens.max_tokens == 128);
  CHECK(e.data.model.continuations.count == 2);
  CHECK(e.data.model.continuations.prompt == 16);
  CHECK(e.data.model.continuations.tokens == 20);
  // Every metric is reported by default, model metrics included; the frontier is PPL ratio.
  CHECK(std::find(e.metrics.report.begin(), e.metrics.report.end(), "gen_bleu4") != e.metrics.report.end());
  CHECK(std::find(e.metrics.report.begin(), e.metrics.report.end(), "attn_kl_mean") != e.metrics.report.end());
  CHECK(e.metrics.pareto == std::vector<std::string>{"ppl_ratio", "next_token_kl_mean"});
  // max_tokens defaults to 512 for a model; continuations = 0 drops the generation metrics.
  const ExperimentSpec d = parse(kModelData + "continuations = 0\n" + kUniform);
  CHECK(d.data.max_tokens == 512);
  CHECK(std::find(d.metrics.report.begin(), d.metrics.report.end(), "gen_bleu4") == d.metrics.report.end());
  CHECK(std::find(d.metrics.report.begin(), d.metrics.report.end(), "ppl") != d.metrics.report.end());
  // Continuations of 3 tokens hold no 4-gram: gen_bleu4 leaves the default report.
  const ExperimentSpec s3 = parse(kModelData + "continuation_tokens = 3\n" + kUniform);
  CHECK(std::find(s3.metrics.report.begin(), s3.metrics.report.end(), "gen_bleu4") == s3.metrics.report.end());
  CHECK(std::find(s3.metrics.report.begin(), s3.metrics.report.end(), "gen_token_match") != s3.metrics.report.end());
}

TEST_CASE("model data: errors name the key") {
  CHECK(has(config_error("[data]\npath = \"data/records/gpt2-bytes-record.safetensors\"\n" + kUniform +
                         "[metrics]\nreport = [\"ppl_ratio\"]\n"),
            "'ppl_ratio' is a model-level metric; it needs [data] source = \"model\""));
  CHECK(has(config_error(kModelData + "continuations = 0\n" + kUniform + "[metrics]\npareto = [\"gen_bleu4\"]\n"),
            "'gen_bleu4' compares greedy continuations, but [data] continuations = 0"));
  CHECK(has(config_error(kModelData + "continuation_tokens = 3\n" + kUniform + "[metrics]\nreport = [\"gen_bleu4\"]\n"),
            "'gen_bleu4' needs continuations of at least 4 tokens, but [data] continuation_tokens = 3"));
  CHECK(has(config_error("[data]\nsource = \"model\"\nmodel = \"data/models/llama-bytes\"\n" + kUniform),
            "give exactly one of `text`, `token_file`, `texts` and `token_files`"));
  CHECK(has(config_error(kModelData + "token_file = \"x.npy\"\n" + kUniform), "token_file"));
  const std::string ids_data =
      "[data]\nsource = \"model\"\nmodel = \"data/models/llama-bytes\"\ntoken_file = \"data/text/eval_kjv_revelation.txt\"\n";
  CHECK(has(config_error(ids_data + "add_bos = true\n" + kUniform),
            "test.toml:5: data.add_bos: only used with `text` (a token_file's ids are used as written)"));
  CHECK(has(config_error(ids_data + "tokenizer = \"bytes\"\n" + kUniform), "data.tokenizer: only used with `text`"));
  CHECK(has(config_error(kModelData + "path = \"x\"\n" + kUniform), "not used with source = \"model\""));
  CHECK(has(config_error(kModelData + "max_tokens = 32\ncontinuation_prompt = 30\n" + kUniform),
            "continuation_prompt + continuation_tokens (50) exceeds max_tokens 32"));
  CHECK(has(config_error("[data]\nsource = \"model\"\nmodel = \"data/models/nope\"\ntext = \"x.txt\"\n" + kUniform),
            "data path 'data/models/nope' not found"));
  CHECK(has(config_error(kModelData + "continuatons = 3\n" + kUniform), "unknown key 'data.continuatons' (did you mean 'continuations'?)"));
  CHECK(has(config_error("[data]\nsource = \"modle\"\n" + kUniform), "must be \"file\", \"synthetic\" or \"model\""));
}

TEST_CASE("a model sweep: PPL ratio 1 for a lossless cache, worse at fewer bits, thread-count independent") {
  ExperimentSpec spec = parse(kModelData +
                              "max_tokens = 96\ncontinuations = 2\ncontinuation_prompt = 32\ncontinuation_tokens = 8\n"
                              "[[strategy]]\ntype = \"uniform\"\nformat = [\"keep-fp32\", \"keep-fp16\", "
                              "\"int2-asym-g32\", \"int8-asym-g32\", \"int4-asym-g48\"]\n");
  const auto model = build_model_evaluator(spec.data);
  CHECK(model->recording().tokens == 96);
  CHECK(model->prompt_lengths() == std::vector<int64_t>{32, 88});
  const std::vector<SweepPoint> points = expand_sweep(spec);
  auto index = [&](const std::string& m) {
    return static_cast<size_t>(std::find(spec.metrics.report.begin(), spec.metrics.report.end(), m) -
                               spec.metrics.report.begin());
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const std::vector<PointResult> two = run_sweep(spec, model->recording(), points, nullptr, nullptr, nullptr, model.get());
  omp_set_num_threads(1);
  const std::vector<PointResult> one = run_sweep(spec, model->recording(), points, nullptr, nullptr, nullptr, model.get());
  omp_set_num_threads(saved);
  REQUIRE(two.size() == 5);
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(two[i].ok);
    CHECK(two[i].metrics == one[i].metrics);
  }
  const PointResult &fp32 = two[0], &fp16 = two[1], &int2 = two[2], &int8 = two[3];
  CHECK(fp32.metrics[index("ppl_ratio")] == 1.0);
  CHECK(fp32.metrics[index("gen_token_match")] == 1.0);
  CHECK(fp32.metrics[index("gen_bleu4")] == doctest::Approx(1.0));
  CHECK(fp32.metrics[index("attn_kl_mean")] == 0.0);
  CHECK(std::fabs(fp16.metrics[index("ppl_ratio")] - 1.0) < 1e-3);
  CHECK(int2.metrics[index("ppl_ratio")] > int8.metrics[index("ppl_ratio")]);
  CHECK(int2.metrics[index("next_token_kl_mean")] > int8.metrics[index("next_token_kl_mean")]);
  CHECK(int2.metrics[index("same_top_rate")] < 1.0);
  // A point whose plan is invalid fails alone, naming itself.
  CHECK(!two[4].ok);
  CHECK(has(two[4].error, "uniform(format=int4-asym-g48)"));
  CHECK(has(two[4].error, "group size 48 does not divide head_dim 64"));

  // Model metrics alone: the simulator's layer tasks are skipped, values are unchanged.
  ExperimentSpec only = spec;
  only.metrics.report = {"ppl_ratio", "gen_bleu4_research"};
  const std::vector<PointResult> r = run_sweep(only, model->recording(), points, nullptr, nullptr, nullptr, model.get());
  CHECK(r[2].metrics[0] == int2.metrics[index("ppl_ratio")]);
  CHECK(r[2].metrics[1] == int2.metrics[index("gen_bleu4_research")]);
  // Without the evaluator, model metrics are a config error.
  CHECK_THROWS_AS(run_sweep(only, model->recording(), points, nullptr, nullptr), ConfigError);
}
