// The weights of a checkpoint, rearranged once at load time into the layouts the
// forward pass multiplies with: every dense layer is [out, in] (nn.Linear's layout;
// GPT-2's Conv1D [in, out] is transposed), and the q/k/v projections (and SwiGLU's
// gate/up) are stacked into one matrix so that each takes a single GEMM.
//
// Matrices stay in the checkpoint's dtype: a BF16 or F16 checkpoint takes its own size
// in memory, not twice it, and dense() (layers.h) converts one tile at a time to fp32
// as it multiplies; the conversion is exact, so the arithmetic is the same as with
// weights converted up front. Norm weights and biases (vectors) are held in fp32.
#pragma once
#include <Eigen/Core>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sim/io/tensor_store.h"
#include "sim/model/model_config.h"

namespace kvb {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Memory for weights: buffers of 4 MiB or more are aligned to 2 MiB and advised as
// transparent huge pages (madvise MADV_HUGEPAGE; a hint the kernel may ignore), so that
// filling gigabytes of weights takes one page fault per 2 MiB instead of per 4 KiB;
// smaller ones are 64-byte aligned. Throws std::bad_alloc when none is left.
void* allocate_weight_bytes(size_t bytes);
void free_weight_bytes(void* p) noexcept;

// A vector whose elements start uninitialized (a checkpoint's bits are copied straight
// in; zeroing gigabytes first would cost as much as the copy), in allocate_weight_bytes.
template <class T>
struct NoInitAllocator : std::allocator<T> {
  using value_type = T;
  NoInitAllocator() = default;
  template <class U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
  template <class U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  T* allocate(size_t n) { return static_cast<T*>(allocate_weight_bytes(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { free_weight_bytes(p); }
};
template <class T, class U>
bool operator==(const NoInitAllocator<T>&, const NoInitAllocator<U>&) noexcept {
  return true;
}

// A row-major [rows, cols] matrix held in F32, F16 or BF16.
class WeightMatrix {
 public:
  using Bits = std::vector<uint16_t, NoInitAllocator<uint16_t>>;

  WeightMatrix() = default;
  explicit WeightMatrix(RowMatrix f32);
  // 16-bit values (dtype F16 or BF16), row-major.
  WeightMatrix(DType dtype, int64_t rows, int64_t cols, Bits bits);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  DType dtype() const { return dtype_; }
  size_t bytes() const;  // bytes held

  // The fp32 matrix when held in F32, else nullptr.
  const RowMatrix* f32() const { return dtype_ == DType::F32 ? &f32_ : nullptr; }
  // Rows [first, first + count) converted to fp32 into out (count × cols, row-major).
  void rows_to_f32(int64_t first, int64_t count, float* out) const;
  // The 16-bit values (rows × cols, row-major) when held in F16 or BF16, else empty: the
  // checkpoint's own bits, e.g. for uploading to a device as they are.
  const Bits& bits16() const { return bits_; }

  // [cols, rows]: GPT-2's Conv1D weights are stored [in, out].
  WeightMatrix transposed() const;
  // The matrices' rows one after another (same cols); held in their common dtype, or
  // in fp32 when they differ.
  static WeightMatrix stack_rows(const std::vector<WeightMatrix>& parts);

 private:
  DType dtype_ = DType::F32;
  int64_t rows_ = 0, cols_ = 0;
  RowMatrix f32_;               // dtype F32
  Bits bits_;                   // dtype F16 / BF16
};

struct DenseWeights {
  WeightMatrix weight;   // [out, in]
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
  WeightMatrix token_embedding;     // [vocab, hidden]
  WeightMatrix position_embedding;  // [max_positions, hidden] (GPT-2), else empty
  std::vector<BlockWeights> blocks;
  NormWeights final_norm;
  WeightMatrix lm_head;             // [vocab, hidden]; empty when tied to the embedding

  const WeightMatrix& output_embedding() const { return lm_head.empty() ? token_embedding : lm_head; }
  size_t bytes() const;             // bytes held (16-bit weights at 2 bytes each)
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
