#include "sim/io/json_file.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "sim/core/error.h"
#include "sim/io/input_file.h"

namespace kvb {

nlohmann::json read_json_object(const std::filesystem::path& file, const std::string& what) {
  require_regular_file(file, what);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot open (" + what + ")");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = parse_json_checking_duplicates(text.str(), [&](const std::string& key, const std::string& parent) {
      throw Error(file.string() + ": duplicate key '" + key + "'" + (parent.empty() ? "" : " in '" + parent + "'"));
    });
  } catch (const nlohmann::json::exception& e) {
    throw Error(file.string() + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(file.string() + ": expected a JSON object, got " + std::string(j.type_name()));
  return j;
}

nlohmann::json parse_json_checking_duplicates(
    std::string_view text, const std::function<void(const std::string&, const std::string&)>& on_duplicate) {
  using nlohmann::json;
  // For each object being parsed: the key it is the value of ("" at the top), and the
  // keys seen in it so far.
  std::vector<std::pair<std::string, std::set<std::string>>> open_objects;
  std::string last_key;
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    // `depth` counts the containers open around the event; a container's start event is
    // given the depth outside it, so the one that opens nesting level kMaxJsonDepth + 1
    // arrives with depth == kMaxJsonDepth.
    const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (depth + (opens ? 1 : 0) > kMaxJsonDepth) throw JsonTooDeep();
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back(open_objects.empty() ? std::string() : last_key, std::set<std::string>());
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (open_objects.empty() || !parsed.is_string()) break;
        last_key = parsed.get<std::string>();
        if (!open_objects.back().second.insert(last_key).second) on_duplicate(last_key, open_objects.back().first);
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), cb);
}

}  // namespace kvb
