// Reading a whole JSON file (config.json, tokenizer.json) with errors that name it.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace kvb {

// The deepest nesting the parsers here accept. Checkpoint configs, tokenizers and
// safetensors headers nest a few levels; deeper text is malformed or hostile (and
// nlohmann::json recurses when it prints such a value). Deeper text throws JsonTooDeep,
// a nlohmann::json::exception, so it is reported wherever malformed JSON is.
inline constexpr int kMaxJsonDepth = 64;
struct JsonTooDeep : nlohmann::json::exception {
  JsonTooDeep() : exception(0, "JSON nests deeper than 64 levels of objects and arrays") {}
};
static_assert(kMaxJsonDepth == 64, "JsonTooDeep's message names the limit");

// The parsed file. kvb::Error "<file>: cannot open (<what>)" when it cannot be read,
// "<file>: malformed JSON: ..." when it does not parse, "<file>: duplicate key ..."
// when an object repeats a key, and "<file>: expected a JSON object" unless it is one.
nlohmann::json read_json_object(const std::filesystem::path& file, const std::string& what);

// Parses JSON text like nlohmann::json::parse (throwing nlohmann::json::exception when
// it is malformed), but a key repeated within one object, which nlohmann::json would
// silently collapse to its last value, calls on_duplicate(key, parent): parent is the
// key whose value is that object, "" for the top-level object. on_duplicate is
// expected to throw.
nlohmann::json parse_json_checking_duplicates(
    std::string_view text, const std::function<void(const std::string&, const std::string&)>& on_duplicate);

}  // namespace kvb
