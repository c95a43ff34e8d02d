// Answer tasks (sim/model/answer_task.*): task files, answer extraction, greedy
// generation that stops at the answer, answer_accuracy with its Wilson interval and
// the flips; and phases that switch where the marker is generated (Plan::unit_at with
// second_phase, Transformer::extend).
#include <nlohmann/json.hpp>

#include <fstream>

#include "sim/core/error.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/model/answer_task.h"
#include "sim/model/model_eval.h"
#include "sim/model/tokenizer.h"
#include "strategy_test_util.h"
#include "test_util.h"

using namespace kvb;
using namespace kvb::test;

namespace {

constexpr int64_t kEndThink = 258;  // reasoning-bytes' </think>

const std::filesystem::path reasoning_dir() { return data_dir() / "models" / "reasoning-bytes"; }

std::shared_ptr<const Transformer> reasoning_model() {
  static std::shared_ptr<const Transformer> m = Transformer::load(reasoning_dir());
  return m;
}

AnswerTaskSpec reasoning_task_spec() {
  AnswerTaskSpec s;
  s.file = data_dir() / "tasks" / "reasoning_eval.npz";
  s.answer_regex = "The final value is (-?[0-9]+)\\.";
  s.answer_after = kEndThink;
  s.max_new_tokens = 400;
  return s;
}

std::vector<int64_t> bytes_of(const std::string& text) {
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// [0, boundary) keep-fp32 (exact), [boundary, tokens) `second` for keys and values.
Plan two_phase_plan(int64_t boundary, int64_t tokens, const std::string& second) {
  const ModelConfig& c = reasoning_model()->config();
  Plan p(c.layers, c.kv_heads, tokens, c.head_dim);
  for (int64_t l = 0; l < c.layers; ++l)
    for (int64_t g = 0; g < c.kv_heads; ++g)
      for (Kind kind : {Kind::Key, Kind::Value})
        p.unit(l, g, kind).segments = {Segment{0, boundary, make_format("keep-fp32")},
                                       Segment{boundary, tokens, make_format(second)}};
  p.set_phase_boundary(boundary);
  REQUIRE(p.check().empty());
  return p;
}

}  // namespace

TEST_CASE("an .npz task: problems in natural name order, a prefix and a count select them") {
  const ModelConfig& config = reasoning_model()->config();
  const AnswerTask all(reasoning_task_spec(), config);
  REQUIRE(all.problems().size() == 58);
  CHECK(all.problems()[0].name == "long_0");
  CHECK(all.problems()[8].name == "short_0");
  CHECK(all.problems()[10].name == "short_2");  // not short_10
  CHECK(all.problems()[8].expected == "255");   // reasoning_eval.txt's first problem
  CHECK(all.problems()[8].prompt.front() == 256);
  CHECK(all.problems()[8].prompt.back() == 257);  // the prompt ends with <think>
  AnswerTaskSpec spec = reasoning_task_spec();
  spec.problem_prefix = "short_";
  spec.max_problems = 3;
  const AnswerTask some(spec, config);
  REQUIRE(some.problems().size() == 3);
  CHECK(some.problems()[2].name == "short_2");
  CHECK(some.describe().find("3 problems, answers by /The final value is (-?[0-9]+)\\./ after token 258") !=
        std::string::npos);
}

TEST_CASE("the answer is the regex's first match after the marker, group 1 or the whole match") {
  const AnswerTask task(reasoning_task_spec(), reasoning_model()->config());
  std::vector<int64_t> gen = bytes_of("7+5=12. The final value is 99.");  // thinking that mimics the answer
  gen.push_back(kEndThink);
  const std::vector<int64_t> answer = bytes_of("\nA: The values are 12. The final value is 12.\n");
  gen.insert(gen.end(), answer.begin(), answer.end());
  CHECK(task.extract(gen) == std::optional<std::string>("12"));
  // No marker generated, or no match after it: no answer.
  CHECK_FALSE(task.extract(bytes_of("The final value is 12.")).has_value());
  std::vector<int64_t> unfinished = {kEndThink};
  const std::vector<int64_t> part = bytes_of("\nA: The final value is 12");  // no period yet
  unfinished.insert(unfinished.end(), part.begin(), part.end());
  CHECK_FALSE(task.extract(unfinished).has_value());
  // Without answer_after the whole generated text is searched; without a group the
  // whole match is the answer.
  const std::filesystem::path dir = scratch_dir("answer_task_extract");
  std::ofstream(dir / "t.jsonl") << "{\"prompt\": \"And I saw\", \"answer\": \"heaven\"}\n";
  AnswerTaskSpec spec;
  spec.file = dir / "t.jsonl";
  spec.answer_regex = "[a-z]+";
  const AnswerTask whole(spec, reasoning_model()->config());
  CHECK(whole.extract(bytes_of(" heaven and")) == std::optional<std::string>("heaven"));
}

TEST_CASE("a JSONL task: text or id prompts, string or number answers, and clear errors") {
  const ModelConfig& config = reasoning_model()->config();
  const std::filesystem::path dir = scratch_dir("answer_task_jsonl");
  std::ofstream(dir / "t.jsonl") << "{\"prompt\": \"Q: \", \"answer\": \"x\", \"name\": \"first\"}\n\n"
                                 << "{\"prompt_ids\": [256, 81, 58], \"answer\": 42}\n";
  AnswerTaskSpec spec;
  spec.file = dir / "t.jsonl";
  spec.answer_regex = "(x)";
  const AnswerTask task(spec, config);
  REQUIRE(task.problems().size() == 2);
  CHECK(task.problems()[0].name == "first");
  CHECK(task.problems()[0].prompt == std::vector<int64_t>{256, 'Q', ':', ' '});  // BOS added for bytes
  CHECK(task.problems()[1].name == "line 3");
  CHECK(task.problems()[1].expected == "42");

  auto error_of = [&](const std::string& line, const std::string& regex = "(x)") {
    std::ofstream(dir / "bad.jsonl") << "{\"prompt\": \"ok\", \"answer\": \"y\"}\n" << line << "\n";
    AnswerTaskSpec s = spec;
    s.file = dir / "bad.jsonl";
    s.answer_regex = regex;
    try {
      AnswerTask t(s, config);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of("{\"prompt\": \"no answer\"}").find("bad.jsonl:2: no expected answer") != std::string::npos);
  CHECK(error_of("{\"prompt\": \"x\", \"answr\": 1}").find("bad.jsonl:2: unknown key \"answr\"") != std::string::npos);
  CHECK(error_of("{\"prompt_ids\": [300], \"answer\": 1}").find("token id 300 at index 0 is outside the vocabulary") !=
        std::string::npos);
  CHECK(error_of("not json").find("bad.jsonl:2: not JSON") != std::string::npos);
  CHECK(error_of("", "(unclosed").find("answer_regex /(unclosed/ does not compile") != std::string::npos);
  spec.file = dir / "missing.jsonl";
  CHECK_THROWS_WITH_AS(AnswerTask(spec, config), doctest::Contains("missing.jsonl: no such task file"), ConfigError);
  spec.file = dir / "t.txt";
  std::ofstream(spec.file) << "x\n";
  CHECK_THROWS_WITH_AS(AnswerTask(spec, config), doctest::Contains("a task file is .npz or .jsonl"), ConfigError);
}

TEST_CASE("a JSONL task's text prompts with a Llama 3 tokenizer get BOS once, as its template; Qwen2's none") {
  // The committed Llama 3 / Qwen2 tokenizers (data/tokenizers/) and the ids Hugging Face
  // tokenizers gives on their first sample text.
  ModelConfig config = reasoning_model()->config();
  const std::filesystem::path dir = scratch_dir("answer_task_llama_tokenizer");
  const std::filesystem::path llama3 = data_dir() / "tokenizers" / "llama3";
  nlohmann::json ref = nlohmann::json::parse(std::ifstream(llama3 / "reference_ids.json"));
  nlohmann::json line = {{"prompt", ref["cases"][0]["text"]}, {"answer", "x"}};
  std::ofstream(dir / "t.jsonl") << line.dump() << "\n";
  config.vocab_size = 2048;
  config.bos_token_id = ref["cases"][0]["ids"][0].get<int64_t>();
  AnswerTaskSpec spec;
  spec.file = dir / "t.jsonl";
  spec.answer_regex = "(x)";
  spec.tokenizer = (llama3 / "tokenizer.json").string();
  CHECK(AnswerTask(spec, config).problems()[0].prompt == ref["cases"][0]["ids"].get<std::vector<int64_t>>());
  const std::filesystem::path qwen2 = data_dir() / "tokenizers" / "qwen2";
  ref = nlohmann::json::parse(std::ifstream(qwen2 / "reference_ids.json"));
  spec.tokenizer = (qwen2 / "tokenizer.json").string();
  CHECK(AnswerTask(spec, config).problems()[0].prompt == ref["cases"][0]["ids"].get<std::vector<int64_t>>());
}

TEST_CASE("an answer is read past generated ids the tokenizer has no token for (a padded vocabulary)") {
  // Qwen2's checkpoints have 151936 ids for 151665 tokens: a generated id beyond the
  // tokenizer is skipped, as tokenizers' decode skips it, not an error that ends the run.
  const std::filesystem::path dir = scratch_dir("answer_task_padded_vocab");
  std::ofstream(dir / "t.jsonl") << "{\"prompt\": \"hi\", \"answer\": \"7\"}\n";
  const std::filesystem::path llama3 = data_dir() / "tokenizers" / "llama3";
  ModelConfig config = reasoning_model()->config();
  config.vocab_size = 4096;
  AnswerTaskSpec spec;
  spec.file = dir / "t.jsonl";
  spec.answer_regex = "= ([0-9])";
  spec.tokenizer = (llama3 / "tokenizer.json").string();
  const AnswerTask task(spec, config);
  const auto tok = BpeTokenizer::load(llama3 / "tokenizer.json");
  const int64_t beyond = tok->vocab_size() + 10;
  REQUIRE(!tok->knows(beyond));
  std::vector<int64_t> gen = tok->encode("x = ");
  gen.push_back(beyond);
  const std::vector<int64_t> seven = tok->encode("7");
  gen.insert(gen.end(), seven.begin(), seven.end());
  CHECK(task.extract(gen) == std::optional<std::string>("7"));
}

TEST_CASE("the reasoning model answers with the exact cache and stops at the answer") {
  AnswerTaskSpec spec = reasoning_task_spec();
  spec.problem_prefix = "short_";
  spec.max_problems = 3;
  const AnswerTask task(spec, reasoning_model()->config());
  for (const AnswerProblem& p : task.problems()) {
    const AnswerTask::Run r = task.run(*reasoning_model(), p, {});
    CAPTURE(p.name);
    CHECK(r.correct);  // 100 % with the exact cache (data/SOURCES.md)
    CHECK(r.answer == std::optional<std::string>(p.expected));
    CHECK(r.generated.back() == '.');  // stopped right where the regex matched
    CHECK(std::count(r.generated.begin(), r.generated.end(), kEndThink) == 1);
  }
}

TEST_CASE("phases switch where the marker is generated, or where the prompt holds it") {
  // Plan::unit_at with second_phase: the plan's boundary is 6 of 10 tokens.
  Plan small(1, 1, 10, 32);
  small.unit(0, 0, Kind::Key).segments = {Segment{0, 6, make_format("int8-asym-g32")},
                                          Segment{6, 10, make_format("int2-asym-g32")}};
  small.set_phase_boundary(6);
  auto formats = [](const UnitPlan& u) {
    std::vector<std::tuple<int64_t, int64_t, std::string>> out;
    for (const Segment& s : u.segments) out.emplace_back(s.begin, s.end, s.format->name());
    return out;
  };
  using F = std::vector<std::tuple<int64_t, int64_t, std::string>>;
  CHECK(formats(small.unit_at(0, 0, Kind::Key, 14, std::nullopt)) == F{{0, 14, "int8-asym-g32"}});
  CHECK(formats(small.unit_at(0, 0, Kind::Key, 14, 9)) == F{{0, 9, "int8-asym-g32"}, {9, 14, "int2-asym-g32"}});
  CHECK(formats(small.unit_at(0, 0, Kind::Key, 5, 3)) == F{{0, 3, "int8-asym-g32"}, {3, 5, "int2-asym-g32"}});
  CHECK(formats(small.unit_at(0, 0, Kind::Key, 12, 6)) == formats(small.unit_at(0, 0, Kind::Key, 12)));

  // The phase strategy records its marker; a fraction leaves the plan positional.
  const Recording& rec = strategy_recording();  // marker 257 at token 72
  RecordingStats stats(rec, calibration_of(rec));
  const std::map<std::string, ParamValue> formats_of_phases = {{"first_format", std::string("int4-asym-g32")},
                                                              {"second_format", std::string("int2-asym-g32")}};
  auto with = [&](std::map<std::string, ParamValue> v) {
    v.insert(formats_of_phases.begin(), formats_of_phases.end());
    return build_plan("phase", v, rec, stats);
  };
  CHECK(with({{"phase_marker", int64_t{257}}}).phase_marker() == std::optional<int64_t>(257));
  CHECK_FALSE(with({}).phase_marker().has_value());

  // Generation with the reasoning model: the first phase is exact, the second int2.
  // The plan's boundary (token 40) lies inside the prompt; its marker is </think>.
  AnswerTaskSpec spec = reasoning_task_spec();
  spec.problem_prefix = "short_";
  spec.max_problems = 1;
  const AnswerTask task(spec, reasoning_model()->config());
  const std::vector<int64_t>& prompt = task.problems()[0].prompt;
  const AnswerTask::Run exact = task.run(*reasoning_model(), task.problems()[0], {});
  const auto n = static_cast<int64_t>(exact.generated.size());
  const int64_t marker = static_cast<int64_t>(prompt.size()) +
                         (std::find(exact.generated.begin(), exact.generated.end(), kEndThink) - exact.generated.begin());
  Plan by_marker = two_phase_plan(40, 100, "int2-asym-g32");
  by_marker.set_phase_marker(kEndThink);
  const Plan positional = two_phase_plan(40, 100, "int2-asym-g32");
  const Plan switched_at_marker = two_phase_plan(marker, marker + 8, "int2-asym-g32");  // positional, boundary m

  const std::vector<int64_t> gen = greedy_continuation(*reasoning_model(), prompt, n, {&by_marker, 0});
  // Until the marker is generated every token is in the (exact) first phase ...
  const size_t until_marker = static_cast<size_t>(marker - static_cast<int64_t>(prompt.size())) + 1;
  CHECK(std::equal(gen.begin(), gen.begin() + static_cast<long>(until_marker), exact.generated.begin()));
  // ... and from the generated marker on, tokens are in the answer phase: the same
  // generation as a plan whose boundary is that position.
  CHECK(gen == greedy_continuation(*reasoning_model(), prompt, n, {&switched_at_marker, 0}));
  // The recording's boundary, taken positionally, quantizes the prompt's later tokens
  // and the thinking: another generation.
  CHECK(greedy_continuation(*reasoning_model(), prompt, n, {&positional, 0}) != gen);

  // A prompt that already holds the marker switches there.
  std::vector<int64_t> with_marker = prompt;
  with_marker.insert(with_marker.end(), exact.generated.begin(), exact.generated.begin() + static_cast<long>(until_marker));
  REQUIRE(with_marker.back() == kEndThink);
  const int64_t rest = n - static_cast<int64_t>(until_marker);
  CHECK(greedy_continuation(*reasoning_model(), with_marker, rest, {&by_marker, 0}) ==
        greedy_continuation(*reasoning_model(), with_marker, rest, {&switched_at_marker, 0}));
}

TEST_CASE("answer_accuracy, its Wilson interval and the flips against the exact cache") {
  ErrorStats s;
  CHECK(std::isnan(find_metric("answer_accuracy")->compute(s)));
  s.model.answers_correct = {1, 1, 0, 1, 1, 1, 1, 0, 1, 1};
  s.model.answers_correct_base = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  CHECK(find_metric("answer_accuracy")->compute(s) == doctest::Approx(0.8));
  const Interval ci = find_metric("answer_accuracy")->interval(s);
  CHECK(ci.lo == doctest::Approx(0.4901624715).epsilon(1e-8));  // Wilson, z = 1.959964
  CHECK(ci.hi == doctest::Approx(0.9433178485).epsilon(1e-8));
  CHECK(find_metric("flips_right_to_wrong")->compute(s) == 2);
  CHECK(find_metric("flips_wrong_to_right")->compute(s) == 1);
  CHECK(find_metric("answer_accuracy")->has_interval());
  ErrorStats twice = s;  // merging pools problems (a model result of several texts)
  twice.model.merge(s.model);
  CHECK(find_metric("flips_right_to_wrong")->compute(twice) == 4);
  CHECK(find_metric("answer_accuracy")->compute(twice) == doctest::Approx(0.8));
  CHECK(wilson_interval(0, 5).lo == 0);
  CHECK(wilson_interval(5, 5).hi == doctest::Approx(1.0));
}

TEST_CASE("ModelEvaluator scores the task's answers with the exact and the quantized cache") {
  TokenSource src;
  src.token_file = data_dir() / "tasks" / "reasoning_trace_ids.txt";
  const std::vector<int64_t> tokens = load_tokens(src, reasoning_model()->config());
  AnswerTaskSpec spec = reasoning_task_spec();
  spec.problem_prefix = "short_";
  spec.max_problems = 2;
  const auto task = std::make_shared<const AnswerTask>(spec, reasoning_model()->config());
  const ModelEvaluator ev(reasoning_model(), tokens, ContinuationSpec{}, "test", task);
  REQUIRE(ev.base_answers().size() == 2);
  const Plan keep = two_phase_plan(100, static_cast<int64_t>(tokens.size()), "keep-fp32");
  ErrorStats s;
  s.model = ev.evaluate(keep, 0);
  CHECK(s.model.answers_correct == std::vector<uint8_t>{1, 1});
  CHECK(s.model.answers_correct_base == std::vector<uint8_t>{1, 1});
  CHECK(find_metric("answer_accuracy")->compute(s) == 1.0);
  CHECK(find_metric("flips_right_to_wrong")->compute(s) == 0);
}
