#include "sim/model/model_eval.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "sim/core/error.h"
#include "sim/core/parallel.h"
#include "sim/core/strings.h"
#include "sim/io/input_file.h"
#include "sim/io/tensor_store.h"
#include "sim/io/tensor_writer.h"
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
    const std::unique_ptr<BpeTokenizer> bpe = bytes ? nullptr : BpeTokenizer::load(src.tokenizer);
    // BOS by default for bytes and for a tokenizer whose template puts special tokens
    // before the text (Llama's); the text itself is encoded without them.
    const bool add_bos = src.add_bos.value_or(bytes || !bpe->template_prefix().empty());
    if (add_bos && !config.bos_token_id)
      throw ConfigError(where + ": a BOS token is to be prepended, but " + config.config_file.string() +
                        " has no bos_token_id");
    const std::optional<int64_t> bos = add_bos ? config.bos_token_id : std::nullopt;
    // Only as much of the text as max_tokens needs is read (a text may be far longer).
    const size_t wanted = src.max_tokens > 0 ? static_cast<size_t>(src.max_tokens) : SIZE_MAX;  // BOS included
    if (bytes) {
      if (config.vocab_size < 256)
        throw ConfigError(where + ": the byte tokenizer needs a vocabulary of at least 256 ids, but " +
                          config.config_file.string() + " has vocab_size " + std::to_string(config.vocab_size));
      const size_t bytes_wanted = wanted - (add_bos && wanted < SIZE_MAX ? 1 : 0);  // one token per byte
      ids = encode_for_model(ByteTokenizer(std::nullopt), read_file_prefix(src.text, "a text file", bytes_wanted), bos,
                             where);
    } else {
      // Doubling prefixes until the tokens of a stable prefix (one whose tokens no
      // later text changes) are enough, or the file ends.
      size_t read = std::max<size_t>(size_t{1} << 16, wanted < SIZE_MAX / 64 ? wanted * 16 : SIZE_MAX);
      for (;;) {
        bool at_end = false;
        const std::string text = read_file_prefix(src.text, "a text file", read, &at_end);
        if (at_end) {
          ids = encode_for_model(*bpe, text, bos, where);
          break;
        }
        const size_t stable = bpe->stable_prefix_length(text);
        if (stable > 0) {
          ids = encode_for_model(*bpe, std::string_view(text).substr(0, stable), bos, where);
          if (ids.size() >= wanted) break;
        }
        read = read < SIZE_MAX / 2 ? read * 2 : SIZE_MAX;
      }
    }
  } else {
    throw ConfigError("no tokens to evaluate: give a text file or a token id file");
  }
  if (src.max_tokens > 0 && static_cast<int64_t>(ids.size()) > src.max_tokens) ids.resize(static_cast<size_t>(src.max_tokens));
  if (ids.size() < 2) throw Error(where + ": " + std::to_string(ids.size()) + " token(s); evaluation needs at least 2");
  return ids;
}

namespace {

// log Σ exp of each row of logits [T, vocab], rows in parallel (a Llama-3 vocabulary's
// 128256 exps a row make a 4096-token pass's rows seconds of one thread's work).
std::vector<double> row_log_sum_exp(const RowMatrix& logits) {
  std::vector<double> out(static_cast<size_t>(logits.rows()));
  parallel_for_rethrow(logits.rows(), [&](int64_t t) {
    out[static_cast<size_t>(t)] = log_sum_exp(logits.row(t).data(), logits.cols());
  });
  return out;
}

}  // namespace

std::vector<double> next_token_nll(const RowMatrix& logits, const std::vector<int64_t>& tokens) {
  const std::vector<double> log_sum_exp_of_rows = row_log_sum_exp(logits);
  std::vector<double> nll;
  // −log_softmax(row t)[token t+1] = −(logit − log Σ exp), as log_softmax computes it.
  for (int64_t t = 0; t + 1 < logits.rows(); ++t)
    nll.push_back(-(static_cast<double>(logits(t, tokens[static_cast<size_t>(t + 1)])) -
                    log_sum_exp_of_rows[static_cast<size_t>(t)]));
  return nll;
}

void check_full_causal_attention(const ModelConfig& config, int64_t tokens) {
  for (size_t l = 0; l < config.sliding_window.size(); ++l) {
    const int64_t w = config.sliding_window[l];
    if (w <= 0 || tokens <= w) continue;
    throw ConfigError(config.dir.string() + ": layer " + std::to_string(l) +
                      " uses sliding-window attention over the last W = " + std::to_string(w) +
                      " tokens (config.json sliding_window), but " + std::to_string(tokens) +
                      " tokens are recorded: a recording file's attention (what `kvbudget run` simulates on it) is "
                      "full causal attention, which this model does not compute beyond W tokens; record at most " +
                      std::to_string(w) + " tokens (--max-tokens), or measure the model itself past W "
                      "(kvbudget eval, a config with source = \"model\" and model-level metrics)");
  }
}

Recording recording_from_capture(const ModelConfig& config, std::vector<LayerTensors> layers,
                                 const std::vector<int64_t>& tokens, const std::string& source) {
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
  // Beyond the smallest window, what full causal attention computes from these
  // tensors is not what the model attends to (Recording::full_causal_queries).
  if (config.sliding_layers() > 0) rec.attention_windows = config.sliding_window;
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

RecordedRun record_exact_run(const Transformer& model, const std::vector<int64_t>& tokens,
                             const std::string& checkpoint, const std::string& origin) {
  check_full_causal_attention(model.config(), static_cast<int64_t>(tokens.size()));
  std::vector<LayerTensors> capture;
  ExtendOptions opt;
  opt.capture = &capture;
  const RowMatrix logits = model.forward(tokens, opt);
  RecordedRun run;
  run.nll = next_token_nll(logits, tokens);
  for (double v : run.nll) run.mean_nll += v / static_cast<double>(run.nll.size());
  const std::string source =
      "model " + checkpoint + " on " + std::to_string(tokens.size()) + " tokens of " + origin;
  run.recording = recording_from_capture(model.config(), std::move(capture), tokens, source);
  run.recording.metadata["text"] = origin;
  run.recording.metadata["nll_mean"] = format_double(run.mean_nll);
  if (model.config().bos_token_id) run.recording.metadata["bos"] = std::to_string(*model.config().bos_token_id);
  return run;
}

ScoreRule parse_score_rule(const std::string& text, const std::string& where) {
  if (text == "all") return ScoreRule::All;
  if (text == "second_half") return ScoreRule::SecondHalf;
  throw ConfigError(where + ": expected \"all\" or \"second_half\", got \"" + text + "\"");
}

const char* score_rule_name(ScoreRule rule) { return rule == ScoreRule::SecondHalf ? "second_half" : "all"; }

std::vector<TokenWindow> token_windows(int64_t tokens, int64_t n_ctx) {
  if (tokens < 2) throw Error("internal: token_windows of " + std::to_string(tokens) + " token(s)");
  if (n_ctx < 0 || n_ctx == 1) throw ConfigError("n_ctx must be 0 (one window) or >= 2, got " + std::to_string(n_ctx));
  if (n_ctx == 0 || n_ctx >= tokens) return {TokenWindow{0, tokens}};
  std::vector<TokenWindow> w;
  for (int64_t start = 0; start < tokens; start += n_ctx) {
    const int64_t length = std::min(n_ctx, tokens - start);
    if (length >= 2) w.push_back({start, length});  // a last single token has nothing to predict
  }
  return w;
}

namespace {

const char* const kLogits = "logits";
const char* const kInputIds = "input_ids";
const char* const kLogitsChecksum = "logits_checksum";

std::map<std::string, std::string> kl_base_metadata(const KlBaseHeader& h) {
  std::map<std::string, std::string> meta = {{"kvbudget_kl_base", "1"},
                                             {"model", h.model},
                                             {"model_summary", h.model_summary},
                                             {"vocab_size", std::to_string(h.vocab)},
                                             {"n_ctx", std::to_string(h.n_ctx)}};
  if (!h.precision.empty()) meta["precision"] = h.precision;
  return meta;
}

}  // namespace

void LogitsChecksum::add(const float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    uint64_t& lane = lanes_[(added_ + i) & 3];
    lane = (lane ^ bits) * 0x100000001b3u;  // FNV-1a's 64-bit prime, a word at a time
  }
  added_ += count;
}

int64_t LogitsChecksum::value() const {
  uint64_t h = static_cast<uint64_t>(added_);
  for (uint64_t lane : lanes_) h = (std::rotl(h, 23) ^ lane) * 0x9e3779b97f4a7c15u;
  return static_cast<int64_t>(h);
}

namespace {

// Of a kl-base file whose rows [0, read) were added to `sum` as they were read: adds the
// rows no window holds and compares with the stored checksum.
void check_stored_checksum(const KlBaseReader& stored, LogitsChecksum& sum, int64_t read) {
  const int64_t T = static_cast<int64_t>(stored.header().tokens.size()), V = stored.header().vocab;
  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t t = read; t < T; ++t) {
    stored.read_rows(t, 1, row.data());
    sum.add(row.data(), V);
  }
  if (sum.value() != *stored.checksum())
    throw ConfigError(stored.path().string() +
                      " (--kl-base): its logits are not those it was written with (their checksum differs): the file "
                      "was changed or damaged since; delete it to run the exact model anew");
}

}  // namespace

KlBaseReader::KlBaseReader(const std::filesystem::path& path) : path_(path), store_(TensorStore::open(path)) {
  const std::map<std::string, std::string> meta = store_->metadata();
  const auto field = [&](const char* key) -> std::string {
    const auto it = meta.find(key);
    if (it == meta.end())
      throw Error(path.string() + ": not a kl-base file (written by kvbudget eval --kl-base): no metadata '" + key + "'");
    return it->second;
  };
  if (field("kvbudget_kl_base") != "1")
    throw Error(path.string() + ": kl-base version " + field("kvbudget_kl_base") + ", this kvbudget reads version 1");
  header_.model = field("model");
  header_.model_summary = field("model_summary");
  if (meta.count("precision")) header_.precision = meta.at("precision");  // files before it have none
  try {
    header_.n_ctx = std::stoll(field("n_ctx"));
  } catch (const std::logic_error&) {
    throw Error(path.string() + ": metadata n_ctx '" + field("n_ctx") + "' is not an integer");
  }
  header_.tokens = store_->read_i64(kInputIds);
  const TensorInfo& logits = store_->info(kLogits);
  if (logits.dtype != DType::F32 || logits.shape.size() != 2 ||
      logits.shape[0] != static_cast<int64_t>(header_.tokens.size()))
    throw Error(path.string() + ": logits are " + dtype_name(logits.dtype) + " " + shape_str(logits.shape) +
                ", expected F32 [" + std::to_string(header_.tokens.size()) + ", vocab]");
  header_.vocab = logits.shape[1];
  if (store_->contains(kLogitsChecksum)) {
    const std::vector<int64_t> sum = store_->read_i64(kLogitsChecksum);
    if (sum.size() != 1) throw Error(path.string() + ": logits_checksum holds " + std::to_string(sum.size()) + " values, expected 1");
    checksum_ = sum[0];
  }
}

KlBaseReader::~KlBaseReader() = default;

void KlBaseReader::read_rows(int64_t first, int64_t count, float* dst) const {
  store_->read_raw_rows(kLogits, first, count, dst);
}

KlBaseWriter::KlBaseWriter(const std::filesystem::path& path, const KlBaseHeader& header)
    : tokens_(header.tokens), vocab_(header.vocab) {
  const int64_t T = static_cast<int64_t>(tokens_.size());
  stream_ = std::make_unique<TensorFileStream>(
      path,
      std::vector<TensorLayout>{
          {kLogits, {T, header.vocab}, DType::F32}, {kInputIds, {T}, DType::I64}, {kLogitsChecksum, {1}, DType::I64}},
      kl_base_metadata(header), TensorFileFormat::Safetensors);
}

KlBaseWriter::~KlBaseWriter() = default;

void KlBaseWriter::append_rows(const float* rows, int64_t count) {
  stream_->append_floats(rows, count * vocab_);
  checksum_.add(rows, count * vocab_);
}

void KlBaseWriter::append_zero_rows(int64_t count) {
  stream_->append_zeros(count * vocab_);
  const std::vector<float> zeros(static_cast<size_t>(vocab_), 0.0f);
  for (int64_t r = 0; r < count; ++r) checksum_.add(zeros.data(), vocab_);
}

void KlBaseWriter::commit() {
  stream_->append_ints(tokens_.data(), static_cast<int64_t>(tokens_.size()));
  const int64_t sum = checksum_.value();
  stream_->append_ints(&sum, 1);
  stream_->commit();
}

void write_kl_base(const std::filesystem::path& path, const KlBaseHeader& header, const RowMatrix& logits) {
  if (logits.rows() != static_cast<int64_t>(header.tokens.size()) || logits.cols() != header.vocab)
    throw Error("internal: write_kl_base: logits [" + std::to_string(logits.rows()) + ", " +
                std::to_string(logits.cols()) + "] for " + std::to_string(header.tokens.size()) +
                " tokens of a vocabulary of " + std::to_string(header.vocab));
  KlBaseWriter writer(path, header);
  writer.append_rows(logits.data(), logits.rows());
  writer.commit();
}

void check_kl_base(const KlBaseHeader& base, const std::filesystem::path& path, const ModelConfig& config,
                   const std::vector<int64_t>& tokens, int64_t n_ctx, const std::string& precision) {
  const std::string where = path.string() + " (--kl-base, from model " + base.model + ")";
  if (!base.precision.empty() && base.precision != precision)
    throw ConfigError(where + ": its exact logits were computed in " + base.precision + ", this run computes in " +
                      precision + "; compare like with like: the same --backend/--precision, or another file name");
  if (base.vocab != config.vocab_size)
    throw ConfigError(where + ": logits over a vocabulary of " + std::to_string(base.vocab) + " tokens, but " +
                      config.dir.string() + " has vocab_size " + std::to_string(config.vocab_size) +
                      "; write a new kl-base for this model (another file name)");
  if (base.tokens.size() != tokens.size())
    throw ConfigError(where + ": computed on " + std::to_string(base.tokens.size()) + " tokens, but " +
                      std::to_string(tokens.size()) + " are evaluated; use the same text, tokenizer and --max-tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (base.tokens[i] != tokens[i])
      throw ConfigError(where + ": token " + std::to_string(i) + " is " + std::to_string(base.tokens[i]) +
                        " there but " + std::to_string(tokens[i]) +
                        " in the evaluated text; use the same text, tokenizer and BOS setting");
  if (base.n_ctx != n_ctx)
    throw ConfigError(where + ": computed in windows of n_ctx = " + std::to_string(base.n_ctx) + ", but n_ctx = " +
                      std::to_string(n_ctx) + " now; use the same --ctx");
  if (base.model_summary != config.summary())
    throw ConfigError(where + ": computed by a model of another shape (" + base.model_summary + "), not " +
                      config.dir.string() + " (" + config.summary() + ")");
}

namespace {

// A name for the temporary file of an evaluator's exact logits, unique in this process
// and among processes (the pid).
std::filesystem::path spill_file_name(const std::filesystem::path& dir) {
  static std::atomic<uint64_t> counter{0};
  return dir / ("kvbudget-exact-logits-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
                ".safetensors");
}

}  // namespace

ModelEvaluator::ModelEvaluator(std::shared_ptr<const Transformer> model, std::vector<int64_t> tokens,
                               ContinuationSpec continuations, std::string source_description,
                               std::shared_ptr<const AnswerTask> task, ModelEvalOptions options)
    : model_(std::move(model)), tokens_(std::move(tokens)), continuation_spec_(continuations), task_(std::move(task)) {
  options_ = std::move(options);
  const int64_t T = static_cast<int64_t>(tokens_.size());
  windows_ = token_windows(T, options_.windows.n_ctx);
  const int64_t first_window = windows_.front().length;  // the longest window
  const ContinuationSpec& c = continuation_spec_;
  if (c.count < 0 || c.prompt < 1 || c.tokens < 1)
    throw ConfigError("continuations: count must be >= 0, prompt and tokens >= 1");
  if (c.count > 0 && c.prompt + c.tokens > first_window)
    throw ConfigError("continuations: a prompt of " + std::to_string(c.prompt) + " tokens plus " +
                      std::to_string(c.tokens) + " generated tokens exceeds the " + std::to_string(first_window) +
                      (windows_.size() > 1 ? " tokens of a window (n_ctx)" : " evaluated tokens"));
  for (int64_t i = 0; i < c.count; ++i) {
    const int64_t span = first_window - c.tokens - c.prompt;
    const int64_t offset = c.count > 1 ? (i * span + (c.count - 1) / 2) / (c.count - 1) : 0;
    prompt_lengths_.push_back(c.prompt + offset);
  }
  for (const TokenWindow& w : windows_)
    for (int64_t t = options_.windows.first_scored(); t + 1 < w.length; ++t) scored_.push_back(w.start + t);
  if (scored_.empty())
    throw ConfigError("no position is scored: " + std::to_string(T) + " tokens in windows of n_ctx = " +
                      std::to_string(options_.windows.n_ctx) + ", scoring " + score_rule_name(options_.windows.score) +
                      " (second_half scores window positions n_ctx/2 and later)");

  const int64_t V = model_->config().vocab_size;
  const fs::path& kl_path = options_.kl_base;
  std::shared_ptr<const KlBaseReader> stored;
  if (!kl_path.empty() && fs::exists(kl_path)) {
    stored = std::make_shared<const KlBaseReader>(kl_path);
    check_kl_base(stored->header(), kl_path, model_->config(), tokens_, options_.windows.n_ctx, options_.precision);
  }
  // Held: every row in base_logits_. Else one window of rows at a time in `window_rows`,
  // kept in the kl-base file (read back from it, or written to it) or a temporary one.
  const bool held = static_cast<double>(T) * static_cast<double>(V) * sizeof(float) <=
                    static_cast<double>(options_.max_held_base_bytes);
  std::unique_ptr<KlBaseWriter> writer;
  fs::path written;
  if (!stored && (!kl_path.empty() || !held)) {
    written = !kl_path.empty() ? kl_path
                               : spill_file_name(options_.spill_dir.empty() ? fs::temp_directory_path()
                                                                            : options_.spill_dir);
    KlBaseHeader header;
    header.tokens = tokens_;
    header.vocab = V;
    header.n_ctx = options_.windows.n_ctx;
    header.model = model_->config().dir.filename().string();
    header.model_summary = model_->config().summary();
    header.precision = options_.precision;
    writer = std::make_unique<KlBaseWriter>(written, header);
  }
  window_buffers_ = std::make_shared<FloatBufferPool>(static_cast<size_t>(first_window * V));
  if (held) base_logits_.setZero(T, V);  // zero: the row of a last token no window holds
  std::optional<FloatBufferPool::Lease> window_rows;  // from the pool: the first point reuses it
  if (!held) window_rows.emplace(window_buffers_->take());
  base_log_sum_exp_.assign(static_cast<size_t>(T), std::numeric_limits<double>::quiet_NaN());
  base_top_.assign(static_cast<size_t>(T), -1);
  base_nll_.assign(static_cast<size_t>(T - 1), std::numeric_limits<double>::quiet_NaN());
  std::vector<LayerTensors> capture;
  // The stored rows' checksum, as they are read (a file that has one).
  std::optional<LogitsChecksum> stored_sum;
  if (stored && stored->checksum()) stored_sum.emplace();
  for (size_t w = 0; w < windows_.size(); ++w) {
    const TokenWindow& win = windows_[w];
    float* rows = held ? base_logits_.row(win.start).data() : window_rows->data();
    if (stored) stored->read_rows(win.start, win.length, rows);
    if (w == 0 || !stored) {
      ExtendOptions opt;
      if (w == 0) opt.capture = &capture;
      const std::vector<int64_t> ids = window_tokens(w);
      if (w == 0 && stored) {
        const RowMatrix logits = run_forward(ids, opt);
        // The first window, run anyway for the recording, tells whether the stored
        // logits are this model's (same shape, other weights would pass the checks above).
        const Eigen::Map<const RowMatrix> stored_rows(rows, win.length, V);
        const double scale = std::max(1.0, static_cast<double>(stored_rows.cwiseAbs().maxCoeff()));
        const double diff = static_cast<double>((stored_rows - logits).cwiseAbs().maxCoeff());
        if (!(diff <= 1e-4 * scale))
          throw ConfigError(kl_path.string() + " (--kl-base): its logits of the first window differ from " +
                            model_->config().dir.string() + "'s by up to " + std::to_string(diff) +
                            " (max |logit| " + std::to_string(scale) + "): computed by another model or other weights");
      } else {
        run_forward_into(ids, opt, rows);
      }
      if (w == 0) recording_ = recording_from_capture(model_->config(), std::move(capture), ids, source_description);
    }
    keep_base_row_quantities(win, rows);
    if (writer) writer->append_rows(rows, win.length);
    if (stored_sum) stored_sum->add(rows, win.length * V);
    if (options_.progress) options_.progress(static_cast<int64_t>(w) + 1, static_cast<int64_t>(windows_.size()));
  }
  if (stored_sum) check_stored_checksum(*stored, *stored_sum, windows_.back().start + windows_.back().length);
  if (writer) {
    const TokenWindow& last = windows_.back();
    writer->append_zero_rows(T - (last.start + last.length));
    writer->commit();
    writer.reset();
  }
  kl_base_reused_ = stored != nullptr;
  if (!held) {
    if (stored) {
      base_file_ = std::move(stored);
    } else {
      base_file_ = std::make_shared<const KlBaseReader>(written);
      // A temporary file is unlinked at once: the open file keeps its data until the
      // evaluator (every copy) is gone, and nothing is left behind on a crash.
      if (kl_path.empty()) fs::remove(written);
    }
  }
  for (int64_t p : prompt_lengths_) base_continuations_.push_back(continuation(p, CacheQuantization{}));
  if (task_)
    for (const AnswerProblem& problem : task_->problems()) base_answers_.push_back(task_->run(*model_, problem, {}));
}

void ModelEvaluator::keep_base_row_quantities(const TokenWindow& win, const float* rows) {
  const int64_t V = model_->config().vocab_size;
  parallel_for_rethrow(win.length, [&](int64_t i) {
    const float* row = rows + i * V;
    const size_t t = static_cast<size_t>(win.start + i);
    base_log_sum_exp_[t] = log_sum_exp(row, V);
    // NaN for a row with NaN or +inf (log_sum_exp propagates them): no comparison holds.
    if (std::isnan(base_log_sum_exp_[t]))
      throw Error("the exact (unquantized) forward pass gave non-finite logits (NaN or +inf) at token " +
                  std::to_string(t) + ": the model overflows on this text, so nothing can be compared with it");
    base_top_[t] = argmax(row, V);
    // −log_softmax(row t)[token t+1] = −(logit − log Σ exp), as log_softmax computes it.
    if (i + 1 < win.length) base_nll_[t] = -(static_cast<double>(row[tokens_[t + 1]]) - base_log_sum_exp_[t]);
  });
}

const RowMatrix& ModelEvaluator::base_logits() const {
  if (base_file_)
    throw Error("the exact logits [" + std::to_string(tokens_.size()) + ", " +
                std::to_string(model_->config().vocab_size) + "] are not held in memory (" +
                format_double(static_cast<double>(tokens_.size()) *
                              static_cast<double>(model_->config().vocab_size) * 4.0 / (1024.0 * 1024.0)) +
                " MiB, above the limit of " +
                format_double(static_cast<double>(options_.max_held_base_bytes) / (1024.0 * 1024.0)) +
                " MiB): they are read from " + base_file_->path().string() + " a window at a time");
  return base_logits_;
}

void ModelEvaluator::read_base_rows(int64_t first, int64_t count, float* dst) const {
  const int64_t T = static_cast<int64_t>(tokens_.size()), V = model_->config().vocab_size;
  if (first < 0 || count < 0 || first + count > T)
    throw Error("internal: read_base_rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                ") of " + std::to_string(T) + " rows");
  if (base_file_) return base_file_->read_rows(first, count, dst);
  std::copy(base_logits_.row(first).data(), base_logits_.row(first).data() + count * V, dst);
}

std::filesystem::path ModelEvaluator::base_logits_file() const {
  return base_file_ ? base_file_->path() : std::filesystem::path();
}

RowMatrix ModelEvaluator::run_forward(std::span<const int64_t> tokens, const ExtendOptions& opt) const {
  return options_.backend ? options_.backend.forward(tokens, opt) : model_->forward(tokens, opt);
}

void ModelEvaluator::run_forward_into(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const {
  if (options_.backend.forward_into) {
    options_.backend.forward_into(tokens, opt, logits);
    return;
  }
  if (options_.backend) {
    const RowMatrix computed = run_forward(tokens, opt);
    std::copy(computed.data(), computed.data() + computed.size(), logits);
    return;
  }
  model_->forward_into(tokens, opt, logits);
}

std::vector<int64_t> ModelEvaluator::continuation(int64_t prompt_length, const CacheQuantization& cache) const {
  const std::span<const int64_t> prompt(tokens_.data(), static_cast<size_t>(prompt_length));
  if (!options_.backend) return greedy_continuation(*model_, prompt, continuation_spec_.tokens, cache);
  return options_.backend.generate(prompt, continuation_spec_.tokens, cache, greedy_token, nullptr);
}

std::vector<int64_t> ModelEvaluator::window_tokens(size_t w) const {
  const TokenWindow& win = windows_[w];
  std::vector<int64_t> ids(tokens_.begin() + win.start, tokens_.begin() + win.start + win.length);
  const std::optional<int64_t>& bos = model_->config().bos_token_id;
  if (w > 0 && bos && tokens_.front() == *bos) ids.front() = *bos;
  return ids;
}

std::vector<double> ModelEvaluator::next_token_nll_of(const RowMatrix& logits) const {
  const std::vector<double> log_sum_exp_of_rows = row_log_sum_exp(logits);
  // −log_softmax(row t)[token t+1] = −(logit − log Σ exp), as log_softmax computes it.
  std::vector<double> nll(tokens_.size() - 1, std::numeric_limits<double>::quiet_NaN());
  for (const TokenWindow& w : windows_)
    for (int64_t t = w.start; t + 1 < w.start + w.length; ++t) {
      const int64_t next = tokens_[static_cast<size_t>(t + 1)];
      nll[static_cast<size_t>(t)] =
          -(static_cast<double>(logits(t, next)) - log_sum_exp_of_rows[static_cast<size_t>(t)]);
    }
  return nll;
}

std::vector<double> ModelEvaluator::base_scored_nll() const {
  std::vector<double> nll;
  nll.reserve(scored_.size());
  for (int64_t t : scored_) nll.push_back(base_nll_[static_cast<size_t>(t)]);
  return nll;
}

std::vector<int64_t> ModelEvaluator::scored_in_window(const TokenWindow& window,
                                                      const std::vector<int64_t>* positions) const {
  std::vector<int64_t> scored;
  for (int64_t local = options_.windows.first_scored(); local + 1 < window.length; ++local)
    if (!positions || std::binary_search(positions->begin(), positions->end(), local)) scored.push_back(local);
  return scored;
}

std::vector<int64_t> ModelEvaluator::compared_positions(const std::vector<int64_t>* positions) const {
  std::vector<int64_t> compared;
  for (const TokenWindow& w : windows_)
    for (int64_t local : scored_in_window(w, positions)) compared.push_back(w.start + local);
  return compared;
}

ModelStats ModelEvaluator::evaluate(const Plan& plan, uint64_t seed, RowMatrix* logits_out,
                                    const std::vector<int64_t>* positions, const QuantizedRunOutput* output) const {
  const CacheQuantization cache{&plan, seed};
  const int64_t T = static_cast<int64_t>(tokens_.size()), V = model_->config().vocab_size;
  // One window of quantized logits (unless logits_out holds them all), and of exact
  // ones when they are kept in a file: [longest window, vocab] each, from the pool.
  std::optional<FloatBufferPool::Lease> quant_window, base_window;
  if (!logits_out) quant_window.emplace(window_buffers_->take());
  if (base_file_) base_window.emplace(window_buffers_->take());
  if (logits_out) logits_out->setZero(T, V);  // zero: the row of a last token no window holds
  if (output && output->nll) output->nll->assign(static_cast<size_t>(T - 1), std::numeric_limits<double>::quiet_NaN());
  ModelStats s;
  std::vector<int64_t> scored;  // window-local positions scored in the current window
  for (size_t w = 0; w < windows_.size(); ++w) {
    const TokenWindow& win = windows_[w];
    ExtendOptions opt;
    opt.cache = cache;
    float* quant = logits_out ? logits_out->row(win.start).data() : quant_window->data();
    run_forward_into(window_tokens(w), opt, quant);
    const float* base = base_logits_.data() + (base_file_ ? 0 : win.start * V);
    if (base_file_) {
      base_file_->read_rows(win.start, win.length, base_window->data());
      base = base_window->data();
    }
    // The scored positions of this window, in order; each compared on its own, in parallel.
    scored = scored_in_window(win, positions);
    const size_t offset = s.nll.size(), n = scored.size();
    s.nll.resize(offset + n);
    s.nll_base.resize(offset + n);
    s.kl.resize(offset + n);
    s.same_top.resize(offset + n);
    parallel_for_rethrow(static_cast<int64_t>(n), [&](int64_t i) {
      const size_t k = offset + static_cast<size_t>(i);
      const int64_t local = scored[static_cast<size_t>(i)];
      const size_t t = static_cast<size_t>(win.start + local);
      const float* quant_row = quant + local * V;
      const NextTokenComparison c =
          compare_next_token(base + local * V, base_log_sum_exp_[t], quant_row, V, tokens_[t + 1]);
      s.nll[k] = c.nll;
      s.nll_base[k] = base_nll_[t];
      s.kl[k] = c.kl;
      // A row with NaN or +inf (NaN nll, as its log-sum-exp) has no top token: not the same.
      s.same_top[k] = !std::isnan(c.nll) && base_top_[t] == argmax(quant_row, V) ? 1 : 0;
    });
    if (output && output->nll) {
      std::vector<double>& nll = *output->nll;
      parallel_for_rethrow(win.length - 1, [&](int64_t local) {
        const size_t t = static_cast<size_t>(win.start + local);
        const float* quant_row = quant + local * V;
        // As next_token_nll_of: −(logit − log Σ exp).
        nll[t] = -(static_cast<double>(quant_row[tokens_[t + 1]]) - log_sum_exp(quant_row, V));
      });
    }
    if (output && output->window_logits) output->window_logits(win, quant);
    if (options_.progress) options_.progress(static_cast<int64_t>(w) + 1, static_cast<int64_t>(windows_.size()));
  }
  for (int64_t p : prompt_lengths_) s.continuations.push_back(continuation(p, cache));
  s.continuations_base = base_continuations_;
  if (task_)
    for (size_t i = 0; i < task_->problems().size(); ++i) {
      s.answers_correct.push_back(task_->run(*model_, task_->problems()[i], cache).correct ? 1 : 0);
      s.answers_correct_base.push_back(base_answers_[i].correct ? 1 : 0);
    }
  return s;
}

}  // namespace kvb
