#include "sim/io/recording_writer.h"

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/tensor_writer.h"

namespace kvb {

void write_recording(const std::filesystem::path& path, const Recording& rec, DType dtype,
                     const std::map<std::string, std::string>& extra_metadata) {
  if (rec.has_sparse_queries())
    throw Error(path.string() + ": recording '" + rec.name + "' keeps the queries of " +
                std::to_string(rec.layers[0].query_positions.size()) + " sampled positions only, and a recording file "
                "holds every position's query; write it from a recording with all of them");
  std::vector<TensorToWrite> tensors;
  for (int64_t i = 0; i < rec.num_layers(); ++i) {
    const LayerTensors& L = rec.layers[static_cast<size_t>(i)];
    const std::string p = "layers." + std::to_string(rec.layer_ids[static_cast<size_t>(i)]) + ".";
    tensors.push_back(TensorToWrite::of_tensor(p + "query", L.query, dtype));
    tensors.push_back(TensorToWrite::of_tensor(p + "key", L.key, dtype));
    tensors.push_back(TensorToWrite::of_tensor(p + "value", L.value, dtype));
    if (!L.key_pre_rope.empty()) tensors.push_back(TensorToWrite::of_tensor(p + "key_pre_rope", L.key_pre_rope, dtype));
    if (!L.attn_output.empty()) tensors.push_back(TensorToWrite::of_tensor(p + "attn_output", L.attn_output, dtype));
  }
  if (!rec.token_ids.empty())
    tensors.push_back(TensorToWrite::of_ints("input_ids", {rec.tokens}, rec.token_ids.data(), DType::I32));
  std::map<std::string, std::string> meta = rec.metadata;
  meta["tokens"] = std::to_string(rec.tokens);
  meta["layout"] = "query/key/value: [heads, tokens, head_dim]; attn_output: [tokens, heads*head_dim]";
  meta["rope"] = rec.rope.applied ? "key/query are post-RoPE; key_pre_rope is pre-RoPE" : "none";
  if (rec.rope.applied) meta["rope_theta"] = format_double(rec.rope.theta);
  if (rec.rope.applied && !rec.rope.inv_freq.empty()) meta["rope_inv_freq"] = rope_inv_freq_text(rec.rope.inv_freq);
  if (!rec.source.empty()) meta["source"] = rec.source;
  for (const auto& [k, v] : extra_metadata) meta[k] = v;
  write_safetensors(path, tensors, meta);
}

}  // namespace kvb
