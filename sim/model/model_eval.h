// Model-level evaluation of KV-cache plans (methods.md §4, model level).
//
// A ModelEvaluator runs the exact (unquantized) model once on a token sequence and
// keeps what every plan is compared against: the logits, the recording of what
// attention consumed (what strategies build plans from), and the greedy
// continuations of a few prompts, and, with an answer task, the exact cache's answers.
// evaluate(plan) then repeats them with the plan's quantized cache and returns the
// raw model statistics (ModelStats) that the metric table reduces to PPL, PPL ratio,
// next-token KL, same-top rate, token match, BLEU and answer accuracy.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/metrics/model_metrics.h"
#include "sim/model/answer_task.h"
#include "sim/model/transformer.h"
#include "sim/plan.h"
#include "sim/recording.h"

namespace kvb {

// Where the evaluated tokens come from.
struct TokenSource {
  std::filesystem::path text;        // a text file, tokenized with `tokenizer`, or
  std::filesystem::path token_file;  // token ids: .npy or whitespace-separated text
  std::string tokenizer = "bytes";   // "bytes" or the path of a tokenizer.json (GPT-2 BPE)
  std::optional<bool> add_bos;       // prepend the model's bos_token_id; default: yes for bytes, no for BPE
  int64_t max_tokens = 0;            // keep the first N tokens (0 = all)
};

// The token ids for a model (BOS from its config). Errors name the file; an empty
// result is an error.
std::vector<int64_t> load_tokens(const TokenSource& source, const ModelConfig& config);

// Greedy continuations: `count` prompts, each a prefix of the evaluated sequence, of
// lengths spread evenly from `prompt` to T - `tokens` (so every continuation stays
// within the T positions the plan was built for), each continued by `tokens` tokens.
struct ContinuationSpec {
  int64_t count = 0;
  int64_t prompt = 64;
  int64_t tokens = 20;
};

class ModelEvaluator {
 public:
  // Runs the exact model on `tokens` (teacher forcing with capture, then the
  // continuations, then every problem of `task` when given). Throws
  // kvb::ConfigError when the continuations do not fit.
  ModelEvaluator(std::shared_ptr<const Transformer> model, std::vector<int64_t> tokens, ContinuationSpec continuations,
                 std::string source_description, std::shared_ptr<const AnswerTask> task = nullptr);

  const Transformer& model() const { return *model_; }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  const Recording& recording() const { return recording_; }
  const RowMatrix& base_logits() const { return base_logits_; }  // [T, vocab]
  const std::vector<double>& base_nll() const { return base_nll_; }  // [T - 1]
  const std::vector<int64_t>& prompt_lengths() const { return prompt_lengths_; }
  const std::vector<std::vector<int64_t>>& base_continuations() const { return base_continuations_; }
  const AnswerTask* task() const { return task_.get(); }
  // The exact cache's run of each task problem (empty without a task).
  const std::vector<AnswerTask::Run>& base_answers() const { return base_answers_; }

  // The quantized run: teacher forcing, the same continuations and the task's
  // problems with the plan's cache, compared with the exact run. Const and thread-safe. `logits_out`, when
  // given, receives the quantized logits [T, vocab]. `positions` (sorted), when given,
  // restricts the position-level statistics to those query positions t (each
  // predicting token t + 1; t = T - 1 has no target), e.g. to leave out the positions
  // strategies calibrated on; the whole sequence is still run.
  ModelStats evaluate(const Plan& plan, uint64_t seed, RowMatrix* logits_out = nullptr,
                      const std::vector<int64_t>* positions = nullptr) const;

 private:
  std::shared_ptr<const Transformer> model_;
  std::vector<int64_t> tokens_;
  ContinuationSpec continuation_spec_;
  Recording recording_;
  RowMatrix base_logits_;
  std::vector<double> base_nll_;
  std::vector<int64_t> prompt_lengths_;
  std::vector<std::vector<int64_t>> base_continuations_;
  std::shared_ptr<const AnswerTask> task_;
  std::vector<AnswerTask::Run> base_answers_;
};

// -log softmax(logits[t])[tokens[t + 1]] for t = 0 .. T-2.
std::vector<double> next_token_nll(const RowMatrix& logits, const std::vector<int64_t>& tokens);

// Recordings hold full causal attention (every query t attends to all j <= t). A
// model with sliding-window attention (Mistral, Qwen2's use_sliding_window) attends
// to t - W < j <= t only, so its recording is exact only while T <= W: throws
// kvb::ConfigError, naming the model, the layer and W, when `tokens` exceeds a layer's
// window.
void check_full_causal_attention(const ModelConfig& config, int64_t tokens);

// The Recording of an exact run's capture (recording.h layout), positions 0..T-1.
// Throws through check_full_causal_attention() for a sliding-window model beyond W.
Recording recording_from_capture(const ModelConfig& config, std::vector<LayerTensors> layers,
                                 const std::vector<int64_t>& tokens, const std::string& source);

}  // namespace kvb
