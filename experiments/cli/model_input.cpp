#include "experiments/cli/model_input.h"
#include "experiments/cli/commands.h"

#include <algorithm>
#include <cstdio>

#include <omp.h>

#include <iostream>

#include "sim/core/error.h"

namespace po = boost::program_options;

namespace kvb::cli {

void ModelInput::add_options(po::options_description& opts) {
  opts.add_options()("text", po::value(&text), "text file to run on (tokenized by --tokenizer)")(
      "tokens", po::value(&token_file), "token ids instead of text: .npy, .safetensors (its input_ids), or whitespace-separated integers")(
      "max-tokens", po::value(&max_tokens)->default_value(512), "keep the first N tokens (0 = all)");
  add_model_options(opts);
}

void ModelInput::add_model_options(po::options_description& opts) {
  opts.add_options()("tokenizer", po::value(&tokenizer)->default_value("bytes"),
                     "'bytes' (ids 0..255, the fixtures' scheme) or a Hugging Face tokenizer.json (the BPE of GPT-2, "
                     "Llama 3, Qwen2, Llama 2, Mistral)")(
      "bos", po::bool_switch(&bos),
      "prepend the model's bos_token_id (default for --tokenizer bytes and for a tokenizer.json whose template "
      "starts with special tokens, as Llama's)")(
      "no-bos", po::bool_switch(&no_bos), "do not prepend BOS")(
      "threads", po::value(&threads), "OpenMP threads (default: all cores)");
}

bool ModelInput::parse(const std::vector<std::string>& args, const po::options_description& opts, const char* command,
                       po::variables_map& vm) {
  return parse_command_line(args, opts, "model", po::value(&checkpoint), 1, command, vm);
}

std::shared_ptr<const Transformer> ModelInput::load_model() const {
  if (checkpoint.empty()) throw ConfigError("missing MODEL_DIR (a Hugging Face checkpoint directory)");
  if (text.empty() == token_file.empty()) throw ConfigError("give exactly one of --text and --tokens");
  if (bos && no_bos) throw ConfigError("--bos and --no-bos contradict each other");
  if (!token_file.empty() && (tokenizer != "bytes" || bos))
    throw ConfigError("--tokenizer and --bos apply to --text only");
  if (max_tokens < 0) throw ConfigError("--max-tokens must be >= 0");
  return load_checkpoint();
}

std::shared_ptr<const Transformer> ModelInput::load_checkpoint() const {
  if (checkpoint.empty()) throw ConfigError("missing MODEL_DIR (a Hugging Face checkpoint directory)");
  if (bos && no_bos) throw ConfigError("--bos and --no-bos contradict each other");
  check_threads(threads, "--threads");
  if (threads > 0) omp_set_num_threads(threads);
  std::shared_ptr<const Transformer> model = Transformer::load(checkpoint);
  for (const std::string& w : model->load_warnings()) std::fprintf(stderr, "kvbudget: warning: %s\n", w.c_str());
  return model;
}

std::vector<int64_t> ModelInput::load_tokens(const ModelConfig& config, int64_t window) const {
  TokenSource src;
  src.text = text;
  src.token_file = token_file;
  src.tokenizer = tokenizer;
  if (bos) src.add_bos = true;
  if (no_bos) src.add_bos = false;
  src.max_tokens = max_tokens;
  std::vector<int64_t> tokens = kvb::load_tokens(src, config);
  const int64_t T = static_cast<int64_t>(tokens.size());
  const std::string warning = config.context_warning(window > 0 ? std::min(T, window) : T);
  if (!warning.empty()) std::fprintf(stderr, "kvbudget: warning: %s\n", warning.c_str());
  return tokens;
}

std::unique_ptr<Tokenizer> ModelInput::make_tokenizer() const {
  if (tokenizer == "bytes") return std::make_unique<ByteTokenizer>(std::nullopt);
  return BpeTokenizer::load(tokenizer);
}

std::vector<int64_t> ModelInput::encode_text(std::string_view input, const ModelConfig& config,
                                             const std::string& where) const {
  const bool bytes = tokenizer == "bytes";
  const std::unique_ptr<Tokenizer> tok = make_tokenizer();
  // As load_tokens: BOS by default for bytes and for a tokenizer.json whose template puts
  // special tokens before the text (Llama's); the text itself is encoded without them.
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
  const bool add_bos = bos || (!no_bos && (bytes || (bpe && !bpe->template_prefix().empty())));
  if (add_bos && !config.bos_token_id)
    throw ConfigError(where + ": a BOS token is to be prepended, but " + config.config_file.string() +
                      " has no bos_token_id (give --no-bos)");
  if (bytes && config.vocab_size < 256)
    throw ConfigError(where + ": the byte tokenizer needs a vocabulary of at least 256 ids, but " +
                      config.config_file.string() + " has vocab_size " + std::to_string(config.vocab_size));
  const std::vector<int64_t> ids = encode_for_model(*tok, input, add_bos ? config.bos_token_id : std::nullopt, where);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= config.vocab_size)
      throw Error(where + ": token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) + " (from " +
                  tok->name() + ") is outside the vocabulary of " + config.dir.string() + " (vocab_size " +
                  std::to_string(config.vocab_size) + " in " + config.config_file.string() + ")");
  return ids;
}

std::string ModelInput::token_origin() const { return text.empty() ? token_file : text; }

}  // namespace kvb::cli
