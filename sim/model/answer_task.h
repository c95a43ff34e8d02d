// Answer tasks (methods.md §4, "Answer accuracy"): prompts with expected answers, run
// by greedy generation with a KV cache (exact or through a Plan), the answer taken
// from the generated text with a regular expression and scored by exact match. This is
// lm-eval-harness's generate-until-and-match (and the research's GSM8K accuracy) for
// any model the simulator runs.
//
// Task files (configs/README.md, [task]):
//  - .npz: arrays NAME_prompt (token ids) and NAME_answer (an integer array of one
//    element, the expected value, compared as its decimal text); other arrays (e.g.
//    NAME_full) are ignored. Problems are ordered by NAME, digit runs compared as
//    numbers (short_2 before short_10).
//  - .jsonl: one JSON object per line: "prompt" (text, tokenized with the task's
//    tokenizer and BOS setting) or "prompt_ids" (token ids), "answer" (a string or a
//    number: the expected text), optionally "name". Blank lines are skipped.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "sim/model/tokenizer.h"
#include "sim/model/transformer.h"

namespace kvb {

struct AnswerTaskSpec {
  std::filesystem::path file;            // .npz or .jsonl
  std::string answer_regex;              // ECMAScript; group 1 (else the whole match) is the answer
  std::optional<int64_t> answer_after;   // token id: the answer is searched after its first generated occurrence
  int64_t max_new_tokens = 256;          // generation stops here at the latest
  int64_t max_problems = 0;              // keep the first N problems (0 = all)
  std::string problem_prefix;            // keep the problems whose name starts with this ("" = all)
  std::string tokenizer = "bytes";       // "bytes" or a tokenizer.json: text prompts and decoding
  std::optional<bool> add_bos;           // text prompts: prepend BOS; default yes for bytes and for a template that starts with special tokens
};

struct AnswerProblem {
  std::string name;             // NAME of the .npz arrays, or the JSONL "name" / "line N"
  std::vector<int64_t> prompt;  // token ids, never empty
  std::string expected;         // the expected answer text
};

class AnswerTask {
 public:
  // Reads the task file and checks it against the model: token ids inside the
  // vocabulary, a learned position table (GPT-2) long enough for prompt +
  // max_new_tokens. Throws kvb::ConfigError naming the file (and line, or array) for a
  // missing file, an unknown extension, a problem without an expected answer, a regex
  // that does not compile, no problems left after the selection.
  AnswerTask(AnswerTaskSpec spec, const ModelConfig& config);

  const AnswerTaskSpec& spec() const { return spec_; }
  const std::vector<AnswerProblem>& problems() const { return problems_; }
  // "data/tasks/x.npz: 8 problems, answers by /regex/ after token 258, <= 256 new tokens"
  std::string describe() const;

  // The answer in `generated` (the new tokens only): the first match of the regex in
  // the text decoded after the first answer_after token (all of it without
  // answer_after); nullopt when the marker or a match is missing.
  std::optional<std::string> extract(const std::vector<int64_t>& generated) const;

  struct Run {
    std::vector<int64_t> generated;   // new tokens, at most max_new_tokens
    std::optional<std::string> answer;
    bool correct = false;             // answer == expected
  };
  // Greedy generation from the problem's prompt with `cache` (phases switch where the
  // marker is generated, Transformer::extend); stops at the model's EOS token, once
  // the answer is found (the regex matches), or after max_new_tokens.
  Run run(const Transformer& model, const AnswerProblem& problem, const CacheQuantization& cache) const;

 private:
  AnswerTaskSpec spec_;
  std::regex regex_;
  std::unique_ptr<Tokenizer> decoder_;
  std::vector<int64_t> eos_;  // ModelConfig::eos_token_ids
  std::vector<AnswerProblem> problems_;
};

}  // namespace kvb
