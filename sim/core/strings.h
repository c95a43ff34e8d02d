// String helpers shared by config parsing and error messages.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

// Levenshtein edit distance.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` if it is plausibly a typo of it (distance at most
// max(2, |word|/3)), else "".
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// The hint that error messages about an unknown name append: " (did you mean 'x'?)"
// with x = closest_match(word, candidates), or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& parts, std::string_view sep);
std::vector<std::string> split(std::string_view s, char sep);
std::string trim(std::string_view s);

// Replaces every "{key}" in pattern by value.
std::string replace_all(std::string pattern, std::string_view key, std::string_view value);

// Shortest round-trippable decimal form of a double ("0.1", "1e-05", "3").
std::string format_double(double v);
// Four significant digits ("%.4g": "3.812", "1.18e+06"), for console messages.
std::string four_digits(double v);

// Appends `text` to `list` unless it is empty or already there (notes and warnings said
// once each, in the order first given).
void append_once(std::vector<std::string>& list, const std::string& text);

}  // namespace kvb
