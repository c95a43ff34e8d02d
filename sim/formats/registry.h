// The format table: every quantizer family the simulator knows, in one list that
// the CLI (`kvbudget formats`), configs, sweeps and tests all iterate over.
// Adding a format family means adding one entry to format_families() in registry.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

// A canonical name covering one of a family's variants, and the largest relative MSE
// Σ(x̂ - x)² / Σx² its round trip may have on N(0, 1) data (tests/formats/test_format_table.cpp
// measures it on [256 tokens, 128 channels], seed 17, as ggml's test-quantize-fns checks
// a maximum error per type).
struct FormatExample {
  std::string name;
  double max_rel_mse;
};

struct FormatFamily {
  std::string name;         // "int", "keep", ...
  std::string syntax;       // name grammar shown to users
  std::string description;  // one line
  // Examples covering the family's variants: tests round-trip and check every one,
  // `kvbudget formats` prints them.
  std::vector<FormatExample> examples;
  // Returns nullptr when `name` is not of this family; throws kvb::ConfigError when
  // it is of this family but malformed ("int9-asym-g32: bits must be 1..8").
  FormatPtr (*parse)(std::string_view name);
  // Every format of the family has a CUDA twin (kernels/twin_table.cpp maps the family
  // to it). The one list of which families run under backend = "cuda", in every build,
  // CUDA or not.
  bool cuda_twin = false;
};

const std::vector<FormatFamily>& format_families();

// The family whose parser accepts `format`'s name.
const FormatFamily& format_family(const Format& format);

// Whether `format` has a CUDA twin (its family's cuda_twin; false for a format outside
// the table).
bool has_cuda_twin(const Format& format);

// Why a span of `tokens` x `head_dim` is too large for a table of every example's bits
// (`kvbudget formats`, Python's formats()), or "" when it is not: storage bits are
// counted in int64 and the examples store under kMaxExampleBitsPerElement bits per
// element (the most, qjl-m256 at head_dim 1: 272), so a span may have at most
// INT64_MAX / kMaxExampleBitsPerElement elements.
inline constexpr int64_t kMaxExampleBitsPerElement = 1024;
std::string table_span_error(int64_t tokens, int64_t head_dim);

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
