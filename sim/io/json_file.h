// Reading a whole JSON file (config.json, tokenizer.json) with errors that name it.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace kvb {

// The parsed file. kvb::Error "<file>: cannot open (<what>)" when it cannot be read,
// "<file>: malformed JSON: ..." when it does not parse, and "<file>: expected a JSON
// object" unless it is one.
nlohmann::json read_json_object(const std::filesystem::path& file, const std::string& what);

// Parses JSON text like nlohmann::json::parse (throwing nlohmann::json::exception when
// it is malformed), but a key repeated within one object, which nlohmann::json would
// silently collapse to its last value, calls on_duplicate(key, parent): parent is the
// key whose value is that object, "" for the top-level object. on_duplicate is
// expected to throw.
nlohmann::json parse_json_checking_duplicates(
    std::string_view text, const std::function<void(const std::string&, const std::string&)>& on_duplicate);

}  // namespace kvb
