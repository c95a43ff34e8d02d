// Options shared by the commands that run a model (`record`, `eval`, `generate`): the
// checkpoint, where the tokens come from, and the thread count.
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sim/model/model_eval.h"
#include "sim/model/tokenizer.h"
#include "sim/model/transformer.h"

namespace kvb::cli {

struct ModelInput {
  std::string checkpoint;          // positional MODEL_DIR
  std::string text, token_file;
  std::string tokenizer = "bytes";
  bool no_bos = false, bos = false;
  int64_t max_tokens = 512;
  int threads = 0;

  // Adds --text, --tokens, --max-tokens and add_model_options()'s.
  void add_options(boost::program_options::options_description& opts);
  // Adds --tokenizer, --bos, --no-bos, --threads: a command whose text is given
  // otherwise (generate --prompt) takes these alone.
  void add_model_options(boost::program_options::options_description& opts);
  // Parses `args` with `opts` (which add_options() has extended) and the positional
  // MODEL_DIR into vm. A bad command line prints "kvbudget <command>: why" and the
  // options to stderr and returns false.
  bool parse(const std::vector<std::string>& args, const boost::program_options::options_description& opts,
             const char* command, boost::program_options::variables_map& vm);
  // Checks the combination (throws kvb::ConfigError), sets the thread count, loads
  // the model and the tokens.
  std::shared_ptr<const Transformer> load_model() const;
  // The same without the token options' checks (for add_model_options() alone).
  std::shared_ptr<const Transformer> load_checkpoint() const;
  // The --tokenizer, to encode and decode text.
  std::unique_ptr<Tokenizer> make_tokenizer() const;
  // The ids of a text given in memory, with --tokenizer and the BOS rule of --text
  // (kvb::load_tokens: BOS by default for bytes only, --bos/--no-bos say otherwise).
  // Errors name `where` (e.g. "--prompt").
  std::vector<int64_t> encode_text(std::string_view text, const ModelConfig& config, const std::string& where) const;
  // Warns (stderr, once) when a forward pass reaches past the model's
  // max_position_embeddings: `window` tokens at once (eval's --ctx), 0 = all of them.
  std::vector<int64_t> load_tokens(const ModelConfig& config, int64_t window = 0) const;
  std::string token_origin() const;  // the text or token file
};

}  // namespace kvb::cli
