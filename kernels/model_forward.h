// CudaTransformer: the model forward pass (sim/model/transformer.h) on the device, for
// every architecture the CPU one runs (GPT-2; Llama with default, linear or llama3
// RoPE, GQA, tied or untied embeddings; Qwen2's q/k/v biases; sliding-window and
// hybrid layers), with the same semantics: extend() runs new tokens after those in the
// state's cache (all tokens at once: teacher forcing; a prompt then one token at a
// time: generation), and returns their logits to the host: the output embedding's
// product runs in chunks of rows, each copied through page-locked memory while the next
// one computes, into the caller's memory or a new matrix.
//
// Weights are uploaded once, in their stored dtype (fp32, fp16 or bf16). Each dense
// layer converts its matrix to an fp32 device scratch (exact) and multiplies with
// cublasSgemm: in ForwardMath::Fp32 with CUBLAS_DEFAULT_MATH (true fp32, no TF32), in
// ForwardMath::Tf32 with CUBLAS_TF32_TENSOR_OP_MATH (faster, about 1e-3 relative
// error per product; declared, never the default). Norms (sums in double, as the CPU),
// RoPE (the host's cos/sin table of the model's inverse frequencies), activations and
// residuals are elementwise kernels; attention is one kernel with an online softmax
// over the exact cache, which stays on the device.
//
// A Plan's cache (ExtendOptions::cache) is reconstructed on the device with the formats'
// CUDA twins (kernels/unit_reconstruction.h), each layer's whole cache at its current
// length as KvCache::view does, and query t reads token j in the version
// row_versions() names (sim/plan.h). A plan with a format that has no twin is a
// kvb::Error naming the format and unit, never a fallback to the CPU. Two differences
// from the CPU's cache: score estimators are never used (QJL, the only format with one,
// has no twin, so its plans are refused), and a reconstruction is not checked for
// finiteness (the CPU throws; here non-finite values reach the logits).
//
// With the exact cache, logits agree with the CPU's within fp32 rounding (different
// summation orders): tests/gpu/test_forward.cpp requires 1e-5 relative to max |logit|
// and the same argmax. Through a quantized cache, a key or value that differs in its
// last bit and sits on a rounding boundary of the format may land a quantization step
// away, so the test checks the plan path on identical inputs (attention_on_device).
// One object serves one host thread (it keeps device scratch). Host-only header.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/model/transformer.h"

namespace kvb::cuda {

enum class ForwardMath { Fp32, Tf32 };
const char* forward_math_name(ForwardMath m);  // "fp32" / "tf32"

// Empty when the device forward pass can run `plan`; otherwise why not (the first
// format without a CUDA twin and its unit). Needs no device.
std::string forward_unsupported_reason(const Plan& plan);

// One layer's attention as the forward pass runs it on the device, on host inputs (for
// tests against sim/model/attention.h's causal_attention on the same inputs): queries
// [n, q_heads * head_dim] of positions context - n .. context - 1, keys and values
// [kv_heads, context, head_dim] (post-RoPE), through cache.plan's units of `layer` when
// set. Returns [n, q_heads * head_dim].
std::vector<float> attention_on_device(const float* queries, int64_t n, const float* keys, const float* values,
                                       int64_t context, const AttentionGeometry& geo, int64_t layer,
                                       const CacheQuantization& cache);

class CudaTransformer {
 public:
  // Uploads the host model's weights to device 0. Throws kvb::Error when no device is
  // usable or the weights do not fit.
  explicit CudaTransformer(std::shared_ptr<const Transformer> host, ForwardMath math = ForwardMath::Fp32);
  ~CudaTransformer();
  CudaTransformer(const CudaTransformer&) = delete;
  CudaTransformer& operator=(const CudaTransformer&) = delete;

  const Transformer& host() const { return *host_; }
  const ModelConfig& config() const { return host_->config(); }
  ForwardMath math() const { return math_; }
  size_t weight_bytes() const;  // device bytes of the uploaded weights

  // The device KV cache of one sequence: per layer, keys, pre-RoPE keys (RoPE models)
  // and values [kv_heads, capacity, head_dim]; grows as tokens are appended.
  struct DeviceCache;
  struct State {
    std::shared_ptr<DeviceCache> cache;
    int64_t length = 0;
    std::vector<int64_t> tokens;
  };
  State new_state() const;

  // As Transformer::extend (the same checks and errors, the same capture layout).
  RowMatrix extend(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt) const;
  // Teacher forcing: a fresh state, every token.
  RowMatrix forward(std::span<const int64_t> tokens, const ExtendOptions& opt = {}) const;
  // The same, writing the logits [n, vocab] (or [1, vocab] without all_logits) row-major
  // into the caller's host memory: no allocation, and the copy from the device overlaps
  // the output embedding's product (a model-level sweep's 4096 x 128256 logits are 2.1 GB).
  void extend(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const;
  void forward(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const;
  // The most bytes of logits computed and copied at once (default 128 MiB; tests set a
  // few rows' worth to run many chunks on a small vocabulary).
  void set_logits_chunk_bytes(int64_t bytes);

 private:
  struct Impl;
  std::shared_ptr<const Transformer> host_;
  ForwardMath math_;
  std::unique_ptr<Impl> impl_;
};

// Generation on the device: kvb::generate / greedy_generate are templates over the
// model, so it has the host's prompt rule and token choice.
using kvb::generate;
using kvb::greedy_generate;

}  // namespace kvb::cuda
