#include "sim/model/tokenizer.h"

#include <locale.h>
#include <wctype.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/input_file.h"
#include "sim/io/json_file.h"
#include "sim/io/tensor_store.h"

namespace kvb {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------------------------
// Bytes

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() + 1);
  if (bos_) ids.push_back(*bos_);
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t id : ids)
    if (id >= 0 && id < 256) s += static_cast<char>(id);
  return s;
}

// ---------------------------------------------------------------------------------
// GPT-2 byte-level BPE

namespace {

// Token ids at or past this are refused (the largest vocabularies hold a few hundred
// thousand tokens; the id table is sized by the largest id).
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one UTF-8 code point at s[i]; `len` gets its byte length. An invalid or
// truncated sequence decodes as the single byte (len 1) mapped to U+FFFD's class.
uint32_t next_code_point(std::string_view s, size_t i, size_t& len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  auto bits = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  if (c < 0x80) {
    len = 1;
    return c;
  }
  if ((c & 0xE0) == 0xC0 && cont(1)) {
    len = 2;
    return ((c & 0x1Fu) << 6) | bits(1);
  }
  if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
    len = 3;
    return ((c & 0x0Fu) << 12) | (bits(1) << 6) | bits(2);
  }
  if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
    len = 4;
    return ((c & 0x07u) << 18) | (bits(1) << 12) | (bits(2) << 6) | bits(3);
  }
  len = 1;
  return 0xFFFD;
}

// GPT-2's reversible byte -> printable code point map: bytes that are printable
// Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves, the others to 256, 257, ...
struct ByteAlphabet {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  std::string symbol[256];  // UTF-8 of to_cp
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<uint8_t>(b);
      append_utf8(symbol[b], to_cp[b]);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// Character classes of the pre-tokenization pattern.
enum class CharClass { Space, Letter, Number, Other };

locale_t utf8_ctype() {
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return loc;
}

bool is_unicode_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

CharClass classify(uint32_t cp) {
  if (is_unicode_space(cp)) return CharClass::Space;
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    return CharClass::Other;
  }
  if (cp == 0xFFFD) return CharClass::Other;
  const locale_t loc = utf8_ctype();
  if (!loc) return CharClass::Letter;  // no C.UTF-8 tables: treat non-ASCII as letters
  const wint_t w = static_cast<wint_t>(cp);
  if (iswdigit_l(w, loc)) return CharClass::Number;
  if (iswalpha_l(w, loc)) return CharClass::Letter;
  return CharClass::Other;
}

struct CodePoint {
  size_t offset, len;
  CharClass cls;
  uint32_t cp;
};

// Splits text into pieces with GPT-2's pattern (see tokenizer.h).
std::vector<std::string_view> gpt2_pieces(std::string_view text) {
  std::vector<CodePoint> cps;
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    const uint32_t cp = next_code_point(text, i, len);
    cps.push_back({i, len, classify(cp), cp});
    i += len;
  }
  std::vector<std::string_view> out;
  const size_t n = cps.size();
  auto piece = [&](size_t a, size_t b) {  // code points [a, b)
    const size_t begin = cps[a].offset, end = b < n ? cps[b].offset : text.size();
    out.push_back(text.substr(begin, end - begin));
  };
  auto run_of = [&](size_t i, CharClass c) {
    while (i < n && cps[i].cls == c) ++i;
    return i;
  };
  size_t i = 0;
  while (i < n) {
    // Contractions: 's 't 'm 'd 're 've 'll (lower case, as in GPT-2's pattern).
    if (cps[i].cp == '\'' && i + 1 < n) {
      const uint32_t a = cps[i + 1].cp, b = i + 2 < n ? cps[i + 2].cp : 0;
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len) {
        piece(i, i + len);
        i += len;
        continue;
      }
    }
    // ' ?' followed by a run of letters, numbers, or other symbols.
    const size_t start = i;
    size_t j = i;
    if (cps[j].cp == ' ' && j + 1 < n && cps[j + 1].cls != CharClass::Space) ++j;
    if (cps[j].cls != CharClass::Space) {
      const size_t end = run_of(j, cps[j].cls);
      piece(start, end);
      i = end;
      continue;
    }
    // Whitespace: \s+(?!\S) leaves the last whitespace before a non-space to the next
    // piece; a single whitespace before a non-space falls to \s+.
    const size_t end = run_of(i, CharClass::Space);
    if (end == n || end - i == 1) {
      piece(i, end);
      i = end;
    } else {
      piece(i, end - 1);
      i = end - 1;
    }
  }
  return out;
}

[[noreturn]] void bad_key(const fs::path& file, const std::string& key, const std::string& what) {
  throw Error(file.string() + ": key '" + key + "': " + what);
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::load(const fs::path& file) {
  const json j = read_json_object(file, "a tokenizer.json");
  if (!j.contains("model") || !j["model"].is_object())
    throw Error(file.string() + ": not a Hugging Face tokenizer.json (no \"model\" object)");
  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  tok->path_ = file;
  const json& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") bad_key(file, "model.type", "'" + type + "' is not supported (GPT-2 byte-level BPE only)");
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
    bad_key(file, "model.byte_fallback", "byte fallback is not supported (GPT-2 byte-level BPE only)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      bad_key(file, std::string("model.") + k, "non-empty values are not supported");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    bad_key(file, "normalizer", "normalizers are not supported (GPT-2 byte-level BPE has none)");
  const json pre = j.value("pre_tokenizer", json());
  if (pre.is_null() || !pre.is_object() || pre.value("type", std::string()) != "ByteLevel")
    bad_key(file, "pre_tokenizer", "only the ByteLevel pre-tokenizer (GPT-2) is supported, got " + pre.dump());
  tok->add_prefix_space_ = pre.value("add_prefix_space", false);
  tok->use_regex_ = pre.value("use_regex", true);
  tok->ignore_merges_ = model.value("ignore_merges", false);

  if (!model.contains("vocab") || !model["vocab"].is_object()) bad_key(file, "model.vocab", "missing or not an object");
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId)
      bad_key(file, "model.vocab",
              "entry '" + token + "' must map to an integer id in [0, " + std::to_string(kMaxTokenId) + ")");
    const int64_t v = id.get<int64_t>();
    tok->vocab_[token] = v;
    if (static_cast<int64_t>(tok->id_to_token_.size()) <= v) tok->id_to_token_.resize(static_cast<size_t>(v + 1));
    tok->id_to_token_[static_cast<size_t>(v)] = token;
  }
  if (!model.contains("merges") || !model["merges"].is_array()) bad_key(file, "model.merges", "missing or not an array");
  int rank = 0;
  for (const json& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size())
        bad_key(file, "model.merges", "entry " + std::to_string(rank) + " '" + s + "' is not \"left right\"");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      bad_key(file, "model.merges", "entry " + std::to_string(rank) + " " + m.dump() + " is not a pair");
    }
    tok->merge_rank_.emplace(left + " " + right, rank++);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string() ||
          !a["id"].is_number_integer())
        bad_key(file, "added_tokens", "entry " + a.dump() + " needs an integer id and a string content");
      const std::string content = a["content"].get<std::string>();
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= kMaxTokenId)
        bad_key(file, "added_tokens",
                "entry '" + content + "' has id " + std::to_string(id) + ", not in [0, " + std::to_string(kMaxTokenId) + ")");
      if (content.empty()) continue;
      tok->added_.emplace_back(content, id);
      if (static_cast<int64_t>(tok->id_to_token_.size()) <= id) tok->id_to_token_.resize(static_cast<size_t>(id + 1));
    }
  }
  return tok;
}

std::optional<int64_t> BpeTokenizer::token_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  if (it != vocab_.end()) return it->second;
  for (const auto& [content, id] : added_)
    if (content == token) return id;
  return std::nullopt;
}

void BpeTokenizer::encode_piece(std::string_view bytes, std::vector<int64_t>& out) const {
  const ByteAlphabet& ab = alphabet();
  std::vector<std::string> symbols;
  symbols.reserve(bytes.size());
  std::string word;
  for (char c : bytes) {
    symbols.push_back(ab.symbol[static_cast<unsigned char>(c)]);
    word += symbols.back();
  }
  if (ignore_merges_) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Merge the lowest-ranked adjacent pair, every occurrence left to right, until no
  // pair has a merge.
  while (symbols.size() > 1) {
    int best = std::numeric_limits<int>::max();
    std::string best_key;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merge_rank_.find(symbols[i] + " " + symbols[i + 1]);
      if (it != merge_rank_.end() && it->second < best) {
        best = it->second;
        best_key = it->first;
      }
    }
    if (best_key.empty()) break;
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] + " " + symbols[i + 1] == best_key) {
        merged.push_back(symbols[i] + symbols[i + 1]);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols.swap(merged);
  }
  for (const std::string& s : symbols) {
    const auto it = vocab_.find(s);
    if (it == vocab_.end())
      throw Error(path_.string() + ": the vocabulary has no token '" + s + "' (from the text piece '" +
                  std::string(bytes) + "')");
    out.push_back(it->second);
  }
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  std::string prefixed;
  auto encode_plain = [&](std::string_view part, bool at_start) {
    if (part.empty()) return;
    if (add_prefix_space_ && at_start && part.front() != ' ') {
      prefixed = " " + std::string(part);
      part = prefixed;
    }
    if (!use_regex_) return encode_piece(part, ids);
    for (std::string_view piece : gpt2_pieces(part)) encode_piece(piece, ids);
  };
  // Added tokens split the text first (the earliest occurrence, the longest on ties).
  size_t pos = 0;
  bool at_start = true;
  while (pos < text.size()) {
    size_t best_at = std::string_view::npos, best_len = 0;
    int64_t best_id = -1;
    for (const auto& [content, id] : added_) {
      const size_t at = text.find(content, pos);
      if (at == std::string_view::npos) continue;
      if (at < best_at || (at == best_at && content.size() > best_len)) {
        best_at = at;
        best_len = content.size();
        best_id = id;
      }
    }
    if (best_at == std::string_view::npos) {
      encode_plain(text.substr(pos), at_start);
      break;
    }
    encode_plain(text.substr(pos, best_at - pos), at_start);
    ids.push_back(best_id);
    pos = best_at + best_len;
    at_start = false;
  }
  return ids;
}

size_t BpeTokenizer::stable_prefix_length(std::string_view text) const {
  if (!use_regex_) return 0;  // the whole text is one piece
  for (const auto& added : added_)
    if (added.first.find(' ') != std::string::npos) return 0;
  auto letter_or_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  // Before " x": the piece before ends at the space (a run of letters, numbers or
  // symbols stops there; a whitespace run leaves its last space to the next piece),
  // and the space starts the next piece.
  for (size_t c = text.size() >= 2 ? text.size() - 2 : 0; c > 0; --c)
    if (text[c] == ' ' && letter_or_digit(text[c + 1])) return c;
  return 0;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  const ByteAlphabet& ab = alphabet();
  std::string out;
  for (int64_t id : ids) {
    bool added = false;
    for (const auto& [content, aid] : added_)
      if (aid == id) {
        out += content;
        added = true;
        break;
      }
    if (added) continue;
    if (id < 0 || id >= static_cast<int64_t>(id_to_token_.size()) || id_to_token_[static_cast<size_t>(id)].empty())
      throw Error(path_.string() + ": token id " + std::to_string(id) + " is not in the vocabulary");
    const std::string& tok = id_to_token_[static_cast<size_t>(id)];
    for (size_t i = 0; i < tok.size();) {
      size_t len = 1;
      const uint32_t cp = next_code_point(tok, i, len);
      const auto it = ab.to_byte.find(cp);
      if (it == ab.to_byte.end())
        throw Error(path_.string() + ": token '" + tok + "' (id " + std::to_string(id) +
                    ") is not in GPT-2's byte alphabet");
      out += static_cast<char>(it->second);
      i += len;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Token id files

std::vector<int64_t> read_token_ids(const fs::path& file) {
  if (fs::is_directory(file)) throw Error(file.string() + ": is a directory, expected a token id file");
  if (file.extension() == ".npy" || file.extension() == ".safetensors") {
    const std::unique_ptr<TensorStore> store = TensorStore::open(file);
    const std::vector<TensorInfo> list = store->list();
    // A .safetensors file holds many tensors: its `input_ids`, as Hugging Face's
    // recordings and reference files (data/reference/) name the ids they ran on.
    const auto ids_tensor = std::find_if(list.begin(), list.end(), [&](const TensorInfo& t) {
      return file.extension() == ".npy" || t.name == "input_ids";
    });
    if (ids_tensor == list.end()) {
      std::vector<std::string> names;
      for (const TensorInfo& t : list) names.push_back(t.name);
      throw Error(file.string() + ": no tensor 'input_ids' (a .safetensors token file holds its ids there; it has " +
                  (names.empty() ? std::string("no tensors") : join(names, ", ")) + ")");
    }
    const TensorInfo& info = *ids_tensor;
    const DType d = info.dtype;
    if (dtype_is_float(d) || d == DType::BOOL)  // as recordings' token ids (recording_loader.cpp)
      throw Error(file.string() + ": token ids must be an integer array, got " + dtype_name(d));
    // One sequence: [T], or [1, T] as a tokenizer's batch of one writes it.
    const std::vector<int64_t>& s = info.shape;
    if (!(s.size() == 1 || (s.size() == 2 && s[0] == 1)))
      throw Error(file.string() + ": token ids must be a 1-D array [T] (or [1, T]), got shape " + shape_str(s));
    return store->read_i64(info.name);
  }
  require_regular_file(file, "a token id file");
  std::ifstream in(file);
  if (!in) throw Error(file.string() + ": cannot open token id file");
  std::vector<int64_t> ids;
  std::string word;
  while (in >> word) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
    if (ec != std::errc() || end != word.data() + word.size())
      throw Error(file.string() + ": entry " + std::to_string(ids.size()) + " '" + word +
                  "' is not an integer token id (expected whitespace-separated integers, a .npy array or a .safetensors file)");
    ids.push_back(v);
  }
  return ids;
}

}  // namespace kvb
