// The weights of a checkpoint, converted to fp32 (from F32, F16 or BF16) and
// rearranged once at load time into the layouts the forward pass multiplies with:
// every dense layer is [out, in] (nn.Linear's layout; GPT-2's Conv1D [in, out] is
// transposed), and the q/k/v projections (and SwiGLU's gate/up) are stacked into one
// matrix so that each takes a single GEMM.
#pragma once
#include <Eigen/Core>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "sim/io/tensor_store.h"
#include "sim/model/model_config.h"

namespace kvb {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct DenseWeights {
  RowMatrix weight;      // [out, in]
  Eigen::VectorXf bias;  // [out], or empty when the layer has no bias
};

struct NormWeights {
  Eigen::VectorXf weight;  // [hidden]
  Eigen::VectorXf bias;    // [hidden] for LayerNorm; empty for RMSNorm
};

struct BlockWeights {
  NormWeights attn_norm;   // before attention (ln_1 / input_layernorm)
  NormWeights mlp_norm;    // before the MLP (ln_2 / post_attention_layernorm)
  DenseWeights qkv;        // [(q_heads + 2 kv_heads) * head_dim, hidden]: q rows, then k, then v
  DenseWeights attn_out;   // [hidden, q_heads * head_dim]
  DenseWeights mlp_in;     // gated: [2 * intermediate, hidden], gate rows then up rows;
                           // plain: [intermediate, hidden]
  DenseWeights mlp_out;    // [hidden, intermediate]
};

struct ModelWeights {
  RowMatrix token_embedding;     // [vocab, hidden]
  RowMatrix position_embedding;  // [max_positions, hidden] (GPT-2), else empty
  std::vector<BlockWeights> blocks;
  NormWeights final_norm;
  RowMatrix lm_head;             // [vocab, hidden]; empty when tied to the embedding

  const RowMatrix& output_embedding() const { return lm_head.size() ? lm_head : token_embedding; }
  size_t bytes() const;          // fp32 bytes held
};

// The tensors of a checkpoint directory: model.safetensors, else the shards of
// model.safetensors.index.json. With both, the single file is read, as Hugging Face
// does, and *warning (when given) says so; otherwise it is left alone. Throws kvb::Error
// naming the directory when neither exists.
std::unique_ptr<TensorStore> open_checkpoint(const std::filesystem::path& dir, std::string* warning = nullptr);

// Reads every weight the config's architecture needs. A missing weight, or one with
// the wrong shape, is a kvb::Error naming the checkpoint file and the tensor key.
ModelWeights load_model_weights(const ModelConfig& config, const TensorStore& store);

}  // namespace kvb
