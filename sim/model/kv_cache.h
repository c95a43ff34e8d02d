// The model's KV cache: the exact keys (post-RoPE) and values of every token
// processed so far, and what attention reads from it, which is either those exact
// values or what a Plan makes of them.
//
// Reconstruction goes through the functions the recording simulator uses
// (sim/reconstruction.h): reconstruct_unit_versions() with the Plan's unit for the
// cache's current length (Plan::unit_at), its recency window and its estimated key
// segments; attention then picks, for query t and token j, the version
// row_versions() names (exact before the plan's prefill, the residual's while the
// window holds j or j's group along tokens is still open, else the stored one), exactly as the recording simulator does. So whatever a Plan
// and its formats express applies to the model unchanged. Semantics:
//  - teacher forcing (all T tokens in one pass): each layer's cache of T tokens is
//    reconstructed once and every query reads it (its own token included), as in the
//    recording simulator. The layer's output feeds the next layer, so errors
//    propagate.
//  - generation (tokens appended one at a time): before each step the whole cache,
//    prefix plus the new token, is reconstructed at the new length. Every group a
//    query reads in its stored version is complete (groups along tokens stay in the
//    residual while open, plan.h), so this equals teacher forcing: no query reads
//    anything that depends on a later token. Keys and values of earlier tokens are
//    not recomputed. view_after_append() gives that reconstruction's bits while
//    re-quantizing only the groups that changed (update_unit_versions): with formats
//    that split at their groups (Format::splits_at_groups), a step costs what its new
//    tokens do, not the whole history. Formats fitted to the whole span (nvfp4, int ch,
//    a calibrated fp8 scale, NUQ) re-quantize only the new tokens while their fit stays
//    what it was (Format::roundtrip_grown: fp8 -cal<N> and NUQ -cal<N> always after N
//    tokens; NVFP4 and int ch of 2 bits and more while the new tokens lie within the
//    range the history set) and the whole segment when it changes; NUQ keeps its
//    codebooks between steps (UnitGrowthMemos). Turbo splits, NUQ fitted to the
//    whole span and QJL's estimators are rebuilt over the whole segment at every step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/model/attention.h"
#include "sim/plan.h"

namespace kvb {

struct CacheQuantization {
  const Plan* plan = nullptr;  // nullptr: attention reads the exact fp32 cache
  uint64_t seed = 0;           // handed to seeded formats (SpanInfo::seed)
  // The prompt length (prefill) attention uses instead of the plan's: queries before
  // it read exact keys and values and windows hold only later tokens. < 0: the plan's
  // prefill. greedy_continuation() sets it to the continuation's own prompt when the
  // plan has a prompt, so that each continuation is quantized relative to its prompt.
  int64_t prefill = -1;
  // Where the sequence's second phase starts: the position of its first
  // plan->phase_marker() token, nullopt while it holds none. Used only for a plan with
  // a phase marker (Plan::unit_at with second_phase); Transformer::extend sets it from
  // the tokens the state holds, so the phases switch where the marker is given or
  // generated.
  std::optional<int64_t> second_phase = std::nullopt;

  int64_t effective_prefill() const { return prefill >= 0 ? prefill : (plan ? plan->prefill() : 0); }
  // This quantization for generation from a prompt of `prompt_tokens`: a plan with a
  // prefill takes the prompt as its prefill (unless `prefill` is set already), so that
  // the continuation is quantized relative to its own prompt. What generate_with (CPU and
  // CUDA) runs, and what `kvbudget generate` reports the memory of.
  CacheQuantization for_prompt(int64_t prompt_tokens) const {
    CacheQuantization out = *this;
    if (plan && plan->prefill() > 0 && prefill < 0) out.prefill = prompt_tokens;
    return out;
  }
  // This quantization for a sequence holding `tokens` (positions 0..): second_phase at
  // the first plan->phase_marker() token among them, when the plan has a marker and
  // the tokens hold it; otherwise unchanged. What extend() (CPU and CUDA) attends with.
  CacheQuantization for_tokens(const std::vector<int64_t>& tokens) const;
};

// How the cached keys were rotated: the RoPE context formats get in SpanInfo (a
// prerope:<format> quantizes the pre-RoPE keys and rotates them back).
struct CacheRope {
  bool applied = false;                          // keys are post-RoPE; a pre-RoPE copy is kept
  double theta = 10000.0;
  const std::vector<float>* inv_freq = nullptr;  // scaled inverse frequencies, or null (theta's)
  std::string model;                             // named in format errors
};

class KvCache {
 public:
  KvCache() = default;
  KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, CacheRope rope = {});

  // Empties every layer, keeping the allocated storage for the next sequence (of a
  // model with the same cache shape and this RoPE context).
  void reset(CacheRope rope);

  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  // Tokens held by a layer (layers fill up one after the other within a forward step).
  int64_t length(int64_t layer) const;

  // Appends n tokens to a layer: row r of KV head g is read at
  // keys + r * stride + g * head_dim (and the same for values).
  void append(int64_t layer, const float* keys, const float* values, int64_t stride, int64_t n);
  // With RoPE: the same tokens' keys before rotation, appended first.
  void append_pre_rope_keys(int64_t layer, const float* keys, int64_t stride, int64_t n);

  // What attention reads for a layer, [length, head_dim] rows per version: exact, or
  // reconstructed through q.plan (into `scratch`, which must outlive the view), with
  // score estimators for key segments whose format has one (QJL). Every unit is
  // reconstructed whole: the plain reference of view_after_append().
  KvLayerView view(int64_t layer, const CacheQuantization& q, std::vector<float>& scratch) const;
  // The same view, bit for bit, after `appended` tokens were appended to the layer:
  // what extend() reads. Once the layer held more tokens than were appended (a decoding
  // step), its reconstructed versions are kept in the cache and the next call
  // re-quantizes only the groups that changed; a first pass over a whole sequence
  // (teacher forcing) reconstructs into `scratch` and keeps nothing. Memory: a decoding
  // cache keeps one fp32 stored version of every unit, and a window version where the
  // plan has a window, beside the exact keys and values (1-2x what they take), until
  // reset() (which keeps the capacity for the next sequence). The view's pointers stay
  // valid until the layer is appended to or reset, or `scratch` or the kept versions
  // change: the next view()/view_after_append() of this layer, or with the same
  // `scratch` of any layer.
  KvLayerView view_after_append(int64_t layer, const CacheQuantization& q, int64_t appended,
                                std::vector<float>& scratch);

 private:
  // Kinds of stored rows per (layer, KV head).
  static constexpr int kKeys = 0, kValues = 1, kPreRopeKeys = 2, kKinds = 3;
  const std::vector<float>& unit(int64_t layer, int64_t kv_head, int kind) const {
    return units_[static_cast<size_t>((layer * kv_heads_ + kv_head) * kKinds + kind)];
  }
  std::vector<float>& unit(int64_t layer, int64_t kv_head, int kind) {
    return units_[static_cast<size_t>((layer * kv_heads_ + kv_head) * kKinds + kind)];
  }
  // What a format learns about unit (layer, g, kind) from token 0.
  SpanInfo unit_span(int64_t layer, int64_t kv_head, Kind kind, uint64_t seed) const;

  // The versions view_after_append() built for one unit (K or V of a layer's KV head)
  // and what they were built for; update_unit_versions starts from them.
  struct KeptVersions {
    UnitPlan plan;                      // the plan's unit at `length`
    int64_t length = 0;                 // rows built; 0 = nothing kept
    uint64_t seed = 0;                  // the CacheQuantization's seed
    std::vector<float> stored, window;  // [length, head_dim]; window only with plan.window active
    UnitGrowthMemos memos;              // what fitted formats kept for the next step (NUQ's codebooks)
  };
  KeptVersions& kept(int64_t layer, int64_t kv_head, Kind kind) {
    return kept_[static_cast<size_t>((layer * kv_heads_ + kv_head) * 2 + static_cast<int>(kind))];
  }
  // Fills v.keys / v.values (their plans included) from the kept versions, updated to
  // the layer's length.
  void update_kept(int64_t layer, const CacheQuantization& q, KvLayerView& v);

  int64_t layers_ = 0, kv_heads_ = 0, head_dim_ = 0;
  CacheRope rope_;
  std::vector<std::vector<float>> units_;  // [(layer, kv_head, kind)] -> [length, head_dim]
  std::vector<KeptVersions> kept_;         // [(layer, kv_head, K/V)]
};

// Throws kvb::Error unless the plan's layers, KV heads and head_dim match the cache.
void check_plan_fits(const Plan& plan, int64_t layers, int64_t kv_heads, int64_t head_dim);

}  // namespace kvb
