#include "sim/io/json_file.h"

#include <fstream>
#include <sstream>

#include "sim/core/error.h"

namespace kvb {

nlohmann::json read_json_object(const std::filesystem::path& file, const std::string& what) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot open (" + what + ")");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(file.string() + ": malformed JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(file.string() + ": expected a JSON object, got " + std::string(j.type_name()));
  return j;
}

}  // namespace kvb
