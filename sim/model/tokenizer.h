// Tokenizers for running models on text:
//  - ByteTokenizer: the fixtures' byte-level scheme, ids 0..255 are the bytes of the
//    text, optionally preceded by a BOS id (256 for the fixtures).
//  - BpeTokenizer: GPT-2's byte-level BPE read from a Hugging Face tokenizer.json
//    (model type "BPE", pre_tokenizer "ByteLevel", no normalizer).
// and read_token_ids() for token ids prepared elsewhere.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvb {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // Text of the ids; ids without text (BOS) are skipped.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual std::string name() const = 0;  // "bytes" or the tokenizer.json path
};

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(std::optional<int64_t> bos) : bos_(bos) {}
  std::vector<int64_t> encode(std::string_view text) const override;  // [BOS] + bytes
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string name() const override { return "bytes"; }

 private:
  std::optional<int64_t> bos_;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads a tokenizer.json. Anything outside GPT-2's byte-level BPE (another model
  // type, a normalizer, another pre-tokenizer, byte fallback) is a kvb::Error naming
  // the file and the key.
  static std::unique_ptr<BpeTokenizer> load(const std::filesystem::path& tokenizer_json);

  // Added tokens (e.g. "<|endoftext|>") are matched literally first; the rest is split
  // with GPT-2's pre-tokenization pattern
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // (letters and numbers beyond ASCII are classified by the C library's C.UTF-8
  // tables, an approximation of Unicode's L and N categories), each piece is mapped
  // byte by byte to GPT-2's printable alphabet, and merges apply lowest rank first.
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string name() const override { return path_.string(); }
  // The longest prefix of `text` whose tokens are the first tokens of every text that
  // starts with it: a cut just before an ASCII space followed by an ASCII letter or
  // digit, which no piece of the pattern above crosses. 0 when there is no such cut,
  // or when pieces could cross it (no pre-tokenization pattern, an added token that
  // contains a space). Lets a reader stop reading a long text once it has enough tokens.
  size_t stable_prefix_length(std::string_view text) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  std::optional<int64_t> token_id(const std::string& token) const;

 private:
  void encode_piece(std::string_view bytes, std::vector<int64_t>& out) const;

  std::filesystem::path path_;
  std::unordered_map<std::string, int64_t> vocab_;       // byte-level token -> id
  std::vector<std::string> id_to_token_;                 // id -> token ("" for gaps)
  std::unordered_map<std::string, int> merge_rank_;      // "left right" -> rank
  std::vector<std::pair<std::string, int64_t>> added_;   // literal added tokens
  bool add_prefix_space_ = false;
  bool use_regex_ = true;
  bool ignore_merges_ = false;
};

// Token ids from a file: .npy (an integer array [T] or [1, T]), .safetensors (its tensor
// `input_ids`, likewise) or text with whitespace-separated integers. Errors name the
// file and the offending entry.
std::vector<int64_t> read_token_ids(const std::filesystem::path& file);

}  // namespace kvb
