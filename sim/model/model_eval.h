// Model-level evaluation of KV-cache plans (methods.md §4, model level).
//
// A ModelEvaluator runs the exact (unquantized) model once on a token sequence and
// keeps what every plan is compared against: the logits, the recording of what
// attention consumed (what strategies build plans from), and the greedy
// continuations of a few prompts, and, with an answer task, the exact cache's answers.
// evaluate(plan) then repeats them with the plan's quantized cache and returns the
// raw model statistics (ModelStats) that the metric table reduces to PPL, PPL ratio,
// next-token KL, same-top rate, token match, BLEU and answer accuracy.
//
// Memory is bounded by a window, not by the text (issue 21): per token only scalars are
// kept (the exact run's log-sum-exp, argmax and NLL per position); the exact logits
// [T, vocab] are held only up to ModelEvalOptions::max_held_base_bytes, else kept in a
// file and read a window at a time; evaluate() holds one window of quantized logits.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/core/buffer_pool.h"
#include "sim/metrics/model_metrics.h"
#include "sim/model/answer_task.h"
#include "sim/model/transformer.h"
#include "sim/plan.h"
#include "sim/recording.h"

namespace kvb {

class TensorStore;
class TensorFileStream;

// Where the evaluated tokens come from.
struct TokenSource {
  std::filesystem::path text;        // a text file, tokenized with `tokenizer`, or
  std::filesystem::path token_file;  // token ids: .npy or whitespace-separated text
  std::string tokenizer = "bytes";   // "bytes" or the path of a tokenizer.json (BpeTokenizer: GPT-2, Llama, Qwen2, Mistral)
  std::optional<bool> add_bos;       // prepend the model's bos_token_id; default: yes for bytes and for a tokenizer whose template starts with special tokens (Llama), no for GPT-2 / Qwen2
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

// Chunked evaluation of a long sequence (methods.md §4, "Windows"), like llama.cpp's
// perplexity tool: the T tokens are cut into consecutive, non-overlapping windows of
// n_ctx tokens (the last one shorter, kept when it has at least 2 tokens), each run
// from an empty cache at positions 0..length-1. When the sequence starts with the
// model's BOS token, every window's first token is replaced by BOS (llama.cpp does the
// same); that token is never predicted. Within a window, the query positions t
// (window-local) scored are first_scored() <= t <= length - 2, each predicting
// token t + 1 of the same window.
struct TokenWindow {
  int64_t start = 0;   // index of the window's first token in the sequence
  int64_t length = 0;  // tokens in the window, >= 2
};
enum class ScoreRule {
  All,         // every position of a window but its last (each token after the first is predicted)
  SecondHalf,  // llama.cpp's rule: positions n_ctx/2 .. length-2 (each scored token has >= n_ctx/2 of context)
};
struct WindowSpec {
  int64_t n_ctx = 0;  // tokens per window; 0: one window holding every token
  ScoreRule score = ScoreRule::All;
  // The first window-local query position scored (the last is the window's length - 2).
  int64_t first_scored() const { return score == ScoreRule::SecondHalf && n_ctx > 0 ? n_ctx / 2 : 0; }
};
// "all" / "second_half" (what configs and --score write); throws kvb::ConfigError naming `where`.
ScoreRule parse_score_rule(const std::string& text, const std::string& where);
const char* score_rule_name(ScoreRule rule);
// The windows of a T-token sequence (T >= 2).
std::vector<TokenWindow> token_windows(int64_t tokens, int64_t n_ctx);

// The exact run's logits of every window, saved once and reused by later runs
// (`kvbudget eval --kl-base`, llama.cpp's --kl-divergence-base). A .safetensors file:
// `logits` F32 [T, vocab] (row t: the exact model's logits at sequence position t, as
// its window computed them; a last token no window holds (T = k·n_ctx + 1) gets a row
// of zeros), `input_ids` I64 [T] (the evaluated tokens, before the BOS replacement),
// `logits_checksum` I64 [1] (LogitsChecksum of the logits' rows in order; files written
// before it have none), and metadata kvbudget_kl_base = "1", model (the
// checkpoint's directory name), model_summary (ModelConfig::summary()), vocab_size,
// n_ctx, precision (of the exact run's products, when recorded). Scores read back bit
// for bit. The file is written and read a window of rows at
// a time (KlBaseWriter, KlBaseReader): [T, vocab] is never held for it.
// A checksum of float values in the order they are added, however they are split into
// calls: four lanes (value i in lane i mod 4) of a 64-bit multiply-xor hash of the
// values' bits, then combined. It tells a kl-base file's logits changed after they were
// written (the first window's are also checked against a fresh forward pass).
class LogitsChecksum {
 public:
  void add(const float* values, int64_t count);
  int64_t value() const;

 private:
  uint64_t lanes_[4] = {0x243f6a8885a308d3u, 0x13198a2e03707344u, 0xa4093822299f31d0u, 0x082efa98ec4e6c89u};
  int64_t added_ = 0;
};

struct KlBaseHeader {
  std::vector<int64_t> tokens;  // [T]
  int64_t vocab = 0;
  int64_t n_ctx = 0;
  std::string model, model_summary;
  std::string precision;  // "fp32", "tf32", "bf16" (matmul_precision_name); empty: not recorded
};
// Reads the header and input_ids when opened (throws kvb::Error naming the file when
// it is no kl-base file, or its logits are not F32 [T, vocab]); the logits stay in the
// file until rows are asked for.
class KlBaseReader {
 public:
  explicit KlBaseReader(const std::filesystem::path& path);
  ~KlBaseReader();
  const std::filesystem::path& path() const { return path_; }
  const KlBaseHeader& header() const { return header_; }
  // Logits rows [first, first + count) into dst [count, vocab] (host, row-major).
  // Thread-safe (positioned reads of the open file).
  void read_rows(int64_t first, int64_t count, float* dst) const;
  // The stored LogitsChecksum of the logits; none in files written before it.
  std::optional<int64_t> checksum() const { return checksum_; }

 private:
  std::filesystem::path path_;
  KlBaseHeader header_;
  std::optional<int64_t> checksum_;
  std::unique_ptr<TensorStore> store_;
};
// Written in order: rows 0..T-1 of the logits, a window at a time, then commit()
// writes input_ids and puts the file in place (atomically: until then nothing is at
// `path`; destroyed without commit(), it leaves nothing behind).
class KlBaseWriter {
 public:
  KlBaseWriter(const std::filesystem::path& path, const KlBaseHeader& header);
  ~KlBaseWriter();
  void append_rows(const float* rows, int64_t count);  // [count, vocab]
  void append_zero_rows(int64_t count);
  void commit();

 private:
  std::vector<int64_t> tokens_;
  int64_t vocab_ = 0;
  LogitsChecksum checksum_;
  std::unique_ptr<TensorFileStream> stream_;
};
// The whole file at once (tests, small runs): logits [T, vocab] and the header.
void write_kl_base(const std::filesystem::path& path, const KlBaseHeader& header, const RowMatrix& logits);
// Throws kvb::ConfigError naming `path` and what differs when `base` was not computed
// for these tokens, this vocabulary and these windows, at this precision (when it
// records one).
void check_kl_base(const KlBaseHeader& base, const std::filesystem::path& path, const ModelConfig& config,
                   const std::vector<int64_t>& tokens, int64_t n_ctx, const std::string& precision);

// The most bytes of exact logits [T, vocab] (fp32) a ModelEvaluator holds in memory by
// default: 1 GiB (2093 tokens of Llama-3's 128256-token vocabulary).
constexpr int64_t kDefaultHeldBaseLogitsBytes = int64_t{1} << 30;

struct ModelEvalOptions {
  WindowSpec windows;
  // When set: the exact run's logits are read from this file if it exists (checked
  // with check_kl_base, and the first window, which is run anyway for the recording,
  // against the model), else computed and written there.
  std::filesystem::path kl_base;
  // The precision of the exact run's products ("fp32" on the CPU; the CUDA backend's
  // --precision): a kl-base file records it, and one computed at another is refused.
  std::string precision = "fp32";
  // The exact logits (T × vocab × 4 bytes) are held in memory up to this many bytes;
  // above it they are kept in a file and read back one window at a time: the kl_base
  // file when given, else a temporary file in spill_dir, unlinked once written and
  // opened (its space is freed when the evaluator is destroyed, or the process ends).
  // Results are the same bit for bit either way.
  int64_t max_held_base_bytes = kDefaultHeldBaseLogitsBytes;
  // Where the temporary file of the exact logits goes; empty:
  // std::filesystem::temp_directory_path() ($TMPDIR, else /tmp). It needs T × vocab × 4
  // bytes of space: put it on a disk, not a tmpfs (which is memory).
  std::filesystem::path spill_dir;
  // Called after each window of a forward pass over the sequence: (windows done, windows).
  std::function<void(int64_t, int64_t)> progress;
  // When set, every teacher-forced pass and continuation runs on it (the CUDA forward
  // pass) instead of the host model (its functions must be thread-safe, as evaluate()
  // is); a task's problems still run on the host model.
  ForwardBackend backend;
};

// What evaluate() can hand back of the quantized run besides its statistics, without
// holding its logits [T, vocab].
struct QuantizedRunOutput {
  // Called once per window, in order (window w + 1 starts where w ends), with that
  // window's quantized logits [window.length, vocab] (host, row-major, valid during
  // the call). A last token no window holds has no row.
  std::function<void(const TokenWindow& window, const float* logits)> window_logits;
  // Receives the quantized run's next-token NLL [T - 1] at every sequence position (not
  // only the scored ones), NaN where a window ends: next_token_nll_of() of its logits.
  std::vector<double>* nll = nullptr;
};

class ModelEvaluator {
 public:
  // Runs the exact model on `tokens` (teacher forcing with capture, window by window,
  // then the continuations, then every problem of `task` when given). The recording
  // is the first window's (what strategies build their plans from; with sliding-window
  // layers it holds their windows, see check_full_causal_attention); the continuations
  // are prefixes of the first window. Throws kvb::ConfigError when the continuations
  // do not fit.
  ModelEvaluator(std::shared_ptr<const Transformer> model, std::vector<int64_t> tokens, ContinuationSpec continuations,
                 std::string source_description, std::shared_ptr<const AnswerTask> task = nullptr,
                 ModelEvalOptions options = {});

  const Transformer& model() const { return *model_; }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  const Recording& recording() const { return recording_; }
  // Whether the exact logits [T, vocab] are held in memory (at most
  // ModelEvalOptions::max_held_base_bytes), else kept in a file.
  bool base_logits_held() const { return base_file_ == nullptr; }
  // [T, vocab], each row as its window computed it. Throws kvb::Error when they are not
  // held (base_logits_held()): read them a window at a time with read_base_rows().
  const RowMatrix& base_logits() const;
  // Rows [first, first + count) of the exact logits into dst [count, vocab], from memory
  // or from their file. Thread-safe.
  void read_base_rows(int64_t first, int64_t count, float* dst) const;
  // The file the exact logits are read from when they are not held (the kl_base file,
  // or the unlinked temporary one: its name no longer exists); empty when held.
  std::filesystem::path base_logits_file() const;
  // [T - 1]: -log p_exact(token t+1) at sequence position t; NaN where t is the last
  // position of a window (the next token starts another window).
  const std::vector<double>& base_nll() const { return base_nll_; }
  // The sequence positions t scored (WindowSpec), ascending, and the exact NLL there.
  const std::vector<int64_t>& scored_positions() const { return scored_; }
  // The sequence positions evaluate(plan, seed, logits, positions) compares, ascending:
  // scored_positions() restricted to `positions` (window-local, sorted) when given.
  std::vector<int64_t> compared_positions(const std::vector<int64_t>* positions) const;
  std::vector<double> base_scored_nll() const;
  const std::vector<TokenWindow>& windows() const { return windows_; }
  const WindowSpec& window_spec() const { return options_.windows; }
  // Whether the exact logits came from an existing kl-base file.
  bool kl_base_reused() const { return kl_base_reused_; }
  const std::vector<int64_t>& prompt_lengths() const { return prompt_lengths_; }
  const std::vector<std::vector<int64_t>>& base_continuations() const { return base_continuations_; }
  const AnswerTask* task() const { return task_.get(); }
  // The exact cache's run of each task problem (empty without a task).
  const std::vector<AnswerTask::Run>& base_answers() const { return base_answers_; }

  // The quantized run: teacher forcing (window by window, each from an empty cache
  // quantized by the plan), the same continuations and the task's problems with the
  // plan's cache, compared with the exact run on the scored positions. Const and
  // thread-safe. Each window's quantized logits are compared with the exact ones as
  // soon as they are computed, so a call holds one window of them ([n_ctx, vocab], and
  // one window of exact rows when those are kept in a file), whatever T is.
  // `logits_out`, when given, receives the quantized logits [T, vocab] (then held whole;
  // `output` hands them back a window at a time instead).
  // `positions` (sorted), when given, restricts the position-level statistics to those
  // window-local query positions t (each predicting token t + 1 of its window), in
  // every window, e.g. to leave out the positions strategies calibrated on (in the
  // first window's recording); the whole sequence is still run. With one window these
  // are sequence positions.
  ModelStats evaluate(const Plan& plan, uint64_t seed, RowMatrix* logits_out = nullptr,
                      const std::vector<int64_t>* positions = nullptr, const QuantizedRunOutput* output = nullptr) const;
  // The quantized NLL [T - 1] of `logits` (as evaluate() writes them), NaN at window ends.
  std::vector<double> next_token_nll_of(const RowMatrix& logits) const;

 private:
  // The window-local query positions of `window` compared: first_scored() .. length - 2,
  // those in `positions` (window-local, sorted) when given.
  std::vector<int64_t> scored_in_window(const TokenWindow& window, const std::vector<int64_t>* positions) const;
  // The tokens window w runs on (BOS replacement applied).
  std::vector<int64_t> window_tokens(size_t w) const;
  // Teacher forcing and greedy continuations, on options_.backend when set.
  RowMatrix run_forward(std::span<const int64_t> tokens, const ExtendOptions& opt) const;
  // run_forward's logits [tokens, vocab] written into `logits` (host, row-major), without
  // an intermediate matrix when the backend can (ForwardBackend::forward_into).
  void run_forward_into(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const;
  std::vector<int64_t> continuation(int64_t prompt_length, const CacheQuantization& cache) const;
  // The per-row quantities of the exact rows [start, start + count) (`rows`
  // [count, vocab]): base_log_sum_exp_, base_top_, base_nll_ (within window `win`).
  void keep_base_row_quantities(const TokenWindow& win, const float* rows);
  ModelEvalOptions options_;
  std::vector<TokenWindow> windows_;
  std::vector<int64_t> scored_;
  bool kl_base_reused_ = false;
  std::shared_ptr<const Transformer> model_;
  std::vector<int64_t> tokens_;
  ContinuationSpec continuation_spec_;
  Recording recording_;
  RowMatrix base_logits_;                     // [T, vocab] when held, else empty
  // evaluate()'s windows of quantized (and, from a file, exact) rows [longest window,
  // vocab], reused from call to call; shared by copies.
  std::shared_ptr<FloatBufferPool> window_buffers_;
  std::shared_ptr<const KlBaseReader> base_file_;  // the exact logits when not held
  std::vector<double> base_log_sum_exp_;      // [T]: log Σ exp of each exact row
  std::vector<int64_t> base_top_;             // [T]: argmax of each exact row
  std::vector<double> base_nll_;              // [T - 1]
  std::vector<int64_t> prompt_lengths_;
  std::vector<std::vector<int64_t>> base_continuations_;
  std::shared_ptr<const AnswerTask> task_;
  std::vector<AnswerTask::Run> base_answers_;
};

// -log softmax(logits[t])[tokens[t + 1]] for t = 0 .. T-2.
std::vector<double> next_token_nll(const RowMatrix& logits, const std::vector<int64_t>& tokens);

// A recording's attention is full causal attention (every query t attends to all
// j <= t). A model with sliding-window attention (Mistral, Qwen2's use_sliding_window,
// the sliding layers of a hybrid) attends to t - W < j <= t only, so a recording FILE,
// which carries no windows, is that model's only while T <= W: throws
// kvb::ConfigError, naming the model, the layer and W, when `tokens` exceeds a layer's
// window. (`kvbudget record`, kvbudget.record.) Model-level evaluation is not limited:
// the forward pass honours the windows, and the in-memory recording it keeps carries
// them (Recording::attention_windows): strategies calibrate on its queries t < W,
// where its attention is the model's (RecordingStats), plans store only the last W
// tokens of a sliding layer (Plan::set_attention_windows), and attention-level metrics
// are refused past W (check_full_causal_metrics, experiments/query_positions.h).
void check_full_causal_attention(const ModelConfig& config, int64_t tokens);

// The Recording of an exact run's capture (recording.h layout), positions 0..T-1,
// with the model's sliding windows in attention_windows (when it has any).
Recording recording_from_capture(const ModelConfig& config, std::vector<LayerTensors> layers,
                                 const std::vector<int64_t>& tokens, const std::string& source);

// An exact run recorded, as `kvbudget record` and kvbudget.record (Python) make it:
// the recording of what attention consumed in every layer (source "model <checkpoint>
// on T tokens of <origin>"; metadata "text" = origin, "nll_mean" = mean_nll, "bos" =
// the model's BOS id when it has one) and the run's next-token NLLs (nats, T - 1).
struct RecordedRun {
  Recording recording;
  std::vector<double> nll;  // next_token_nll of the exact logits
  double mean_nll = 0;
};
// Runs `model` on `tokens` capturing every layer. `checkpoint` and `origin` (the text
// or token file) only name the run. Throws through check_full_causal_attention().
RecordedRun record_exact_run(const Transformer& model, const std::vector<int64_t>& tokens,
                             const std::string& checkpoint, const std::string& origin);

}  // namespace kvb
