// The numeric range grammar of config values: "2..8", "0.1..0.5:0.1" (LO..HI or
// LO..HI:STEP, inclusive), used by sweep axes ([[strategy]] parameters and vars),
// calibration.positions and metrics.positions (configs/README.md).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/config.h"
#include "sim/strategies/strategy.h"

namespace kvb {

// The most values one range may expand to.
inline constexpr int64_t kMaxRangeValues = 1000000;

// Numeric range "2..8" or "0.1..0.5:0.1" -> values (ints when all parts are ints);
// nullopt when `text` is not a range, an empty vector when the range is empty (b < a
// or step <= 0). Throws ConfigError (without a location) when a number overflows or
// the range has more than kMaxRangeValues values.
std::optional<std::vector<ParamValue>> parse_range(const std::string& text);

// parse_range() with its errors (overflow, too many values) located at `key` of `t`.
std::optional<std::vector<ParamValue>> parse_range_at(const ConfigTable& t, std::string_view key,
                                                      const std::string& text);

// A string that starts with a number and holds "..": meant as a range (no format,
// preset or keyword starts with a digit).
bool looks_like_range(const std::string& s);

}  // namespace kvb
