#include "sim/model/answer_task.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "sim/core/error.h"
#include "sim/io/input_file.h"
#include "sim/io/tensor_store.h"

namespace kvb {

namespace fs = std::filesystem;

namespace {

// Names compared with runs of digits as numbers: "short_2" < "short_10".
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string da = a.substr(i, ie - i), db = b.substr(j, je - j);
      const std::string na = da.substr(std::min(da.find_first_not_of('0'), da.size()));
      const std::string nb = db.substr(std::min(db.find_first_not_of('0'), db.size()));
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<AnswerProblem> read_npz_task(const fs::path& file) {
  const std::unique_ptr<TensorStore> store = TensorStore::open(file);
  std::vector<std::string> names;
  for (const TensorInfo& t : store->list())
    if (ends_with(t.name, "_prompt")) names.push_back(t.name.substr(0, t.name.size() - 7));
  std::sort(names.begin(), names.end(), natural_less);
  std::vector<AnswerProblem> problems;
  for (const std::string& name : names) {
    const std::string answer = name + "_answer";
    if (!store->contains(answer))
      throw ConfigError(file.string() + ": problem '" + name + "' has a prompt (" + name +
                        "_prompt) but no expected answer (no array " + answer + ")");
    AnswerProblem p;
    p.name = name;
    try {
      p.prompt = store->read_i64(name + "_prompt");
      const std::vector<int64_t> value = store->read_i64(answer);
      if (value.size() != 1)
        throw ConfigError(std::to_string(value.size()) + " values, expected one (the expected answer)");
      p.expected = std::to_string(value[0]);
    } catch (const Error& e) {
      throw ConfigError(file.string() + ": problem '" + name + "': " + e.what());
    }
    problems.push_back(std::move(p));
  }
  return problems;
}

std::vector<AnswerProblem> read_jsonl_task(const fs::path& file, const AnswerTaskSpec& spec,
                                           const ModelConfig& config) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(file.string() + ": cannot be read");
  std::unique_ptr<Tokenizer> tokenizer;  // for text prompts, made on first use
  std::vector<AnswerProblem> problems;
  size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string where = file.string() + ":" + std::to_string(number);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(where + ": not JSON: " + e.what());
    }
    if (!j.is_object()) throw ConfigError(where + ": expected a JSON object with \"prompt\" and \"answer\"");
    for (const auto& [key, value] : j.items())
      if (key != "prompt" && key != "prompt_ids" && key != "answer" && key != "name")
        throw ConfigError(where + ": unknown key \"" + key + "\" (known: prompt, prompt_ids, answer, name)");
    AnswerProblem p;
    p.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : "line " + std::to_string(number);
    if (!j.contains("answer") || j["answer"].is_null())
      throw ConfigError(where + ": no expected answer (give \"answer\": a string or a number)");
    const nlohmann::json& answer = j["answer"];
    if (answer.is_string()) p.expected = answer.get<std::string>();
    else if (answer.is_number_integer()) p.expected = std::to_string(answer.get<int64_t>());
    else if (answer.is_number()) p.expected = answer.dump();
    else throw ConfigError(where + ": \"answer\" must be a string or a number");
    if (j.contains("prompt") == j.contains("prompt_ids"))
      throw ConfigError(where + ": give exactly one of \"prompt\" (text) and \"prompt_ids\" (token ids)");
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) throw ConfigError(where + ": \"prompt\" must be a string");
      const bool bytes = spec.tokenizer == "bytes";
      if (!tokenizer) {
        if (bytes) tokenizer = std::make_unique<ByteTokenizer>(std::nullopt);
        else tokenizer = BpeTokenizer::load(spec.tokenizer);
      }
      // As load_tokens: BOS by default for bytes and for a template with special tokens
      // before the text; the prompt itself is encoded without them.
      const auto* bpe = dynamic_cast<const BpeTokenizer*>(tokenizer.get());
      const bool add_bos = spec.add_bos.value_or(bytes || (bpe && !bpe->template_prefix().empty()));
      if (add_bos && !config.bos_token_id)
        throw ConfigError(where + ": a BOS token is to be prepended, but " + config.config_file.string() +
                          " has no bos_token_id");
      p.prompt = encode_for_model(*tokenizer, j["prompt"].get<std::string>(),
                                  add_bos ? config.bos_token_id : std::nullopt, where + ": \"prompt\"");
    } else {
      const nlohmann::json& ids = j["prompt_ids"];
      if (!ids.is_array()) throw ConfigError(where + ": \"prompt_ids\" must be an array of token ids");
      for (const nlohmann::json& id : ids) {
        if (!id.is_number_integer()) throw ConfigError(where + ": \"prompt_ids\" holds " + id.dump() + ", not a token id");
        p.prompt.push_back(id.get<int64_t>());
      }
    }
    if (p.prompt.empty()) throw ConfigError(where + ": the prompt is empty");
    problems.push_back(std::move(p));
  }
  return problems;
}

}  // namespace

AnswerTask::AnswerTask(AnswerTaskSpec spec, const ModelConfig& config) : spec_(std::move(spec)) {
  const std::string file = spec_.file.string();
  try {
    regex_ = std::regex(spec_.answer_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ConfigError("answer_regex /" + spec_.answer_regex + "/ does not compile: " + e.what());
  }
  if (spec_.answer_regex.empty()) throw ConfigError("answer_regex is empty: give the pattern that finds the answer");
  if (spec_.max_new_tokens < 1) throw ConfigError("max_new_tokens must be >= 1");
  if (spec_.max_problems < 0) throw ConfigError("max_problems must be >= 0 (0 = all)");
  if (spec_.answer_after && (*spec_.answer_after < 0 || *spec_.answer_after >= config.vocab_size))
    throw ConfigError("answer_after: token id " + std::to_string(*spec_.answer_after) + " is outside the vocabulary of " +
                      config.dir.string() + " (vocab_size " + std::to_string(config.vocab_size) + ")");
  if (!fs::exists(spec_.file)) throw ConfigError(file + ": no such task file");
  try {
    require_regular_file(spec_.file, "a task file");
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  const std::string ext = spec_.file.extension().string();
  std::vector<AnswerProblem> all;
  if (ext == ".npz") all = read_npz_task(spec_.file);
  else if (ext == ".jsonl") all = read_jsonl_task(spec_.file, spec_, config);
  else throw ConfigError(file + ": a task file is .npz or .jsonl, not '" + ext + "'");
  for (AnswerProblem& p : all) {
    if (!spec_.problem_prefix.empty() && p.name.compare(0, spec_.problem_prefix.size(), spec_.problem_prefix) != 0)
      continue;
    if (spec_.max_problems > 0 && static_cast<int64_t>(problems_.size()) == spec_.max_problems) break;
    for (size_t i = 0; i < p.prompt.size(); ++i)
      if (p.prompt[i] < 0 || p.prompt[i] >= config.vocab_size)
        throw ConfigError(file + ": problem '" + p.name + "': token id " + std::to_string(p.prompt[i]) + " at index " +
                          std::to_string(i) + " is outside the vocabulary of " + config.dir.string() + " (vocab_size " +
                          std::to_string(config.vocab_size) + ")");
    const int64_t longest = static_cast<int64_t>(p.prompt.size()) + spec_.max_new_tokens;
    if (config.family == ModelFamily::Gpt2 && longest > config.max_positions)
      throw ConfigError(file + ": problem '" + p.name + "': " + std::to_string(p.prompt.size()) +
                        " prompt tokens + max_new_tokens " + std::to_string(spec_.max_new_tokens) +
                        " exceed the learned position table of " + config.dir.string() + " (n_positions " +
                        std::to_string(config.max_positions) + ")");
    problems_.push_back(std::move(p));
  }
  if (problems_.empty())
    throw ConfigError(file + ": no problems" +
                      (spec_.problem_prefix.empty() ? std::string() : " named '" + spec_.problem_prefix + "...'") +
                      (all.empty() ? std::string(" (an .npz needs NAME_prompt and NAME_answer arrays)") : ""));
  if (spec_.tokenizer == "bytes") decoder_ = std::make_unique<ByteTokenizer>(std::nullopt);
  else decoder_ = BpeTokenizer::load(spec_.tokenizer);
  eos_ = config.eos_token_ids;
}

std::string AnswerTask::describe() const {
  std::string s = spec_.file.string() + ": " + std::to_string(problems_.size()) + " problems, answers by /" +
                  spec_.answer_regex + "/";
  if (spec_.answer_after) s += " after token " + std::to_string(*spec_.answer_after);
  return s + ", at most " + std::to_string(spec_.max_new_tokens) + " new tokens";
}

std::optional<std::string> AnswerTask::extract(const std::vector<int64_t>& generated) const {
  auto from = generated.begin();
  if (spec_.answer_after) {
    from = std::find(generated.begin(), generated.end(), *spec_.answer_after);
    if (from == generated.end()) return std::nullopt;
    ++from;
  }
  // Ids the tokenizer has no token for (a vocabulary padded beyond it) are skipped, as
  // tokenizers' decode skips them.
  const std::string text = decode_known(*decoder_, std::vector<int64_t>(from, generated.end()));
  std::smatch m;
  if (!std::regex_search(text, m, regex_)) return std::nullopt;
  return m.size() > 1 && m[1].matched ? m[1].str() : m[0].str();
}

AnswerTask::Run AnswerTask::run(const Transformer& model, const AnswerProblem& problem,
                                const CacheQuantization& cache) const {
  Run r;
  auto stop = [&](const std::vector<int64_t>& generated) {
    if (std::find(eos_.begin(), eos_.end(), generated.back()) != eos_.end()) return true;
    r.answer = extract(generated);
    return r.answer.has_value();
  };
  r.generated = greedy_generate(model, problem.prompt, spec_.max_new_tokens, cache, stop);
  r.answer = extract(r.generated);
  r.correct = r.answer && *r.answer == problem.expected;
  return r;
}

}  // namespace kvb
