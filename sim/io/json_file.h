// Reading a whole JSON file (config.json, tokenizer.json) with errors that name it.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace kvb {

// The parsed file. kvb::Error "<file>: cannot open (<what>)" when it cannot be read,
// "<file>: malformed JSON: ..." when it does not parse, and "<file>: expected a JSON
// object" unless it is one.
nlohmann::json read_json_object(const std::filesystem::path& file, const std::string& what);

}  // namespace kvb
