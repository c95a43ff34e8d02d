#include "experiments/range_grammar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

// parse_range() with its errors (overflow, too many values) located at `key` of `t`.
std::optional<std::vector<ParamValue>> parse_range_at(const ConfigTable& t, std::string_view key,
                                                      const std::string& text) {
  try {
    return parse_range(text);
  } catch (const ConfigError& e) {
    t.fail(key, e.what());
  }
}

// A string that starts with a number and holds "..": meant as a range (no format,
// preset or keyword starts with a digit).
bool looks_like_range(const std::string& s) {
  static const std::regex re(R"(^\s*[-+]?[0-9.][^{}]*\.\.)");
  return std::regex_search(s, re);
}

namespace {

// Decimal places of a number as written: "0.25" 2, "1e-3" 3, "2.5e1" 0, "7" 0.
int decimals_written(const std::string& number) {
  const size_t e = number.find_first_of("eE");
  const std::string mantissa = number.substr(0, e);
  const size_t dot = mantissa.find('.');
  const int fraction = dot == std::string::npos ? 0 : static_cast<int>(mantissa.size() - dot - 1);
  const int exponent = e == std::string::npos ? 0 : std::atoi(number.c_str() + e + 1);
  return std::max(0, fraction - exponent);
}

}  // namespace

std::optional<std::vector<ParamValue>> parse_range(const std::string& text) {
  static const std::regex re(R"(^\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*\.\.\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(?::\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?))?\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return std::nullopt;
  auto is_int = [](const std::string& s) { return s.find_first_of(".eE") == std::string::npos; };
  const std::string a = m[1], b = m[2], st = m[3].matched ? std::string(m[3]) : "1";
  auto too_many = [&](const std::string& count) {
    return ConfigError("range '" + text + "' has " + count + " values, more than " + std::to_string(kMaxRangeValues));
  };
  std::vector<ParamValue> out;
  if (is_int(a) && is_int(b) && is_int(st)) {
    int64_t lo = 0, hi = 0, step = 0;
    try {
      lo = std::stoll(a), hi = std::stoll(b), step = std::stoll(st);
    } catch (const std::out_of_range&) {
      throw ConfigError("range '" + text + "': a number is outside the 64-bit integer range");
    }
    if (step <= 0 || hi < lo) return std::vector<ParamValue>{};
    const __int128 count = (static_cast<__int128>(hi) - lo) / step + 1;  // no overflow
    if (count > kMaxRangeValues) throw too_many(format_double(static_cast<double>(count)));
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.emplace_back(lo + i * step);
    return out;
  }
  const double lo = std::strtod(a.c_str(), nullptr), hi = std::strtod(b.c_str(), nullptr),
               step = std::strtod(st.c_str(), nullptr);
  if (!std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(step))
    throw ConfigError("range '" + text + "': a number is outside the double range");
  if (!(step > 0) || hi < lo) return std::vector<ParamValue>{};
  const double count = std::floor((hi - lo) / step + 1e-9) + 1;
  if (!(count <= static_cast<double>(kMaxRangeValues))) throw too_many(format_double(count));
  // lo + i·step rounded to the decimals LO and STEP are written with drops binary
  // noise (0.1 + 2·0.1 is 0.30000000000000004; -0.3 + 3·0.1 is 5.6e-17), so values
  // and point keys read as the range was written.
  const int decimals = std::max(decimals_written(a), decimals_written(st));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
    const double v = lo + static_cast<double>(i) * step;
    if (decimals > 340) {
      out.emplace_back(v);
      continue;
    }
    std::vector<char> text(static_cast<size_t>(decimals) + 330);
    std::snprintf(text.data(), text.size(), "%.*f", decimals, v);
    out.emplace_back(std::strtod(text.data(), nullptr) + 0.0);  // + 0.0: no -0
  }
  return out;
}

}  // namespace kvb
