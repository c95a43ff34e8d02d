#include "sim/io/npy.h"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <optional>

#include "sim/core/error.h"
#include "sim/io/dtype_convert.h"
#include "sim/io/mapped_file.h"

namespace kvb {

namespace {

// The header text for an error message, on one line: padding and the final newline
// dropped, other control bytes escaped, at most 200 characters.
std::string quoted_header(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  std::string out = "\"";
  for (char c : text.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", u);
      out += esc;
    }
  }
  return out + (text.size() > 200 ? "...\"" : "\"");
}

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

// One value of the header dict: a string, a boolean, or a tuple of integers. Anything
// else (a list, as structured dtypes use) is `Other`, which the caller rejects.
struct PyValue {
  enum class Kind { String, Bool, IntTuple, Other } kind = Kind::Other;
  std::string text;            // String: the string; otherwise the literal's source text
  bool flag = false;           // Bool
  std::vector<int64_t> ints;   // IntTuple
};

// Recursive-descent reader of the small Python literal subset NumPy writes.
class PyDictReader {
 public:
  PyDictReader(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}

  std::vector<std::pair<std::string, PyValue>> read_dict() {
    std::vector<std::pair<std::string, PyValue>> out;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = read_string();
      expect(':');
      PyValue v = read_value();
      out.emplace_back(std::move(key), std::move(v));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') bad("expected ',' or '}'");
    }
    ++pos_;
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(where_, "bad .npy header: " + what + " at offset " + std::to_string(pos_) + " of " + quoted_header(s_));
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string read_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("expected a quoted string");
    const size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  int64_t read_int() {
    skip_space();
    const size_t start = pos_;
    while (std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    if (pos_ == start) bad("expected a non-negative integer");
    if (peek() == 'L') ++pos_;  // Python 2 long suffix in old files
    const std::string digits(s_.substr(start, pos_ - start));
    if (digits.size() > 18) bad("dimension " + digits + " too large");
    return std::stoll(digits);
  }
  PyValue read_value() {
    skip_space();
    PyValue v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::String;
      v.text = read_string();
    } else if (s_.substr(pos_, 4) == "True") {
      v.kind = PyValue::Kind::Bool;
      v.flag = true;
      pos_ += 4;
    } else if (s_.substr(pos_, 5) == "False") {
      v.kind = PyValue::Kind::Bool;
      pos_ += 5;
    } else if (c == '(') {
      v.kind = PyValue::Kind::IntTuple;
      ++pos_;
      while (true) {
        skip_space();
        if (peek() == ')') break;
        v.ints.push_back(read_int());
        skip_space();
        if (peek() == ',') ++pos_;
        else if (peek() != ')') bad("expected ',' or ')' in shape");
      }
      ++pos_;
    } else {  // a list or anything else: skip to the matching bracket, keep its text
      const size_t start = pos_;
      int depth = 0;
      while (pos_ < s_.size()) {
        const char d = s_[pos_];
        if (d == '[' || d == '(' || d == '{') ++depth;
        if (d == ']' || d == ')' || d == '}') {
          if (depth == 0) break;
          --depth;
        }
        if (d == ',' && depth == 0) break;
        ++pos_;
      }
      v.text = std::string(s_.substr(start, pos_ - start));
    }
    return v;
  }

  std::string_view s_;
  std::string where_;
  size_t pos_ = 0;
};

std::optional<DType> dtype_from_descr(const std::string& descr) {
  if (descr.size() < 3) return std::nullopt;
  const char order = descr[0];
  const std::string code = descr.substr(1);
  if (code == "u1") return DType::U8;
  if (code == "i1") return DType::I8;
  if (code == "b1") return DType::BOOL;
  if (order != '<') return std::nullopt;
  if (code == "f4") return DType::F32;
  if (code == "f2") return DType::F16;
  if (code == "f8") return DType::F64;
  if (code == "i2") return DType::I16;
  if (code == "i4") return DType::I32;
  if (code == "i8") return DType::I64;
  return std::nullopt;
}

}  // namespace

int64_t NpyHeader::numel() const { return Tensor::count(shape); }
uint64_t NpyHeader::data_bytes() const { return static_cast<uint64_t>(numel()) * dtype_bytes(dtype); }

uint64_t npy_header_size(const uint8_t* bytes, uint64_t available, const std::string& where) {
  if (available < 10 || std::memcmp(bytes, kMagic, 6) != 0) {
    if (available >= 6 && std::memcmp(bytes, kMagic, 6) != 0) fail(where, "not a .npy file (no \\x93NUMPY magic)");
    fail(where, "truncated .npy: " + std::to_string(available) + " bytes");
  }
  const int major = bytes[6];
  if (major == 1) return 10 + load_le(bytes + 8, 2);
  if (major == 2 || major == 3) {
    if (available < 12) fail(where, "truncated .npy: " + std::to_string(available) + " bytes");
    return 12 + load_le(bytes + 8, 4);
  }
  fail(where, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(bytes[7]) +
                  " (supported: 1.0, 2.0, 3.0)");
}

NpyHeader parse_npy_header(const uint8_t* bytes, uint64_t available, const std::string& where) {
  const uint64_t total = npy_header_size(bytes, available, where);
  if (total > available)
    fail(where, "truncated .npy: header needs " + std::to_string(total) + " bytes, the file has " +
                    std::to_string(available));
  const uint64_t dict_start = bytes[6] == 1 ? 10 : 12;
  const std::string_view text(reinterpret_cast<const char*>(bytes + dict_start), total - dict_start);
  PyDictReader reader(text, where);
  NpyHeader h;
  h.data_offset = total;
  bool have_descr = false, have_order = false, have_shape = false;
  for (auto& [key, v] : reader.read_dict()) {
    if (key == "descr") {
      if (v.kind != PyValue::Kind::String)
        fail(where, "structured or record dtype " + v.text + " is not supported; save a plain numeric array");
      const auto dt = dtype_from_descr(v.text);
      if (!dt) {
        if (!v.text.empty() && v.text[0] == '>')
          fail(where, "big-endian dtype '" + v.text + "' is not supported; save with arr.astype('<" +
                          v.text.substr(1) + "')");
        fail(where, "unsupported dtype '" + v.text + "' (supported: '<f4', '<f2', '<f8', '<i2', '<i4', '<i8', "
                    "'|u1', '|i1', '|b1')");
      }
      h.dtype = *dt;
      have_descr = true;
    } else if (key == "fortran_order") {
      if (v.kind != PyValue::Kind::Bool) fail(where, "bad .npy header: fortran_order must be True or False");
      h.fortran_order = v.flag;
      have_order = true;
    } else if (key == "shape") {
      if (v.kind != PyValue::Kind::IntTuple) fail(where, "bad .npy header: shape must be a tuple of integers");
      h.shape = v.ints;
      have_shape = true;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    fail(where, "bad .npy header: needs 'descr', 'fortran_order' and 'shape'; got " + quoted_header(text));
  checked_numel(h.shape, dtype_bytes(h.dtype), where);
  return h;
}

}  // namespace kvb
