#include "sim/model/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <queue>
#include <unordered_map>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/input_file.h"
#include "sim/io/json_file.h"
#include "sim/io/tensor_store.h"
#include "sim/model/unicode_tables.h"

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
// BPE from a Hugging Face tokenizer.json

namespace {

// Token ids at or past this are refused (the largest vocabularies hold a few hundred
// thousand tokens; the id table is sized by the largest id).
constexpr int64_t kMaxTokenId = int64_t{1} << 24;
// Invalid UTF-8 bytes travel through normalization as these (outside Unicode), so they
// come out as the same bytes.
constexpr uint32_t kRawByteBase = 0x110000;

void append_utf8(std::string& s, uint32_t cp) {
  if (cp >= kRawByteBase) {
    s += static_cast<char>(cp - kRawByteBase);
  } else if (cp < 0x80) {
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

// The length of the well-formed UTF-8 sequence at s[i] (Unicode's table 3-7), or 0.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  const unsigned c = byte(0);
  const auto in = [](unsigned v, unsigned lo, unsigned hi) { return v >= lo && v <= hi; };
  if (c < 0x80) return 1;
  if (in(c, 0xC2, 0xDF)) return in(byte(1), 0x80, 0xBF) ? 2 : 0;
  unsigned lo = 0x80, hi = 0xBF;
  size_t len = 0;
  if (c == 0xE0) lo = 0xA0, len = 3;
  else if (c == 0xED) hi = 0x9F, len = 3;
  else if (in(c, 0xE1, 0xEF)) len = 3;
  else if (c == 0xF0) lo = 0x90, len = 4;
  else if (c == 0xF4) hi = 0x8F, len = 4;
  else if (in(c, 0xF1, 0xF3)) len = 4;
  else return 0;
  if (!in(byte(1), lo, hi)) return 0;
  for (size_t k = 2; k < len; ++k)
    if (!in(byte(k), 0x80, 0xBF)) return 0;
  return len;
}

// Whether `s` begins with an ASCII punctuation or symbol character ('<' of <|eot_id|>,
// '[' of [INST]). An added token that begins with a letter or digit (or any non-ASCII
// character, which NFC may compose from an ASCII letter and a mark) can begin just
// after a cut before " x" and change how the space before it is split, so such a token
// makes those cuts unstable (stable_prefix_length).
bool starts_with_ascii_punctuation(std::string_view s) {
  if (s.empty()) return false;
  const auto c = static_cast<unsigned char>(s.front());
  return c > 0x20 && c < 0x7F && !std::isalnum(c);
}

// Decodes one code point at s[i]; `len` gets its byte length. A byte that starts no
// well-formed sequence decodes alone (len 1) as kRawByteBase + the byte.
uint32_t next_code_point(std::string_view s, size_t i, size_t& len) {
  len = utf8_sequence_length(s, i);
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default: len = 1; return kRawByteBase + b(0);
  }
}

// Bytes as text the way Rust's String::from_utf8_lossy reads them: each maximal
// ill-formed subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    // The longest prefix of a well-formed sequence (lead byte and fitting continuation
    // bytes) is one error.
    size_t k = 1;
    for (; k < 4 && i + k < s.size(); ++k) {
      std::string probe(s.substr(i, k + 1));
      probe.append(3 - k, '\x80');  // complete it, to ask whether the prefix fits
      if (utf8_sequence_length(probe, 0) == 0) break;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

// --- Unicode properties (unicode_tables.h)

template <size_t N>
const unicode::CodePointRange* find_range(const unicode::CodePointRange (&table)[N], uint32_t cp) {
  const auto* it = std::upper_bound(std::begin(table), std::end(table), cp,
                                    [](uint32_t c, const unicode::CodePointRange& r) { return c < r.first; });
  if (it == std::begin(table)) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return find_range(unicode::kLetterRanges, cp) != nullptr;
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return find_range(unicode::kNumberRanges, cp) != nullptr;
}

// Unicode's White_Space: the regexes' \s (Oniguruma's and Rust regex's).
bool is_unicode_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

uint32_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* it = std::upper_bound(std::begin(unicode::kCombiningClasses), std::end(unicode::kCombiningClasses), cp,
                                    [](uint32_t c, const unicode::CombiningClassRange& r) { return c < r.first; });
  if (it == std::begin(unicode::kCombiningClasses)) return 0;
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

// Hangul syllables (Unicode §3.12).
constexpr uint32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr uint32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr uint32_t kHangulNCount = kHangulVCount * kHangulTCount, kHangulSCount = kHangulLCount * kHangulNCount;

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kHangulS && cp < kHangulS + kHangulSCount) {
    const uint32_t s = cp - kHangulS;
    out.push_back(kHangulL + s / kHangulNCount);
    out.push_back(kHangulV + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount) out.push_back(kHangulT + s % kHangulTCount);
    return;
  }
  if (cp >= 0xC0 && cp < kRawByteBase) {
    const auto* it = std::lower_bound(std::begin(unicode::kCanonicalDecompositions),
                                      std::end(unicode::kCanonicalDecompositions), cp,
                                      [](const unicode::Decomposition& d, uint32_t c) { return d.code_point < c; });
    if (it != std::end(unicode::kCanonicalDecompositions) && it->code_point == cp) {
      decompose(it->first, out);
      if (it->second) decompose(it->second, out);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kHangulL && a < kHangulL + kHangulLCount && b >= kHangulV && b < kHangulV + kHangulVCount)
    return kHangulS + ((a - kHangulL) * kHangulVCount + (b - kHangulV)) * kHangulTCount;
  if (a >= kHangulS && a < kHangulS + kHangulSCount && (a - kHangulS) % kHangulTCount == 0 && b > kHangulT &&
      b < kHangulT + kHangulTCount)
    return a + (b - kHangulT);
  const auto* it = std::lower_bound(std::begin(unicode::kPrimaryComposites), std::end(unicode::kPrimaryComposites),
                                    std::pair(a, b), [](const unicode::Composition& c, const std::pair<uint32_t, uint32_t>& k) {
                                      return std::pair(c.first, c.second) < k;
                                    });
  if (it != std::end(unicode::kPrimaryComposites) && it->first == a && it->second == b) return it->composite;
  return 0;
}

// Unicode Normalization Form C (UAX #15): canonical decomposition, canonical ordering,
// canonical composition.
std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(text);
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    decompose(next_code_point(text, i, len), cps);
    i += len;
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Composition: a character joins the last starter unless a character between them
  // blocks it (after canonical ordering: the last one between, of a class >= its own).
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  std::optional<size_t> starter;  // index in `out`
  uint32_t last_class = 0;        // class of the last character appended
  for (uint32_t cp : cps) {
    const uint32_t cls = combining_class(cp);
    if (starter && (out.size() - 1 == *starter || last_class < cls)) {
      if (const uint32_t c = compose(out[*starter], cp)) {
        out[*starter] = c;
        continue;
      }
    }
    if (cls == 0) starter = out.size();
    last_class = cls;
    out.push_back(cp);
  }
  std::string s;
  s.reserve(text.size());
  for (uint32_t cp : out) append_utf8(s, cp);
  return s;
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

// --- Pre-tokenizer patterns

// The regexes recognised by exact string (as the models' tokenizer.json files write them).
enum class SplitPattern { Gpt2, Llama3, Qwen2 };
const std::pair<const char*, SplitPattern> kKnownPatterns[] = {
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", SplitPattern::Gpt2},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::Llama3},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::Qwen2},
};

struct Char {
  uint32_t cp;
  size_t offset;
  bool space, letter, number;
  bool other() const { return !space && !letter && !number; }
  bool line_break() const { return cp == '\r' || cp == '\n'; }
};

std::vector<Char> chars_of(std::string_view text) {
  std::vector<Char> cs;
  cs.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    const uint32_t cp = next_code_point(text, i, len);
    cs.push_back({cp, i, is_unicode_space(cp), is_letter(cp), is_number(cp)});
    i += len;
  }
  return cs;
}

// 's 't 're 've 'm 'll 'd at c[i] (with (?i), any case; U+017F 'ſ' folds to 's'):
// the match's length in characters, or 0.
size_t contraction_at(const std::vector<Char>& c, size_t i, bool ignore_case) {
  if (c[i].cp != '\'') return 0;
  const auto at = [&](size_t k) -> uint32_t {
    if (k >= c.size()) return 0;
    uint32_t x = c[k].cp;
    if (ignore_case) {
      if (x >= 'A' && x <= 'Z') x += 'a' - 'A';
      if (x == 0x17F) x = 's';
    }
    return x;
  };
  const uint32_t a = at(i + 1), b = at(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The length in characters of the pattern's match at c[i]: its alternatives tried in
// order, quantifiers greedy with the backtracking the alternatives need. Every
// character starts a match (of at least itself), so the matches tile the text.
size_t match_length(SplitPattern pattern, const std::vector<Char>& c, size_t i) {
  const size_t n = c.size();
  const auto run = [&](size_t k, auto pred) {
    while (k < n && pred(c[k])) ++k;
    return k;
  };
  const auto letter = [](const Char& x) { return x.letter; };
  const auto number = [](const Char& x) { return x.number; };
  const auto other = [](const Char& x) { return x.other(); };
  const auto space = [](const Char& x) { return x.space; };
  const auto line_break = [](const Char& x) { return x.line_break(); };
  if (pattern == SplitPattern::Gpt2) {
    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
    if (const size_t k = contraction_at(c, i, false)) return k;
    const bool spaced = c[i].cp == ' ' && i + 1 < n;
    if (spaced && c[i + 1].letter) return run(i + 1, letter) - i;
    if (c[i].letter) return run(i, letter) - i;
    if (spaced && c[i + 1].number) return run(i + 1, number) - i;
    if (c[i].number) return run(i, number) - i;
    if (spaced && c[i + 1].other()) return run(i + 1, other) - i;
    if (c[i].other()) return run(i, other) - i;
  } else {
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3} (Qwen2: \p{N})
    if (const size_t k = contraction_at(c, i, true)) return k;
    if (!c[i].line_break() && !c[i].letter && !c[i].number && i + 1 < n && c[i + 1].letter)
      return run(i + 1, letter) - i;
    if (c[i].letter) return run(i, letter) - i;
    if (c[i].number) return std::min<size_t>(run(i, number) - i, pattern == SplitPattern::Llama3 ? 3 : 1);
    // | ?[^\s\p{L}\p{N}]+[\r\n]*
    const size_t s = c[i].cp == ' ' && i + 1 < n && c[i + 1].other() ? i + 1 : i;
    if (c[s].other()) return run(run(s, other), line_break) - i;
    // |\s*[\r\n]+ : \s* gives back the run up to its last line break
    const size_t end = run(i, space);
    for (size_t k = end; k > i; --k)
      if (c[k - 1].line_break()) return k - i;
  }
  // |\s+(?!\S)|\s+ : before a non-space, the run's last whitespace is left to the next
  // match (unless the run is that one whitespace).
  const size_t end = run(i, space);
  if (end == n || end - 1 == i) return end - i;
  return end - 1 - i;
}

// The pattern's matches over `text`, as byte ranges.
std::vector<std::string_view> split_by_pattern(SplitPattern pattern, std::string_view text) {
  const std::vector<Char> c = chars_of(text);
  std::vector<std::string_view> out;
  for (size_t i = 0; i < c.size();) {
    const size_t len = std::max<size_t>(1, match_length(pattern, c, i));
    const size_t begin = c[i].offset, end = i + len < c.size() ? c[i + len].offset : text.size();
    out.push_back(text.substr(begin, end - begin));
    i += len;
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t at; (at = s.find(from, pos)) != std::string::npos; pos = at + from.size()) {
    out.append(s, pos, at - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

[[noreturn]] void bad_key(const fs::path& file, const std::string& key, const std::string& what) {
  throw Error(file.string() + ": key '" + key + "': " + what);
}

std::string string_field(const fs::path& file, const json& j, const std::string& key, const std::string& where,
                         std::optional<std::string> fallback = std::nullopt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    bad_key(file, where + "." + key, "missing (expected a string)");
  }
  if (!j[key].is_string()) bad_key(file, where + "." + key, "expected a string, got " + j[key].dump());
  return j[key].get<std::string>();
}

bool bool_field(const fs::path& file, const json& j, const std::string& key, const std::string& where, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) bad_key(file, where + "." + key, "expected true or false, got " + j[key].dump());
  return j[key].get<bool>();
}

// A Replace's pattern: {"String": s} (a {"Regex": r} is refused).
std::string string_pattern(const fs::path& file, const json& j, const std::string& where) {
  if (!j.contains("pattern") || !j["pattern"].is_object() || !j["pattern"].contains("String") ||
      !j["pattern"]["String"].is_string())
    bad_key(file, where + ".pattern",
            "only a string pattern ({\"String\": ...}) is supported, got " + j.value("pattern", json()).dump());
  const std::string s = j["pattern"]["String"].get<std::string>();
  if (s.empty()) bad_key(file, where + ".pattern", "the pattern is empty");
  return s;
}

enum class PrependScheme { First, Always, Never };

PrependScheme prepend_scheme(const fs::path& file, const json& j, const std::string& where) {
  // As tokenizers reads it: default "always"; add_prefix_space false (older files) means "never".
  PrependScheme scheme = PrependScheme::Always;
  const std::string s = string_field(file, j, "prepend_scheme", where, std::string("always"));
  if (s == "first") scheme = PrependScheme::First;
  else if (s == "never") scheme = PrependScheme::Never;
  else if (s != "always") bad_key(file, where + ".prepend_scheme", "'" + s + "' is not first, always or never");
  if (!bool_field(file, j, "add_prefix_space", where, true)) {
    if (scheme != PrependScheme::Never && j.contains("prepend_scheme"))
      bad_key(file, where + ".add_prefix_space", "false does not match prepend_scheme '" + s + "'");
    scheme = PrependScheme::Never;
  }
  return scheme;
}

std::string single_char(const fs::path& file, const json& j, const std::string& key, const std::string& where) {
  const std::string s = string_field(file, j, key, where);
  size_t len = 0;
  if (s.empty() || (next_code_point(s, 0, len), len != s.size()))
    bad_key(file, where + "." + key, "expected one character, got '" + s + "'");
  return s;
}

}  // namespace

struct BpeTokenizer::Pipeline {
  fs::path path;

  // normalizer: steps in order
  struct Normalizer {
    enum Kind { Nfc, Prepend, Replace } kind;
    std::string pattern, content;  // Prepend: content; Replace: pattern -> content
  };
  std::vector<Normalizer> normalizers;

  // pre_tokenizer: steps in order, each over every piece of the previous one
  struct PreTokenizer {
    enum Kind { ByteLevel, Split, Metaspace } kind;
    bool add_prefix_space = false, use_regex = true;  // ByteLevel
    SplitPattern pattern = SplitPattern::Gpt2;        // Split; ByteLevel with use_regex
    std::string replacement;                          // Metaspace
    PrependScheme scheme = PrependScheme::Always;
    bool split = true;
  };
  std::vector<PreTokenizer> pre_tokenizers;
  bool has_pre_tokenizer = false;
  bool byte_level = false;  // a ByteLevel step maps the pieces to GPT-2's byte alphabet

  // model
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> id_to_token;  // id -> model token ("" for gaps and added tokens)
  struct MergeTarget {
    int32_t rank;
    int64_t id;
  };
  std::unordered_map<uint64_t, MergeTarget> merges;  // (left id << 32 | right id) -> rank, merged id
  std::optional<std::string> unk_token;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  int64_t byte_token[256];  // byte fallback: the id of "<0xXX>", -1 if absent

  // added tokens
  struct Added {
    std::string content, match;  // match: the content, normalized for a normalized token
    int64_t id;
    bool normalized, lstrip, rstrip, special;
  };
  std::vector<Added> added;
  std::unordered_map<int64_t, size_t> added_by_id;

  // post_processor
  std::vector<int64_t> prefix, suffix;

  // decoder: steps in order over the list of token strings
  struct Decoder {
    enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
    std::string pattern, content;  // Replace; Strip's and Metaspace's character in content
    size_t start = 0, stop = 0;    // Strip
    PrependScheme scheme = PrependScheme::Always;
  };
  std::vector<Decoder> decoders;
  bool join_with_spaces = false;  // no decoder: tokens joined by " ", as tokenizers does

  bool stable_cuts = false;  // see stable_prefix_length

  std::string normalize(std::string_view text) const;
  struct Piece {
    std::string text;
    bool at_origin;  // starts at offset 0 of the original text (Metaspace's "first")
  };
  std::vector<Piece> pre_tokenize(Piece piece) const;
  void encode_word(std::string_view word, std::vector<int64_t>& out) const;
  // Splits `text` at the added tokens whose `normalized` equals `normalized`: appends to
  // `parts` the pieces between them (token -1) and the tokens (their ids).
  void split_added(std::string_view text, bool normalized, std::vector<std::pair<std::string_view, int64_t>>& parts) const;
  // The text's ids; or, with `pieces`, only the pieces the model would encode.
  std::vector<int64_t> encode(std::string_view text, std::vector<std::string>* pieces = nullptr) const;
};

std::string BpeTokenizer::Pipeline::normalize(std::string_view text) const {
  std::string s(text);
  for (const Normalizer& n : normalizers) {
    switch (n.kind) {
      case Normalizer::Nfc: s = nfc(s); break;
      case Normalizer::Prepend:
        if (!s.empty()) s = n.content + s;
        break;
      case Normalizer::Replace: replace_all(s, n.pattern, n.content); break;
    }
  }
  return s;
}

std::vector<BpeTokenizer::Pipeline::Piece> BpeTokenizer::Pipeline::pre_tokenize(Piece piece) const {
  std::vector<Piece> pieces;
  pieces.push_back(std::move(piece));
  const ByteAlphabet& ab = alphabet();
  for (const PreTokenizer& step : pre_tokenizers) {
    std::vector<Piece> next;
    for (Piece& p : pieces) {
      const auto keep = [&](std::string_view s, bool at_origin) {
        if (!s.empty()) next.push_back({std::string(s), at_origin});
      };
      switch (step.kind) {
        case PreTokenizer::ByteLevel: {
          if (step.add_prefix_space && p.text.front() != ' ') p.text.insert(0, " ");
          std::vector<std::string_view> parts;
          if (step.use_regex) parts = split_by_pattern(SplitPattern::Gpt2, p.text);
          else parts.push_back(p.text);
          for (std::string_view part : parts) {
            std::string mapped;
            for (char ch : part) mapped += ab.symbol[static_cast<unsigned char>(ch)];
            keep(mapped, p.at_origin && part.data() == p.text.data());
          }
          break;
        }
        case PreTokenizer::Split:
          for (std::string_view part : split_by_pattern(step.pattern, p.text))
            keep(part, p.at_origin && part.data() == p.text.data());
          break;
        case PreTokenizer::Metaspace: {
          std::string s = p.text;
          replace_all(s, " ", step.replacement);
          const bool starts = s.compare(0, step.replacement.size(), step.replacement) == 0;
          if (!starts && (step.scheme == PrependScheme::Always || (step.scheme == PrependScheme::First && p.at_origin)))
            s.insert(0, step.replacement);
          if (!step.split) {
            keep(s, p.at_origin);
            break;
          }
          // Split before every replacement character, which starts the next piece.
          size_t begin = 0;
          for (size_t at = s.find(step.replacement, 1); at != std::string::npos; at = s.find(step.replacement, at + 1)) {
            keep(std::string_view(s).substr(begin, at - begin), p.at_origin && begin == 0);
            begin = at;
          }
          keep(std::string_view(s).substr(begin), p.at_origin && begin == 0);
          break;
        }
      }
    }
    pieces.swap(next);
  }
  return pieces;
}

void BpeTokenizer::Pipeline::encode_word(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (const auto it = vocab.find(std::string(word)); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // The word's symbols, as tokenizers' Word: a doubly linked list over a vector; a
  // merged-away symbol has len 0.
  struct Symbol {
    int64_t id;
    std::ptrdiff_t prev, next;
    size_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int64_t id, size_t len) {
    const auto n = static_cast<std::ptrdiff_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  std::optional<std::pair<int64_t, size_t>> unk;  // pending unknown: id, bytes
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    next_code_point(word, i, len);
    ch.assign(word.substr(i, len));
    i += len;
    if (const auto it = vocab.find(ch); it != vocab.end()) {
      if (unk) add(unk->first, unk->second), unk.reset();
      add(it->second, len);
      continue;
    }
    if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) { return byte_token[static_cast<unsigned char>(b)] >= 0; })) {
      for (char b : ch) add(byte_token[static_cast<unsigned char>(b)], 1);
      continue;  // as tokenizers: a pending unknown stays pending
    }
    if (!unk_token) {
      // The piece, or its start (without a pre-tokenizer the piece is the whole text).
      size_t cut = std::min<size_t>(word.size(), 80);
      while (cut < word.size() && (static_cast<unsigned char>(word[cut]) & 0xC0) == 0x80) ++cut;
      const std::string shown = std::string(word.substr(0, cut)) + (cut < word.size() ? "..." : "");
      throw Error(path.string() + ": the vocabulary has no token '" + ch + "' (from the text piece '" + shown + "')" +
                  (byte_fallback ? ", and no byte fallback tokens for it" : "") + ", and model.unk_token is not set");
    }
    const auto unk_it = vocab.find(*unk_token);
    if (unk_it == vocab.end())
      throw Error(path.string() + ": model.unk_token '" + *unk_token + "' is not in model.vocab (needed for '" + ch + "')");
    if (unk && fuse_unk) {
      unk->second += len;
    } else {
      if (unk) add(unk->first, unk->second);
      unk = std::pair(unk_it->second, len);
    }
  }
  if (unk) add(unk->first, unk->second);

  // Merges, lowest rank first, then leftmost (tokenizers' Word::merge_all).
  struct Merge {
    size_t pos;
    int32_t rank;
    int64_t id;
  };
  const auto later = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  const auto merge_of = [&](int64_t left, int64_t right) -> const MergeTarget* {
    const auto it = merges.find(static_cast<uint64_t>(left) << 32 | static_cast<uint64_t>(right));
    return it == merges.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k)
    if (const MergeTarget* m = merge_of(symbols[k].id, symbols[k + 1].id)) queue.push({k, m->rank, m->id});
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const auto next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    const MergeTarget* target = merge_of(cur.id, right.id);
    if (!target || target->id != top.id) continue;
    cur.id = top.id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size())
      symbols[static_cast<size_t>(right.next)].prev = static_cast<std::ptrdiff_t>(top.pos);
    if (cur.prev >= 0)
      if (const MergeTarget* m = merge_of(symbols[static_cast<size_t>(cur.prev)].id, cur.id))
        queue.push({static_cast<size_t>(cur.prev), m->rank, m->id});
    if (cur.next >= 0)
      if (const MergeTarget* m = merge_of(cur.id, symbols[static_cast<size_t>(cur.next)].id))
        queue.push({top.pos, m->rank, m->id});
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

void BpeTokenizer::Pipeline::split_added(std::string_view text, bool normalized,
                                         std::vector<std::pair<std::string_view, int64_t>>& parts) const {
  // Leftmost match, the longest at that position (tokenizers' Aho-Corasick, LeftmostLongest).
  // next_at[i]: the first occurrence of added[i] at or after the position it was last
  // searched from; searched again only once a match has moved `pos` past it, so each
  // token's occurrences are found in one left-to-right scan in all (linear in the text
  // for each token, where searching every token again after each match is quadratic).
  constexpr size_t kNotSearched = std::string_view::npos - 1;
  std::vector<size_t> next_at(added.size(), kNotSearched);
  size_t piece_start = 0;  // start of the text not yet assigned
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best_at = std::string_view::npos, best_len = 0;
    const Added* best = nullptr;
    for (size_t i = 0; i < added.size(); ++i) {
      const Added& a = added[i];
      if (a.normalized != normalized || a.match.empty()) continue;
      if (next_at[i] == kNotSearched || (next_at[i] != std::string_view::npos && next_at[i] < pos))
        next_at[i] = text.find(a.match, pos);
      const size_t at = next_at[i];
      if (at == std::string_view::npos) continue;
      if (at < best_at || (at == best_at && a.match.size() > best_len)) {
        best_at = at;
        best_len = a.match.size();
        best = &a;
      }
    }
    if (!best) break;
    size_t start = best_at, stop = best_at + best_len;
    if (best->lstrip) {  // the whitespace before it goes with it
      size_t s = start;
      while (s > piece_start) {
        size_t k = s - 1;
        while (k > piece_start && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t len = 1;
        if (!is_unicode_space(next_code_point(text, k, len))) break;
        s = k;
      }
      start = s;
    }
    if (best->rstrip) {  // and the whitespace after it
      while (stop < text.size()) {
        size_t len = 1;
        if (!is_unicode_space(next_code_point(text, stop, len))) break;
        stop += len;
      }
    }
    if (start > piece_start) parts.emplace_back(text.substr(piece_start, start - piece_start), -1);
    parts.emplace_back(text.substr(start, stop - start), best->id);
    piece_start = pos = stop;
  }
  if (piece_start < text.size() || text.empty()) parts.emplace_back(text.substr(piece_start), -1);
}

std::vector<int64_t> BpeTokenizer::Pipeline::encode(std::string_view text, std::vector<std::string>* pieces) const {
  std::vector<int64_t> ids;
  // 1. Added tokens matched in the original text; 2. the rest normalized, then the
  // added tokens matched in the normalized text; 3. the rest pre-tokenized into pieces
  // and each piece encoded by the model.
  std::vector<std::pair<std::string_view, int64_t>> parts;
  split_added(text, false, parts);
  for (const auto& [part, id] : parts) {
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    const bool part_at_origin = part.data() == text.data();
    const std::string normalized = normalize(part);
    std::vector<std::pair<std::string_view, int64_t>> sub;
    split_added(normalized, true, sub);
    for (const auto& [s, sid] : sub) {
      if (sid >= 0) {
        ids.push_back(sid);
        continue;
      }
      if (s.empty()) continue;
      for (const Piece& p : pre_tokenize({std::string(s), part_at_origin && s.data() == normalized.data()})) {
        if (pieces) pieces->push_back(p.text);
        else encode_word(p.text, ids);
      }
    }
  }
  return ids;
}

// --- Loading

namespace {

using Pipeline = BpeTokenizer::Pipeline;

void load_normalizer(const fs::path& file, const json& j, const std::string& where, Pipeline& p) {
  if (j.is_null()) return;
  if (!j.is_object()) bad_key(file, where, "expected an object, got " + j.dump());
  const std::string type = string_field(file, j, "type", where);
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      bad_key(file, where + ".normalizers", "missing or not an array");
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      load_normalizer(file, j["normalizers"][i], where + ".normalizers[" + std::to_string(i) + "]", p);
  } else if (type == "NFC") {
    p.normalizers.push_back({Pipeline::Normalizer::Nfc, "", ""});
  } else if (type == "Prepend") {
    p.normalizers.push_back({Pipeline::Normalizer::Prepend, "", string_field(file, j, "prepend", where)});
  } else if (type == "Replace") {
    p.normalizers.push_back({Pipeline::Normalizer::Replace, string_pattern(file, j, where), string_field(file, j, "content", where)});
  } else {
    bad_key(file, where + ".type", "'" + type + "' is not supported (supported normalizers: NFC, Prepend, Replace, Sequence)");
  }
}

void load_pre_tokenizer(const fs::path& file, const json& j, const std::string& where, Pipeline& p) {
  if (j.is_null()) return;
  if (!j.is_object()) bad_key(file, where, "expected an object, got " + j.dump());
  const std::string type = string_field(file, j, "type", where);
  Pipeline::PreTokenizer step;
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      bad_key(file, where + ".pretokenizers", "missing or not an array");
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      load_pre_tokenizer(file, j["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]", p);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Pipeline::PreTokenizer::ByteLevel;
    step.add_prefix_space = bool_field(file, j, "add_prefix_space", where, false);
    step.use_regex = bool_field(file, j, "use_regex", where, true);
    if (p.byte_level) bad_key(file, where, "a second ByteLevel step is not supported");
    p.byte_level = true;
  } else if (type == "Split") {
    step.kind = Pipeline::PreTokenizer::Split;
    if (p.byte_level) bad_key(file, where, "a Split after a ByteLevel step is not supported");
    const json pattern = j.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
      bad_key(file, where + ".pattern", "only a {\"Regex\": ...} pattern is supported, got " + pattern.dump());
    const std::string regex = pattern["Regex"].get<std::string>();
    const auto* known = std::find_if(std::begin(kKnownPatterns), std::end(kKnownPatterns),
                                     [&](const auto& k) { return regex == k.first; });
    if (known == std::end(kKnownPatterns))
      bad_key(file, where + ".pattern.Regex",
              "the pattern '" + regex + "' is not one of the supported ones (GPT-2's, Llama 3's, Qwen2's)");
    step.pattern = known->second;
    const std::string behavior = string_field(file, j, "behavior", where);
    if (behavior != "Isolated") bad_key(file, where + ".behavior", "'" + behavior + "' is not supported (only Isolated)");
    if (bool_field(file, j, "invert", where, false)) bad_key(file, where + ".invert", "true is not supported");
  } else if (type == "Metaspace") {
    step.kind = Pipeline::PreTokenizer::Metaspace;
    if (p.byte_level) bad_key(file, where, "a Metaspace after a ByteLevel step is not supported");
    step.replacement = single_char(file, j, "replacement", where);
    step.scheme = prepend_scheme(file, j, where);
    step.split = bool_field(file, j, "split", where, true);
  } else {
    bad_key(file, where + ".type",
            "'" + type + "' is not supported (supported pre-tokenizers: ByteLevel, Split, Metaspace, Sequence)");
  }
  p.pre_tokenizers.push_back(step);
}

void load_post_processor(const fs::path& file, const json& j, const std::string& where, Pipeline& p) {
  if (j.is_null()) return;
  if (!j.is_object()) bad_key(file, where, "expected an object, got " + j.dump());
  const std::string type = string_field(file, j, "type", where);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      bad_key(file, where + ".processors", "missing or not an array");
    for (size_t i = 0; i < j["processors"].size(); ++i)
      load_post_processor(file, j["processors"][i], where + ".processors[" + std::to_string(i) + "]", p);
  } else if (type == "ByteLevel") {
    // Offsets only; the ids are unchanged.
  } else if (type == "TemplateProcessing") {
    if (!j.contains("single") || !j["single"].is_array()) bad_key(file, where + ".single", "missing or not an array");
    const json specials = j.value("special_tokens", json::object());
    std::vector<int64_t> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < j["single"].size(); ++i) {
      const json& piece = j["single"][i];
      const std::string at = where + ".single[" + std::to_string(i) + "]";
      if (piece.contains("Sequence")) {
        if (piece["Sequence"].value("id", std::string()) != "A" || seen_sequence)
          bad_key(file, at, "a single-sequence template holds $A once, got " + piece.dump());
        seen_sequence = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        const std::string name = piece["SpecialToken"]["id"].get<std::string>();
        if (!specials.contains(name) || !specials[name].contains("ids") || !specials[name]["ids"].is_array())
          bad_key(file, where + ".special_tokens", "no ids for the template's special token '" + name + "'");
        for (const json& id : specials[name]["ids"]) {
          if (!id.is_number_integer()) bad_key(file, where + ".special_tokens." + name + ".ids", "expected integers, got " + id.dump());
          (seen_sequence ? after : before).push_back(id.get<int64_t>());
        }
      } else {
        bad_key(file, at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + piece.dump());
      }
    }
    if (!seen_sequence) bad_key(file, where + ".single", "the template has no $A");
    p.prefix.insert(p.prefix.begin(), before.begin(), before.end());
    p.suffix.insert(p.suffix.end(), after.begin(), after.end());
  } else {
    bad_key(file, where + ".type",
            "'" + type + "' is not supported (supported post-processors: TemplateProcessing, ByteLevel, Sequence)");
  }
}

void load_decoder(const fs::path& file, const json& j, const std::string& where, Pipeline& p) {
  if (!j.is_object()) bad_key(file, where, "expected an object, got " + j.dump());
  const std::string type = string_field(file, j, "type", where);
  Pipeline::Decoder d;
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) bad_key(file, where + ".decoders", "missing or not an array");
    for (size_t i = 0; i < j["decoders"].size(); ++i)
      load_decoder(file, j["decoders"][i], where + ".decoders[" + std::to_string(i) + "]", p);
    return;
  } else if (type == "ByteLevel") {
    d.kind = Pipeline::Decoder::ByteLevel;
  } else if (type == "Replace") {
    d.kind = Pipeline::Decoder::Replace;
    d.pattern = string_pattern(file, j, where);
    d.content = string_field(file, j, "content", where);
  } else if (type == "ByteFallback") {
    d.kind = Pipeline::Decoder::ByteFallback;
  } else if (type == "Fuse") {
    d.kind = Pipeline::Decoder::Fuse;
  } else if (type == "Strip") {
    d.kind = Pipeline::Decoder::Strip;
    d.content = single_char(file, j, "content", where);
    for (const char* k : {"start", "stop"})
      if (!j.contains(k) || !j[k].is_number_unsigned())
        bad_key(file, where + "." + k, "expected a count, got " + j.value(k, json()).dump());
    d.start = j["start"].get<size_t>();
    d.stop = j["stop"].get<size_t>();
  } else if (type == "Metaspace") {
    d.kind = Pipeline::Decoder::Metaspace;
    d.content = single_char(file, j, "replacement", where);
    d.scheme = prepend_scheme(file, j, where);
  } else {
    bad_key(file, where + ".type",
            "'" + type + "' is not supported (supported decoders: ByteLevel, Metaspace, Sequence of Replace, "
            "ByteFallback, Fuse, Strip)");
  }
  p.decoders.push_back(d);
}

void load_model(const fs::path& file, const json& model, Pipeline& p) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") bad_key(file, "model.type", "'" + type + "' is not supported (BPE only)");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    bad_key(file, "model.dropout", "BPE dropout (" + model["dropout"].dump() + ") is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && !model[k].is_null() && !(model[k].is_string() && model[k].get<std::string>().empty()))
      bad_key(file, std::string("model.") + k, "is not supported (got " + model[k].dump() + ")");
  p.fuse_unk = bool_field(file, model, "fuse_unk", "model", false);
  p.byte_fallback = bool_field(file, model, "byte_fallback", "model", false);
  p.ignore_merges = bool_field(file, model, "ignore_merges", "model", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null())
    p.unk_token = string_field(file, model, "unk_token", "model");

  if (!model.contains("vocab") || !model["vocab"].is_object()) bad_key(file, "model.vocab", "missing or not an object");
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId)
      bad_key(file, "model.vocab",
              "entry '" + token + "' must map to an integer id in [0, " + std::to_string(kMaxTokenId) + ")");
    const int64_t v = id.get<int64_t>();
    p.vocab[token] = v;
    if (static_cast<int64_t>(p.id_to_token.size()) <= v) p.id_to_token.resize(static_cast<size_t>(v + 1));
    p.id_to_token[static_cast<size_t>(v)] = token;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = p.vocab.find(name);
    p.byte_token[b] = it == p.vocab.end() ? -1 : it->second;
  }
  if (!model.contains("merges") || !model["merges"].is_array()) bad_key(file, "model.merges", "missing or not an array");
  int32_t rank = 0;
  for (const json& m : model["merges"]) {
    std::string left, right;
    const std::string entry = "entry " + std::to_string(rank);
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        bad_key(file, "model.merges", entry + " '" + s + "' is not \"left right\"");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      bad_key(file, "model.merges", entry + " " + m.dump() + " is not a pair");
    }
    int64_t ids[3];
    const std::string parts[3] = {left, right, left + right};
    for (int k = 0; k < 3; ++k) {
      const auto it = p.vocab.find(parts[k]);
      if (it == p.vocab.end()) bad_key(file, "model.merges", entry + " (" + left + " " + right + "): '" + parts[k] + "' is not in model.vocab");
      ids[k] = it->second;
    }
    // A repeated pair takes its last rank, as tokenizers' map does.
    p.merges[static_cast<uint64_t>(ids[0]) << 32 | static_cast<uint64_t>(ids[1])] = {rank++, ids[2]};
  }
}

}  // namespace

BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::load(const fs::path& file) {
  const json j = read_json_object(file, "a tokenizer.json");
  if (!j.contains("model") || !j["model"].is_object())
    throw Error(file.string() + ": not a Hugging Face tokenizer.json (no \"model\" object)");
  auto p = std::make_unique<Pipeline>();
  p->path = file;
  for (const char* k : {"truncation", "padding"})
    if (j.contains(k) && !j[k].is_null()) bad_key(file, k, "is not supported (it changes the ids; expected null)");
  load_model(file, j["model"], *p);
  load_normalizer(file, j.value("normalizer", json()), "normalizer", *p);
  const json pre = j.value("pre_tokenizer", json());
  load_pre_tokenizer(file, pre, "pre_tokenizer", *p);
  p->has_pre_tokenizer = !p->pre_tokenizers.empty();
  load_post_processor(file, j.value("post_processor", json()), "post_processor", *p);
  const json decoder = j.value("decoder", json());
  if (!decoder.is_null()) load_decoder(file, decoder, "decoder", *p);
  else if (p->byte_level) p->decoders.push_back({Pipeline::Decoder::ByteLevel, "", "", 0, 0, PrependScheme::Always});
  else p->join_with_spaces = true;

  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) bad_key(file, "added_tokens", "expected an array");
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
      const json& a = j["added_tokens"][i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string() ||
          !a["id"].is_number_integer())
        bad_key(file, "added_tokens", "entry " + a.dump() + " needs an integer id and a string content");
      Pipeline::Added t;
      t.content = a["content"].get<std::string>();
      t.id = a["id"].get<int64_t>();
      if (t.id < 0 || t.id >= kMaxTokenId)
        bad_key(file, "added_tokens",
                "entry '" + t.content + "' has id " + std::to_string(t.id) + ", not in [0, " + std::to_string(kMaxTokenId) + ")");
      if (t.content.empty()) continue;
      if (bool_field(file, a, "single_word", where, false))
        bad_key(file, where + ".single_word", "true is not supported (token '" + t.content + "')");
      t.special = bool_field(file, a, "special", where, false);
      t.normalized = bool_field(file, a, "normalized", where, false);
      t.lstrip = bool_field(file, a, "lstrip", where, false);
      t.rstrip = bool_field(file, a, "rstrip", where, false);
      t.match = t.normalized ? p->normalize(t.content) : t.content;
      p->added_by_id[t.id] = p->added.size();
      p->added.push_back(std::move(t));
      if (static_cast<int64_t>(p->id_to_token.size()) <= p->added.back().id)
        p->id_to_token.resize(static_cast<size_t>(p->added.back().id + 1));
    }
  }

  // Cuts before " x" are stable when no step can join text across them (see
  // stable_prefix_length): normalizers NFC only, a pre-tokenizer that splits there.
  p->stable_cuts = p->has_pre_tokenizer &&
                   std::all_of(p->normalizers.begin(), p->normalizers.end(),
                               [](const Pipeline::Normalizer& n) { return n.kind == Pipeline::Normalizer::Nfc; }) &&
                   std::all_of(p->pre_tokenizers.begin(), p->pre_tokenizers.end(),
                               [](const Pipeline::PreTokenizer& s) {
                                 return s.kind != Pipeline::PreTokenizer::Metaspace || s.split;
                               }) &&
                   std::any_of(p->pre_tokenizers.begin(), p->pre_tokenizers.end(),
                               [](const Pipeline::PreTokenizer& s) {
                                 return s.kind != Pipeline::PreTokenizer::ByteLevel || s.use_regex;
                               }) &&
                   std::none_of(p->added.begin(), p->added.end(), [](const Pipeline::Added& a) {
                     return a.match.find(' ') != std::string::npos || a.content.find(' ') != std::string::npos ||
                            !starts_with_ascii_punctuation(a.match) || !starts_with_ascii_punctuation(a.content);
                   });
  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  tok->pipeline_ = std::move(p);
  return tok;
}

std::string BpeTokenizer::name() const { return pipeline_->path.string(); }

bool BpeTokenizer::knows(int64_t id) const {
  const Pipeline& p = *pipeline_;
  return p.added_by_id.count(id) > 0 ||
         (id >= 0 && id < static_cast<int64_t>(p.id_to_token.size()) && !p.id_to_token[static_cast<size_t>(id)].empty());
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_sequence_length(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

std::vector<int64_t> encode_for_model(const Tokenizer& tokenizer, std::string_view text, std::optional<int64_t> bos,
                                      const std::string& where) {
  if (dynamic_cast<const BpeTokenizer*>(&tokenizer))
    if (const std::optional<size_t> at = first_invalid_utf8(text)) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[*at])));
      throw Error(where + ": the text is not UTF-8 at byte " + std::to_string(*at) + " (" + byte + "); " +
                  tokenizer.name() + " reads Unicode text (convert the file to UTF-8, e.g. with iconv)");
    }
  std::vector<int64_t> ids;
  try {
    ids = tokenizer.encode(text);
  } catch (Error& e) {
    e.add_context(where);
    throw;
  }
  if (bos && (ids.empty() || ids.front() != *bos)) ids.insert(ids.begin(), *bos);
  return ids;
}

std::string decode_known(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<int64_t> known;
  known.reserve(ids.size());
  for (int64_t id : ids)
    if (tokenizer.knows(id)) known.push_back(id);
  return tokenizer.decode(known);
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(pipeline_->id_to_token.size()); }

const std::vector<int64_t>& BpeTokenizer::template_prefix() const { return pipeline_->prefix; }
const std::vector<int64_t>& BpeTokenizer::template_suffix() const { return pipeline_->suffix; }

std::optional<int64_t> BpeTokenizer::token_id(const std::string& token) const {
  for (const auto& a : pipeline_->added)
    if (a.content == token) return a.id;
  const auto it = pipeline_->vocab.find(token);
  if (it != pipeline_->vocab.end()) return it->second;
  return std::nullopt;
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const { return pipeline_->encode(text); }

std::vector<std::string> BpeTokenizer::pieces(std::string_view text) const {
  std::vector<std::string> out;
  pipeline_->encode(text, &out);
  return out;
}

std::vector<int64_t> BpeTokenizer::encode_with_special_tokens(std::string_view text) const {
  std::vector<int64_t> ids = pipeline_->prefix;
  const std::vector<int64_t> body = pipeline_->encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), pipeline_->suffix.begin(), pipeline_->suffix.end());
  return ids;
}

size_t BpeTokenizer::stable_prefix_length(std::string_view text) const {
  if (!pipeline_->stable_cuts) return 0;
  auto letter_or_digit = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  // Before " x": the piece before ends at the space (a run of letters, numbers or
  // symbols stops there; a whitespace run leaves its last space to the next piece, and
  // Llama 3's \s*[\r\n]+ ends at a line break), and the space starts the next piece
  // (Metaspace: its replacement character starts a piece). NFC composes nothing across
  // a space.
  for (size_t c = text.size() >= 2 ? text.size() - 2 : 0; c > 0; --c)
    if (text[c] == ' ' && letter_or_digit(text[c + 1])) return c;
  return 0;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  const Pipeline& p = *pipeline_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    if (const auto it = p.added_by_id.find(id); it != p.added_by_id.end()) {
      tokens.push_back(p.added[it->second].match);  // a normalized token as normalized, as tokenizers
      continue;
    }
    if (id < 0 || id >= static_cast<int64_t>(p.id_to_token.size()) || p.id_to_token[static_cast<size_t>(id)].empty())
      throw Error(p.path.string() + ": token id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(p.id_to_token[static_cast<size_t>(id)]);
  }
  const ByteAlphabet& ab = alphabet();
  for (const Pipeline::Decoder& d : p.decoders) {
    std::vector<std::string> next;
    switch (d.kind) {
      case Pipeline::Decoder::ByteLevel: {
        // Each token's characters back to bytes (a token with a character outside the
        // alphabet, e.g. an added token with a space, stays as it is), read as UTF-8.
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string mapped;
          bool all = true;
          for (size_t i = 0; i < t.size() && all;) {
            size_t len = 1;
            const auto it = ab.to_byte.find(next_code_point(t, i, len));
            if (it == ab.to_byte.end()) all = false;
            else mapped += static_cast<char>(it->second);
            i += len;
          }
          bytes += all ? mapped : t;
        }
        next.push_back(utf8_lossy(bytes));
        break;
      }
      case Pipeline::Decoder::Replace:
        for (std::string t : tokens) {
          replace_all(t, d.pattern, d.content);
          next.push_back(std::move(t));
        }
        break;
      case Pipeline::Decoder::ByteFallback: {
        // Runs of "<0xXX>" tokens become their bytes when those are UTF-8, else one
        // U+FFFD per byte.
        std::string run;
        size_t run_tokens = 0;
        const auto flush = [&] {
          if (!run_tokens) return;
          if (utf8_lossy(run) == run) {
            next.push_back(run);
          } else {
            for (size_t k = 0; k < run_tokens; ++k) next.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_tokens = 0;
        };
        for (const std::string& t : tokens) {
          unsigned value = 0;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::from_chars(t.data() + 3, t.data() + 5, value, 16).ptr == t.data() + 5) {
            run += static_cast<char>(value);
            ++run_tokens;
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        break;
      }
      case Pipeline::Decoder::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case Pipeline::Decoder::Strip:
        for (const std::string& t : tokens) {
          std::string_view s = t;
          for (size_t k = 0; k < d.start && s.substr(0, d.content.size()) == d.content; ++k) s.remove_prefix(d.content.size());
          for (size_t k = 0; k < d.stop && s.size() >= d.content.size() &&
                             s.substr(s.size() - d.content.size()) == d.content;
               ++k)
            s.remove_suffix(d.content.size());
          next.emplace_back(s);
        }
        break;
      case Pipeline::Decoder::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string t = tokens[i];
          const bool drop = i == 0 && d.scheme != PrependScheme::Never;
          replace_all(t, d.content, drop ? "" : " ");
          next.push_back(std::move(t));
        }
        break;
    }
    tokens.swap(next);
  }
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i && p.join_with_spaces) out += ' ';
    out += tokens[i];
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
