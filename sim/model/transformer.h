// Transformer: the fp32 forward pass of a Hugging Face causal LM checkpoint (see
// model_config.h for the architectures), with a KV cache that attention reads either
// exactly or reconstructed through a Plan (kv_cache.h).
//
// One code path serves teacher forcing and generation: extend() runs a chunk of new
// tokens at the positions after those already in the cache. A fresh state and all T
// tokens is teacher forcing; a prompt, then one token at a time, is generation.
// Dense layers are Eigen GEMMs; work is parallel with OpenMP when called outside a
// parallel region, and results are bit-identical for any thread count.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/model/kv_cache.h"
#include "sim/model/model_config.h"
#include "sim/model/weights.h"
#include "sim/recording.h"

namespace kvb {

struct ExtendOptions {
  CacheQuantization cache;    // exact cache, or through a Plan
  bool all_logits = true;     // false: logits of the last new token only (generation)
  // When set, receives per layer what attention consumed for the new tokens, in the
  // recording layout (recording.h): query [q_heads, n, d] and key [kv_heads, n, d]
  // post-RoPE, key_pre_rope (RoPE models), value, attn_output [n, q_heads * d].
  // Queries, keys and values are this run's exact ones (computed from the layer's
  // input, before the cache quantizes them); attn_output is what this run's
  // attention produced, with the plan's cache when there is one.
  std::vector<LayerTensors>* capture = nullptr;
};

class Transformer {
 public:
  // Reads dir/config.json and the safetensors weights (single or sharded).
  static std::shared_ptr<const Transformer> load(const std::filesystem::path& dir);
  Transformer(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // What load() found questionable but read anyway (which of two weight files it
  // used), for the caller to print; empty when constructed directly.
  const std::vector<std::string>& load_warnings() const { return load_warnings_; }

  struct State {
    KvCache cache;
    int64_t length = 0;           // tokens processed so far (the next token's position)
    std::vector<int64_t> tokens;  // their ids, [length]: where a plan's phase marker is
  };
  State new_state() const;

  // Runs `tokens` at positions state.length, state.length + 1, ... and appends them to
  // the state's cache. Returns logits [n, vocab] (or [1, vocab] without all_logits).
  // With a plan that has a phase marker (Plan::phase_marker), the cache's phases switch
  // at the first marker among the state's tokens, these included (given in a prompt or
  // generated), and not before one is there.
  // Throws kvb::Error for a token id outside the vocabulary (naming the index) or a
  // position beyond a learned position table.
  RowMatrix extend(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt) const;
  // The same, writing the logits row-major into the caller's memory ([n, vocab] floats,
  // or [1, vocab] without all_logits; every one is written).
  void extend_into(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const;

  // Teacher forcing: a fresh state, every token. Logits [T, vocab].
  RowMatrix forward(std::span<const int64_t> tokens, const ExtendOptions& opt = {}) const;
  // The same into the caller's memory, as extend_into: a sweep's points reuse one
  // buffer instead of allocating and faulting in [T, vocab] floats each (2 GiB at
  // 4096 tokens of a 128256-token vocabulary).
  void forward_into(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const;

  // Dense FLOPs of one token at context length `context` (2 per multiply-add: the
  // projections, the MLP, the LM head, and q·k and p·v over `context` keys).
  double flops_per_token(int64_t context) const;

  // Throws extend()'s kvb::Error for a token id outside the vocabulary or a position
  // beyond a learned position table (also used by the CUDA forward pass).
  void check_tokens(std::span<const int64_t> tokens, int64_t first_position) const;

 private:
  CacheRope cache_rope() const;  // this model's RoPE context for its KV cache

  ModelConfig config_;
  ModelWeights weights_;
  std::vector<std::string> load_warnings_;
  std::vector<float> inv_freq_;  // RoPE inverse frequencies, [head_dim / 2]
};

// Chooses a new token from the logits [vocab] of the last token; `step` counts the new
// tokens before it (0 for the first).
using TokenChooser = std::function<int64_t(std::span<const float> logits, int64_t step)>;
// Greedy decoding's choice: the argmax of the logits (the first one on ties).
int64_t greedy_token(std::span<const float> logits, int64_t step);

// One extend() of some forward pass on a state of its own (the host Transformer's, or
// the CUDA one, kernels/model_forward.h): logits of `tokens` appended to that state.
using ExtendStep = std::function<RowMatrix(std::span<const int64_t> tokens, const ExtendOptions& opt)>;
// Generation over any forward pass, `extend` starting from an empty state: the prompt,
// then tokens chosen by `choose` from the last logits, each fed back; after each new
// token `stop(generated)` (the new tokens so far) ends it when it returns true (null:
// never); at most max_new_tokens tokens. A plan with a prompt (prefill > 0) is applied
// relative to this generation's own prompt: the prompt's queries attend exactly, every
// generated token reads the quantized cache and windows hold only generated tokens
// (unless `cache.prefill` is set explicitly). A plan without a prompt quantizes what
// every query reads, the prompt's included.
std::vector<int64_t> generate_with(const ExtendStep& extend, std::span<const int64_t> prompt, int64_t max_new_tokens,
                                   const CacheQuantization& cache, const TokenChooser& choose,
                                   const std::function<bool(const std::vector<int64_t>&)>& stop);

// generate_with() on a fresh state of `model`: any forward pass with a State, new_state()
// and extend(State&, tokens, opt), the host Transformer or cuda::CudaTransformer
// (kernels/model_forward.h), so both generate alike (sampling.h: seeded sampling).
template <typename Model>
std::vector<int64_t> generate(const Model& model, std::span<const int64_t> prompt, int64_t max_new_tokens,
                              const CacheQuantization& cache, const TokenChooser& choose,
                              const std::function<bool(const std::vector<int64_t>&)>& stop) {
  typename Model::State state = model.new_state();
  const ExtendStep extend = [&](std::span<const int64_t> tokens, const ExtendOptions& opt) {
    return model.extend(state, tokens, opt);
  };
  return generate_with(extend, prompt, max_new_tokens, cache, choose, stop);
}
// generate() choosing the argmax (greedy_token).
template <typename Model>
std::vector<int64_t> greedy_generate(const Model& model, std::span<const int64_t> prompt, int64_t max_new_tokens,
                                     const CacheQuantization& cache,
                                     const std::function<bool(const std::vector<int64_t>&)>& stop = nullptr) {
  return generate(model, prompt, max_new_tokens, cache, greedy_token, stop);
}
// greedy_generate() without a stop: every continuation has exactly new_tokens tokens
// (EOS is not special).
std::vector<int64_t> greedy_continuation(const Transformer& model, std::span<const int64_t> prompt,
                                         int64_t new_tokens, const CacheQuantization& cache);

// Another implementation of this forward pass (the CUDA one, kernels/model_forward.h)
// as functions, for code in sim/ that must not depend on it: ModelEvaluator runs its
// teacher-forced passes and continuations through it when set (ModelEvalOptions).
struct ForwardBackend {
  std::string name;  // "cuda": for messages
  // Transformer::forward: a fresh state, every token.
  std::function<RowMatrix(std::span<const int64_t> tokens, const ExtendOptions& opt)> forward;
  // The same, writing the logits [n, vocab] row-major into the caller's host memory
  // (optional; ModelEvaluator's windows go straight into the run's matrix with it).
  std::function<void(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits)> forward_into;
  // kvb::generate on this implementation.
  std::function<std::vector<int64_t>(std::span<const int64_t> prompt, int64_t max_new_tokens,
                                     const CacheQuantization& cache, const TokenChooser& choose,
                                     const std::function<bool(const std::vector<int64_t>&)>& stop)>
      generate;
  explicit operator bool() const { return static_cast<bool>(forward); }
};

// Index of the largest value (the first one on ties).
int64_t argmax(const float* values, int64_t n);

}  // namespace kvb
