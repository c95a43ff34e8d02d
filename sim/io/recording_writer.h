// Writes a Recording as one safetensors file in the layout load_recording() reads by
// default (and data/records/*.safetensors use):
//   layers.{l}.query [q_heads, T, d], layers.{l}.key / value [kv_heads, T, d],
//   layers.{l}.key_pre_rope [kv_heads, T, d] (when recorded),
//   layers.{l}.attn_output [T, q_heads * d] (when recorded), input_ids I32 [T],
// with the recording's metadata plus a few descriptive keys in __metadata__.
#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "sim/io/tensor_store.h"
#include "sim/recording.h"

namespace kvb {

// `dtype` (F32, F16 or BF16) applies to the float tensors. Layer l is written under
// its original index rec.layer_ids[l]. Atomic (temporary file + rename).
void write_recording(const std::filesystem::path& path, const Recording& rec, DType dtype,
                     const std::map<std::string, std::string>& extra_metadata = {});

}  // namespace kvb
