#include "sim/core/strings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace kvb {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = static_cast<size_t>(-1);
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string close = closest_match(word, candidates);
  return close.empty() ? std::string() : " (did you mean '" + close + "'?)";
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string replace_all(std::string pattern, std::string_view key, std::string_view value) {
  const std::string token = "{" + std::string(key) + "}";
  size_t pos = 0;
  while ((pos = pattern.find(token, pos)) != std::string::npos) {
    pattern.replace(pos, token.size(), value);
    pos += value.size();
  }
  return pattern;
}

std::string four_digits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

void append_once(std::vector<std::string>& list, const std::string& text) {
  if (!text.empty() && std::find(list.begin(), list.end(), text) == list.end()) list.push_back(text);
}

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

}  // namespace kvb
