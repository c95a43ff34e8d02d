#include "sim/model/layer_selection.h"

#include <algorithm>
#include <optional>
#include <set>

#include "sim/core/error.h"
#include "sim/core/strings.h"

namespace kvb {

namespace {

// A whole non-negative decimal number, or nullopt.
std::optional<int64_t> layer_index(const std::string& s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(s);
}

}  // namespace

std::vector<int64_t> parse_layer_selection(const std::string& text, const ModelConfig& config,
                                           const std::string& where) {
  const int64_t L = config.layers;
  const std::string model = config.dir.string();
  const std::string spec = trim(text);
  if (spec.empty())
    throw ConfigError(where + ": empty; give all, full, sliding, or layer indices such as 0,2,5-7");
  std::vector<int64_t> layers;
  if (spec == "all" || spec == "full" || spec == "sliding") {
    for (int64_t l = 0; l < L; ++l)
      if (spec == "all" || config.is_sliding(l) == (spec == "sliding")) layers.push_back(l);
    if (layers.empty())
      throw ConfigError(where + " " + spec + ": " + model + " has no " +
                        (spec == "sliding" ? "sliding-window" : "full-attention") + " layers (" +
                        std::to_string(config.sliding_layers()) + " of its " + std::to_string(L) +
                        " layers slide)");
    return layers;
  }
  std::set<int64_t> chosen;
  for (const std::string& raw : split(spec, ',')) {
    const std::string part = trim(raw);
    const size_t dash = part.find('-');
    const std::optional<int64_t> first = layer_index(dash == std::string::npos ? part : trim(part.substr(0, dash)));
    const std::optional<int64_t> last = dash == std::string::npos ? first : layer_index(trim(part.substr(dash + 1)));
    if (!first || !last)
      throw ConfigError(where + " '" + text + "': '" + part +
                        "' is not a layer index or range (give all, full, sliding, or indices such as 0,2,5-7)");
    if (*last < *first) throw ConfigError(where + " '" + text + "': range '" + part + "' runs backwards");
    if (*last >= L)
      throw ConfigError(where + " '" + text + "': layer " + std::to_string(*last) + " does not exist: " + model +
                        " has " + std::to_string(L) + " layers (0.." + std::to_string(L - 1) + ")");
    for (int64_t l = *first; l <= *last; ++l) chosen.insert(l);
  }
  return std::vector<int64_t>(chosen.begin(), chosen.end());
}

void quantize_only_layers(Plan& plan, const std::vector<int64_t>& quantized, const FormatPtr& kept_format) {
  std::vector<bool> keep_plan(static_cast<size_t>(plan.layers()), false);
  for (int64_t l : quantized) {
    if (l < 0 || l >= plan.layers())
      throw Error("layer " + std::to_string(l) + " is outside the plan's " + std::to_string(plan.layers()) + " layers");
    keep_plan[static_cast<size_t>(l)] = true;
  }
  for (int64_t l = 0; l < plan.layers(); ++l) {
    if (keep_plan[static_cast<size_t>(l)]) continue;
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        UnitPlan& u = plan.unit(l, g, kind);
        u.segments = {Segment{0, plan.tokens(), kept_format, SegmentRole::Allocated}};
        u.window = RecentWindow{};
      }
  }
}

}  // namespace kvb
