// Quantizing only some layers of a model's KV cache (hybrid models: only the
// full-attention layers, or only the sliding-window ones; issue 21 item 6).
//
// A selection names the layers a plan quantizes; every other layer's units are stored
// whole at one "kept" format instead of the plan's, without a recency window:
// keep-fp16 by default (the model's own half-precision cache, the 16 bits the bits per
// element compare against), or keep-fp32, which leaves those layers' caches exact (the
// reconstruction is the identity) and counts them at 32 bits. Memory (Plan::bpe,
// storage_bits_at) counts the kept layers at that format, so a plan's bits per element
// are those of the whole cache.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/formats/format.h"
#include "sim/model/model_config.h"
#include "sim/plan.h"

namespace kvb {

// The default format of the layers a selection leaves out.
inline constexpr const char* kDefaultKeptLayerFormat = "keep-fp16";

// The layers `text` names, ascending and distinct:
//   "all"      every layer
//   "full"     the full-attention layers (ModelConfig::attention_kinds)
//   "sliding"  the sliding-window layers
//   "0,2,5-7"  indices and inclusive ranges (0-based)
// Throws kvb::ConfigError, naming `where` (e.g. "--layers"), for an empty text or
// selection (a model without sliding layers has no "sliding" ones), an unknown word, a
// malformed range, or a layer outside 0 .. layers-1.
std::vector<int64_t> parse_layer_selection(const std::string& text, const ModelConfig& config,
                                           const std::string& where);

// Every layer of `plan` not in `quantized` gets, for each KV head and kind, one
// segment [0, T) at `kept_format` (role Allocated) and no recency window; the
// layers in `quantized` keep the plan's units. The prefill is unchanged. Throws
// kvb::Error for a layer outside the plan.
void quantize_only_layers(Plan& plan, const std::vector<int64_t>& quantized, const FormatPtr& kept_format);

}  // namespace kvb
