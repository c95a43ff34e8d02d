// Small helpers for parsing format names such as "int4-asym-g32-sfp32".
#pragma once
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

// A format name split on '-'.
class NameParts {
 public:
  explicit NameParts(std::string_view name) {
    size_t start = 0;
    while (start <= name.size()) {
      const size_t dash = name.find('-', start);
      const size_t end = dash == std::string_view::npos ? name.size() : dash;
      parts_.push_back(name.substr(start, end - start));
      if (dash == std::string_view::npos) break;
      start = dash + 1;
    }
  }
  size_t size() const { return parts_.size(); }
  std::string_view at(size_t i) const { return i < parts_.size() ? parts_[i] : std::string_view{}; }
  bool head_starts_with(std::string_view p) const { return !parts_.empty() && parts_[0].substr(0, p.size()) == p; }

 private:
  std::vector<std::string_view> parts_;
};

// "g32" with prefix "g" -> 32; nullopt if s is not prefix + decimal digits.
inline std::optional<int64_t> parse_int_suffix(std::string_view s, std::string_view prefix) {
  if (s.size() <= prefix.size() || s.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = s.substr(prefix.size());
  int64_t v = 0;
  const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (res.ec != std::errc() || res.ptr != digits.data() + digits.size()) return std::nullopt;
  return v;
}

// A float written in a format name: plain decimal, no exponent and no sign (names are
// split on '-'), the shortest form that reads back to the same float ("0.5", "448").
inline std::string name_number(float v) {
  char buf[96];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  return std::string(buf, res.ptr);
}

// Parses what name_number() writes (digits with an optional '.'); nullopt otherwise.
inline std::optional<float> parse_name_number(std::string_view s) {
  if (s.empty() || s.find_first_not_of("0123456789.") != std::string_view::npos) return std::nullopt;
  float v = 0;
  const auto res = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::fixed);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace kvb
