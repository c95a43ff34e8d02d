// BpeTokenizer against the reference implementations on the pipelines of the models
// people use: the committed tokenizers of data/tokenizers/ (small vocabularies trained
// with Llama 3's, Qwen2's and Llama 2's / Mistral's pipelines; data/SOURCES.md) with the
// ids Hugging Face tokenizers gives on a sample of text (sentencepiece's own ids for
// spm/), and the pre-tokenizer patterns, Metaspace and NFC step by step on texts chosen
// for their corners (data/tokenizers/pretokenizer_references.json,
// scripts/make_pretokenizer_references.py).
#include <nlohmann/json.hpp>

#include <fstream>

#include "io_test_files.h"
#include "sim/model/model_eval.h"
#include "sim/model/tokenizer.h"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

namespace {

fs::path tokenizers_dir() { return data_dir() / "tokenizers"; }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), "cannot open " << p);
  return nlohmann::json::parse(in);
}

std::vector<int64_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }

// A tokenizer.json whose model is a byte-level BPE without merges, with the given
// normalizer and pre-tokenizer: its pieces() are the steps' output alone.
fs::path pipeline_file(const fs::path& dir, const std::string& name, const nlohmann::json& normalizer,
                       const nlohmann::json& pre_tokenizer) {
  nlohmann::json vocab = {{"a", 0}};
  const nlohmann::json j = {{"normalizer", normalizer},
                            {"pre_tokenizer", pre_tokenizer},
                            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / name) << j.dump();
  return dir / name;
}

}  // namespace

TEST_CASE("tokenizer references: every case's ids, ids without special tokens and decoded text match the reference's") {
  for (const char* name : {"llama3", "qwen2", "spm", "spm_metaspace"}) {
    CAPTURE(name);
    const auto tok = BpeTokenizer::load(tokenizers_dir() / name / "tokenizer.json");
    const nlohmann::json ref = read_json(tokenizers_dir() / name / "reference_ids.json");
    REQUIRE(ref["cases"].size() >= 19);
    size_t ids_checked = 0;
    for (const nlohmann::json& c : ref["cases"]) {
      const std::string text = c["text"].get<std::string>();
      CAPTURE(text);
      CHECK(tok->encode_with_special_tokens(text) == ids_of(c["ids"]));
      CHECK(tok->encode(text) == ids_of(c["ids_no_special"]));
      CHECK(tok->decode(ids_of(c["ids_no_special"])) == c["decoded"].get<std::string>());
      ids_checked += c["ids"].size();
    }
    CHECK(ids_checked > 2000);
  }
}

TEST_CASE("tokenizer references: the templates' BOS, and what each pipeline is") {
  const auto llama3 = BpeTokenizer::load(tokenizers_dir() / "llama3" / "tokenizer.json");
  CHECK(llama3->template_prefix() == std::vector<int64_t>{*llama3->token_id("<|begin_of_text|>")});
  CHECK(llama3->template_suffix().empty());
  const auto qwen2 = BpeTokenizer::load(tokenizers_dir() / "qwen2" / "tokenizer.json");
  CHECK(qwen2->template_prefix().empty());
  for (const char* name : {"spm", "spm_metaspace"}) {
    const auto spm = BpeTokenizer::load(tokenizers_dir() / name / "tokenizer.json");
    CHECK(spm->template_prefix() == std::vector<int64_t>{1});
    CHECK(spm->token_id("<0x41>").has_value());  // byte fallback tokens
  }
  // Llama 3's special tokens are split out of the text; Qwen2's NFC composes e + U+0301.
  const int64_t eot = *llama3->token_id("<|eot_id|>");
  const std::vector<int64_t> ids = llama3->encode("hi<|eot_id|>");
  CHECK(ids.back() == eot);
  CHECK(qwen2->encode("e\xCC\x81") == qwen2->encode("\xC3\xA9"));
  CHECK(qwen2->pieces("caf" "e\xCC\x81 x") == std::vector<std::string>{"caf\xC3\x83\xC2\xA9", "\xC4\xA0x"});
}

TEST_CASE("tokenizer references: GPT-2's, Llama 3's and Qwen2's patterns split as tokenizers' Split does") {
  const fs::path dir = scratch_dir("split_references");
  const nlohmann::json ref = read_json(tokenizers_dir() / "pretokenizer_references.json");
  for (const char* name : {"gpt2", "llama3", "qwen2"}) {
    CAPTURE(name);
    const nlohmann::json& r = ref["split"][name];
    const nlohmann::json split = {{"type", "Split"},
                                  {"pattern", {{"Regex", r["pattern"]}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}};
    const auto tok = BpeTokenizer::load(pipeline_file(dir, std::string(name) + ".json", nullptr, split));
    REQUIRE(r["cases"].size() > 40);
    for (const nlohmann::json& c : r["cases"]) {
      const std::string text = c["text"].get<std::string>();
      CAPTURE(text);
      CHECK(tok->pieces(text) == c["pieces"].get<std::vector<std::string>>());
    }
  }
}

TEST_CASE("tokenizer references: Metaspace's prepend schemes and split, NFC") {
  const fs::path dir = scratch_dir("metaspace_references");
  const nlohmann::json ref = read_json(tokenizers_dir() / "pretokenizer_references.json");
  REQUIRE(ref["metaspace"].size() == 48);
  for (const nlohmann::json& c : ref["metaspace"]) {
    const std::string text = c["text"].get<std::string>();
    CAPTURE(text);
    CAPTURE(c["prepend_scheme"].get<std::string>());
    CAPTURE(c["split"].get<bool>());
    const nlohmann::json meta = {{"type", "Metaspace"},
                                 {"replacement", "\xE2\x96\x81"},
                                 {"prepend_scheme", c["prepend_scheme"]},
                                 {"split", c["split"]}};
    const auto tok = BpeTokenizer::load(pipeline_file(dir, "meta.json", nullptr, meta));
    CHECK(tok->pieces(text) == c["pieces"].get<std::vector<std::string>>());
  }
  const auto nfc = BpeTokenizer::load(pipeline_file(dir, "nfc.json", {{"type", "NFC"}}, nullptr));
  REQUIRE(ref["nfc"].size() > 20);
  for (const nlohmann::json& c : ref["nfc"]) {
    const std::string text = c["text"].get<std::string>();
    CAPTURE(text);
    CHECK(nfc->pieces(text) == std::vector<std::string>{c["nfc"].get<std::string>()});
  }
}

TEST_CASE("tokenizer references: stable prefixes give the whole text's first tokens; 0 where unprovable") {
  std::string text;
  const nlohmann::json ref = read_json(tokenizers_dir() / "llama3" / "reference_ids.json");
  for (const nlohmann::json& c : ref["cases"]) text += c["text"].get<std::string>();
  REQUIRE(text.size() > 4000);
  for (const char* name : {"llama3", "qwen2"}) {
    CAPTURE(name);
    const auto tok = BpeTokenizer::load(tokenizers_dir() / name / "tokenizer.json");
    const std::vector<int64_t> whole = tok->encode(text);
    size_t cuts = 0;
    for (size_t end = 1; end <= text.size(); end += 97) {
      const std::string_view head = std::string_view(text).substr(0, end);
      const size_t stable = tok->stable_prefix_length(head);
      if (stable == 0) continue;
      ++cuts;
      const std::vector<int64_t> ids = tok->encode(head.substr(0, stable));
      REQUIRE(ids.size() <= whole.size());
      CHECK(std::equal(ids.begin(), ids.end(), whole.begin()));
    }
    CHECK(cuts > 30);
  }
  // Llama 2's legacy pipeline has no pre-tokenizer (the text is one piece, with a
  // prepended "▁"), Mistral's Metaspace does not split: no stable cut.
  for (const char* name : {"spm", "spm_metaspace"}) {
    const auto tok = BpeTokenizer::load(tokenizers_dir() / name / "tokenizer.json");
    CHECK(tok->stable_prefix_length(text) == 0);
  }
}

TEST_CASE("tokenizer references: load_tokens adds BOS once, as the template does, for Llama; none for Qwen2") {
  const fs::path dir = scratch_dir("load_tokens_templates");
  const nlohmann::json ref = read_json(tokenizers_dir() / "llama3" / "reference_ids.json");
  const nlohmann::json& c = ref["cases"][0];
  std::ofstream(dir / "t.txt") << c["text"].get<std::string>();
  const auto llama3 = BpeTokenizer::load(tokenizers_dir() / "llama3" / "tokenizer.json");
  ModelConfig cfg;
  cfg.vocab_size = llama3->vocab_size();
  cfg.bos_token_id = llama3->template_prefix().at(0);
  cfg.config_file = dir / "config.json";
  TokenSource src;
  src.text = dir / "t.txt";
  src.tokenizer = (tokenizers_dir() / "llama3" / "tokenizer.json").string();
  CHECK(load_tokens(src, cfg) == ids_of(c["ids"]));  // the reference's ids, BOS included once
  src.add_bos = false;
  CHECK(load_tokens(src, cfg) == ids_of(c["ids_no_special"]));
  src.add_bos.reset();
  src.tokenizer = (tokenizers_dir() / "qwen2" / "tokenizer.json").string();
  const nlohmann::json qwen = read_json(tokenizers_dir() / "qwen2" / "reference_ids.json");
  CHECK(load_tokens(src, cfg) == ids_of(qwen["cases"][0]["ids"]));
}
