#include "sim/model/model_eval.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/input_file.h"
#include "sim/model/rope_scaling.h"
#include "sim/model/tokenizer.h"

namespace kvb {

namespace fs = std::filesystem;

std::vector<int64_t> load_tokens(const TokenSource& src, const ModelConfig& config) {
  std::vector<int64_t> ids;
  std::string where;
  if (!src.token_file.empty()) {
    where = src.token_file.string();
    ids = read_token_ids(src.token_file);
    // Named here, with the file, rather than later by the forward pass with only an index.
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= config.vocab_size)
        throw Error(where + ": token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                    " is outside the vocabulary of " + config.dir.string() + " (vocab_size " +
                    std::to_string(config.vocab_size) + " in " + config.config_file.string() + ")");
  } else if (!src.text.empty()) {
    where = src.text.string();
    if (fs::is_directory(src.text)) throw Error(where + ": is a directory, expected a text file");
    const bool bytes = src.tokenizer == "bytes";
    const bool add_bos = src.add_bos.value_or(bytes);
    if (add_bos && !config.bos_token_id)
      throw ConfigError(where + ": a BOS token is to be prepended, but " + config.config_file.string() +
                        " has no bos_token_id");
    // Only as much of the text as max_tokens needs is read (a text may be far longer).
    const size_t wanted = src.max_tokens > 0 ? static_cast<size_t>(src.max_tokens) - (add_bos ? 1 : 0) : SIZE_MAX;
    if (bytes) {
      if (config.vocab_size < 256)
        throw ConfigError(where + ": the byte tokenizer needs a vocabulary of at least 256 ids, but " +
                          config.config_file.string() + " has vocab_size " + std::to_string(config.vocab_size));
      ids = ByteTokenizer(add_bos ? config.bos_token_id : std::nullopt)
                .encode(read_file_prefix(src.text, "a text file", wanted));  // one token per byte
    } else {
      const std::unique_ptr<BpeTokenizer> bpe = BpeTokenizer::load(src.tokenizer);
      // Doubling prefixes until the tokens of a stable prefix (one whose tokens no
      // later text changes) are enough, or the file ends.
      size_t read = std::max<size_t>(size_t{1} << 16, wanted < SIZE_MAX / 64 ? wanted * 16 : SIZE_MAX);
      for (;;) {
        bool at_end = false;
        const std::string text = read_file_prefix(src.text, "a text file", read, &at_end);
        if (at_end) {
          ids = bpe->encode(text);
          break;
        }
        const size_t stable = bpe->stable_prefix_length(text);
        if (stable > 0) {
          ids = bpe->encode(std::string_view(text).substr(0, stable));
          if (ids.size() >= wanted) break;
        }
        read = read < SIZE_MAX / 2 ? read * 2 : SIZE_MAX;
      }
      if (add_bos) ids.insert(ids.begin(), *config.bos_token_id);
    }
  } else {
    throw ConfigError("no tokens to evaluate: give a text file or a token id file");
  }
  if (src.max_tokens > 0 && static_cast<int64_t>(ids.size()) > src.max_tokens) ids.resize(static_cast<size_t>(src.max_tokens));
  if (ids.size() < 2) throw Error(where + ": " + std::to_string(ids.size()) + " token(s); evaluation needs at least 2");
  return ids;
}

std::vector<double> next_token_nll(const RowMatrix& logits, const std::vector<int64_t>& tokens) {
  std::vector<double> nll;
  std::vector<double> lp;
  for (int64_t t = 0; t + 1 < logits.rows(); ++t) {
    log_softmax(logits.row(t).data(), logits.cols(), lp);
    nll.push_back(-lp[static_cast<size_t>(tokens[static_cast<size_t>(t + 1)])]);
  }
  return nll;
}

void check_full_causal_attention(const ModelConfig& config, int64_t tokens) {
  for (size_t l = 0; l < config.sliding_window.size(); ++l) {
    const int64_t w = config.sliding_window[l];
    if (w <= 0 || tokens <= w) continue;
    throw ConfigError(config.dir.string() + ": layer " + std::to_string(l) +
                      " uses sliding-window attention over the last W = " + std::to_string(w) +
                      " tokens (config.json sliding_window), but " + std::to_string(tokens) +
                      " tokens are evaluated: a recording's attention (attention-level metrics, strategy statistics, "
                      "the CUDA backend) is full causal attention, which this model does not compute beyond W tokens; "
                      "evaluate at most " + std::to_string(w) + " tokens ([data] max_tokens in a config, --max-tokens for kvbudget record and eval)");
  }
}

Recording recording_from_capture(const ModelConfig& config, std::vector<LayerTensors> layers,
                                 const std::vector<int64_t>& tokens, const std::string& source) {
  check_full_causal_attention(config, static_cast<int64_t>(tokens.size()));
  Recording rec;
  rec.name = config.dir.filename().string();
  rec.source = source;
  rec.q_heads = config.q_heads;
  rec.kv_heads = config.kv_heads;
  rec.head_dim = config.head_dim;
  rec.tokens = static_cast<int64_t>(tokens.size());
  rec.layer_ids.resize(layers.size());
  std::iota(rec.layer_ids.begin(), rec.layer_ids.end(), 0);
  rec.layers = std::move(layers);
  rec.token_ids = tokens;
  rec.positions.resize(tokens.size());
  std::iota(rec.positions.begin(), rec.positions.end(), int64_t{0});
  rec.rope.applied = config.rope.enabled;
  rec.rope.theta = config.rope.theta;
  if (config.rope.enabled && config.rope.type != "default")
    rec.rope.inv_freq = rope_inverse_frequencies(config.rope, config.head_dim);
  rec.metadata["model"] = config.dir.filename().string();
  rec.metadata["architecture"] = config.architecture;
  rec.metadata["tokens"] = std::to_string(tokens.size());
  rec.metadata["layout"] = "query/key/value: [heads, tokens, head_dim]; attn_output: [tokens, heads*head_dim]";
  rec.metadata["rope"] = config.rope.enabled ? "key/query are post-RoPE; key_pre_rope is pre-RoPE" : "none";
  rec.validate();
  return rec;
}

ModelEvaluator::ModelEvaluator(std::shared_ptr<const Transformer> model, std::vector<int64_t> tokens,
                               ContinuationSpec continuations, std::string source_description,
                               std::shared_ptr<const AnswerTask> task)
    : model_(std::move(model)), tokens_(std::move(tokens)), continuation_spec_(continuations), task_(std::move(task)) {
  const int64_t T = static_cast<int64_t>(tokens_.size());
  check_full_causal_attention(model_->config(), T);  // before any forward pass
  const ContinuationSpec& c = continuation_spec_;
  if (c.count < 0 || c.prompt < 1 || c.tokens < 1)
    throw ConfigError("continuations: count must be >= 0, prompt and tokens >= 1");
  if (c.count > 0 && c.prompt + c.tokens > T)
    throw ConfigError("continuations: a prompt of " + std::to_string(c.prompt) + " tokens plus " +
                      std::to_string(c.tokens) + " generated tokens exceeds the " + std::to_string(T) +
                      " evaluated tokens");
  for (int64_t i = 0; i < c.count; ++i) {
    const int64_t span = T - c.tokens - c.prompt;
    const int64_t offset = c.count > 1 ? (i * span + (c.count - 1) / 2) / (c.count - 1) : 0;
    prompt_lengths_.push_back(c.prompt + offset);
  }

  std::vector<LayerTensors> capture;
  ExtendOptions opt;
  opt.capture = &capture;
  base_logits_ = model_->forward(tokens_, opt);
  base_nll_ = next_token_nll(base_logits_, tokens_);
  recording_ = recording_from_capture(model_->config(), std::move(capture), tokens_, source_description);
  for (int64_t p : prompt_lengths_)
    base_continuations_.push_back(greedy_continuation(
        *model_, std::span<const int64_t>(tokens_.data(), static_cast<size_t>(p)), c.tokens, CacheQuantization{}));
  if (task_)
    for (const AnswerProblem& problem : task_->problems()) base_answers_.push_back(task_->run(*model_, problem, {}));
}

ModelStats ModelEvaluator::evaluate(const Plan& plan, uint64_t seed, RowMatrix* logits_out,
                                    const std::vector<int64_t>* positions) const {
  const CacheQuantization cache{&plan, seed};
  ExtendOptions opt;
  opt.cache = cache;
  const RowMatrix logits = model_->forward(tokens_, opt);
  ModelStats s;
  std::vector<double> lp, lq;
  std::vector<int64_t> all;
  if (!positions) {
    all.resize(static_cast<size_t>(logits.rows()));
    std::iota(all.begin(), all.end(), int64_t{0});
    positions = &all;
  }
  for (const int64_t t : *positions) {
    if (t < 0 || t + 1 >= logits.rows()) continue;
    const float* base = base_logits_.row(t).data();
    const float* quant = logits.row(t).data();
    log_softmax(base, logits.cols(), lp);
    log_softmax(quant, logits.cols(), lq);
    const size_t next = static_cast<size_t>(tokens_[static_cast<size_t>(t + 1)]);
    s.nll.push_back(-lq[next]);
    s.nll_base.push_back(base_nll_[static_cast<size_t>(t)]);
    s.kl.push_back(kl_from_log_probs(lp, lq));
    s.same_top.push_back(argmax(base, logits.cols()) == argmax(quant, logits.cols()) ? 1 : 0);
  }
  for (int64_t p : prompt_lengths_)
    s.continuations.push_back(greedy_continuation(
        *model_, std::span<const int64_t>(tokens_.data(), static_cast<size_t>(p)), continuation_spec_.tokens, cache));
  s.continuations_base = base_continuations_;
  if (task_)
    for (size_t i = 0; i < task_->problems().size(); ++i) {
      s.answers_correct.push_back(task_->run(*model_, task_->problems()[i], cache).correct ? 1 : 0);
      s.answers_correct_base.push_back(base_answers_[i].correct ? 1 : 0);
    }
  if (logits_out) *logits_out = logits;
  return s;
}

}  // namespace kvb
