// Tokenizers for running models on text:
//  - ByteTokenizer: the fixtures' byte-level scheme, ids 0..255 are the bytes of the
//    text, optionally preceded by a BOS id (256 for the fixtures).
//  - BpeTokenizer: a Hugging Face tokenizer.json with a BPE model, in the pipelines of
//    the models people use: GPT-2, Llama 3 and Qwen2 (byte-level BPE) and Llama 2 /
//    Mistral (SentencePiece-style BPE with byte fallback), as Hugging Face `tokenizers`
//    runs them (BpeTokenizer::load lists what is supported).
// and read_token_ids() for token ids prepared elsewhere.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // Text of the ids; ids without text (BOS) are skipped.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // Whether decode() accepts `id` (a model's vocabulary may be padded beyond its
  // tokenizer's: Qwen2's 151936 ids against 151665 tokens).
  virtual bool knows(int64_t id) const = 0;
  virtual std::string name() const = 0;  // "bytes" or the tokenizer.json path
};

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(std::optional<int64_t> bos) : bos_(bos) {}
  std::vector<int64_t> encode(std::string_view text) const override;  // [BOS] + bytes
  std::string decode(const std::vector<int64_t>& ids) const override;
  bool knows(int64_t /*id*/) const override { return true; }  // decode() skips ids without a byte
  std::string name() const override { return "bytes"; }

 private:
  std::optional<int64_t> bos_;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads a tokenizer.json whose pipeline is made of (anything else is a kvb::Error
  // naming the file and the key, e.g. "key 'normalizer.normalizers[1].type': 'NFKC' is
  // not supported"):
  //   normalizer     null, NFC, Prepend, Replace (string pattern), Sequence of these
  //   pre_tokenizer  null; ByteLevel (use_regex: GPT-2's pattern); Split (a known regex:
  //                  GPT-2's, Llama 3's or Qwen2's pattern, behavior Isolated); Metaspace
  //                  (prepend_scheme first/always/never, split); Sequence of these
  //   model          BPE: merges by rank as tokenizers' word.rs applies them, ignore_merges,
  //                  byte_fallback (<0xXX> tokens), unk_token and fuse_unk; no dropout,
  //                  continuing_subword_prefix or end_of_word_suffix
  //   added_tokens   split the text first (leftmost, longest), before (normalized false)
  //                  or after (normalized true) normalization, with lstrip/rstrip;
  //                  single_word is refused
  //   post_processor null, TemplateProcessing (its `single` template), ByteLevel, Sequence
  //   decoder        ByteLevel, Metaspace, Sequence of Replace (string), ByteFallback, Fuse,
  //                  Strip; null: ByteLevel for a byte-level pipeline, else tokens joined
  //                  by spaces (as tokenizers does)
  // The pre-tokenizer patterns are matched by hand-written matchers with the regexes'
  // semantics; letters (\p{L}), numbers (\p{N}) and NFC come from the Unicode tables of
  // sim/model/unicode_tables.h (scripts/gen_unicode_tables.py).
  static std::unique_ptr<BpeTokenizer> load(const std::filesystem::path& tokenizer_json);
  ~BpeTokenizer() override;

  // The text's tokens without the post-processor's special tokens: tokenizers'
  // encode(text, add_special_tokens=False). A character that is neither in the
  // vocabulary nor covered by byte fallback or unk_token is an error (tokenizers drops it).
  std::vector<int64_t> encode(std::string_view text) const override;
  // With them: template_prefix() + encode(text) + template_suffix(), tokenizers'
  // encode(text) (e.g. Llama 3's "<|begin_of_text|> $A", Llama 2's "<s> $A").
  std::vector<int64_t> encode_with_special_tokens(std::string_view text) const;
  // The special tokens the post-processor's template puts before / after the text
  // (empty without a TemplateProcessing).
  const std::vector<int64_t>& template_prefix() const;
  const std::vector<int64_t>& template_suffix() const;
  // The pieces the model encodes one by one: the text between added tokens, normalized
  // and pre-tokenized (in GPT-2's byte alphabet after a ByteLevel step), as tokenizers'
  // normalize_str + pre_tokenize_str give them.
  std::vector<std::string> pieces(std::string_view text) const;
  // Runs the decoder over the ids' tokens (added tokens included): tokenizers'
  // decode(ids, skip_special_tokens=False). Unknown ids are an error.
  std::string decode(const std::vector<int64_t>& ids) const override;
  bool knows(int64_t id) const override;
  std::string name() const override;
  // The longest prefix of `text` whose tokens (encode()) are the first tokens of every
  // text that starts with it: a cut just before an ASCII space followed by an ASCII
  // letter or digit, which no piece of the supported pre-tokenizers crosses (a piece of
  // the patterns ends before such a space, Metaspace with split starts a piece at it).
  // 0 when there is no such cut, or when a cut cannot be proven stable: no
  // pre-tokenizer or Metaspace without split (the text is one piece), a Prepend or
  // Replace normalizer, an added token that contains a space or begins with anything
  // but ASCII punctuation (a token "abc" would end the space run before it). Lets a reader stop
  // reading a long text once it has enough tokens.
  size_t stable_prefix_length(std::string_view text) const;

  int64_t vocab_size() const;  // the largest id (model or added token) + 1
  std::optional<int64_t> token_id(const std::string& token) const;

  struct Pipeline;  // tokenizer.cpp

 private:
  BpeTokenizer() = default;
  std::unique_ptr<const Pipeline> pipeline_;
};

// The offset of the first byte of `text` that begins no well-formed UTF-8 sequence
// (a Latin-1 é, a truncated character, an encoded surrogate), or nullopt.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// `text` from `where` (a file, a task's line) encoded for a model: tokenizer.encode(text)
// with `where` in front of its errors, then `bos` prepended unless the text's own first
// token is that id (chat-template text that begins with <|begin_of_text|>: BOS is never
// doubled, where tokenizers' encode would double it). A tokenizer.json reads Unicode
// text, so text that is not UTF-8 is an error naming the byte (tokenizers is given
// Python strings, and Python refuses such a file); the byte tokenizer reads any bytes.
std::vector<int64_t> encode_for_model(const Tokenizer& tokenizer, std::string_view text, std::optional<int64_t> bos,
                                      const std::string& where);

// decode() of the ids the tokenizer knows, the others skipped (as tokenizers' decode
// skips ids it has no token for).
std::string decode_known(const Tokenizer& tokenizer, const std::vector<int64_t>& ids);

// Token ids from a file: .npy (an integer array [T] or [1, T]), .safetensors (its tensor
// `input_ids`, likewise) or text with whitespace-separated integers. Errors name the
// file and the offending entry.
std::vector<int64_t> read_token_ids(const std::filesystem::path& file);

}  // namespace kvb
