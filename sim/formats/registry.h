// The format table: every quantizer family the simulator knows, in one list that
// the CLI (`kvbudget formats`), configs, sweeps and tests all iterate over.
// Adding a format family means adding one entry to format_families() in registry.cpp.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

struct FormatFamily {
  std::string name;         // "int", "keep", ...
  std::string syntax;       // name grammar shown to users
  std::string description;  // one line
  // Canonical names covering the family's variants: tests round-trip and check
  // every one, `kvbudget formats` prints them.
  std::vector<std::string> examples;
  // Returns nullptr when `name` is not of this family; throws kvb::ConfigError when
  // it is of this family but malformed ("int9-asym-g32: bits must be 1..8").
  FormatPtr (*parse)(std::string_view name);
};

const std::vector<FormatFamily>& format_families();

// Named presets (e.g. "kivi-2" -> a canonical name). Looked up before families.
struct FormatAlias {
  std::string alias;
  std::string canonical;
  std::string reproduces;  // what it is named after
};
const std::vector<FormatAlias>& format_aliases();

// Parses a format name (alias or canonical). Throws kvb::ConfigError listing the
// families and the closest known names when nothing matches.
FormatPtr make_format(std::string_view name);

}  // namespace kvb
