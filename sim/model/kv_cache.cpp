#include "sim/model/kv_cache.h"

#include <omp.h>

#include <algorithm>

#include "sim/core/error.h"
#include "sim/model/layers.h"
#include "sim/reconstruction.h"

namespace kvb {

CacheQuantization CacheQuantization::for_tokens(const std::vector<int64_t>& tokens) const {
  CacheQuantization q = *this;
  if (plan && plan->phase_marker()) {
    const auto marker = std::find(tokens.begin(), tokens.end(), *plan->phase_marker());
    if (marker != tokens.end()) q.second_phase = marker - tokens.begin();
  }
  return q;
}

KvCache::KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, CacheRope rope)
    : layers_(layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      rope_(std::move(rope)),
      units_(static_cast<size_t>(layers * kv_heads * kKinds)),
      kept_(static_cast<size_t>(layers * kv_heads * 2)) {}

void KvCache::reset(CacheRope rope) {
  rope_ = std::move(rope);
  for (std::vector<float>& u : units_) u.clear();
  for (KeptVersions& k : kept_) k.length = 0;
}

int64_t KvCache::length(int64_t layer) const {
  return static_cast<int64_t>(unit(layer, 0, kKeys).size()) / head_dim_;
}

namespace {

// Appends n rows of d floats (row r at src + r * stride). The storage grows
// geometrically: a decoding step appends one row to every unit, and growing to the exact
// size each time copied the whole history at every step (quadratic in the length).
void append_rows(std::vector<float>& u, const float* src, int64_t stride, int64_t n, int64_t d) {
  const size_t needed = u.size() + static_cast<size_t>(n * d);
  if (needed > u.capacity()) u.reserve(std::max(needed, 2 * u.capacity()));
  for (int64_t r = 0; r < n; ++r) u.insert(u.end(), src + r * stride, src + r * stride + d);
}

}  // namespace

void KvCache::append(int64_t layer, const float* keys, const float* values, int64_t stride, int64_t n) {
  for (int64_t g = 0; g < kv_heads_; ++g) {
    append_rows(unit(layer, g, kKeys), keys + g * head_dim_, stride, n, head_dim_);
    append_rows(unit(layer, g, kValues), values + g * head_dim_, stride, n, head_dim_);
  }
}

void KvCache::append_pre_rope_keys(int64_t layer, const float* keys, int64_t stride, int64_t n) {
  for (int64_t g = 0; g < kv_heads_; ++g) append_rows(unit(layer, g, kPreRopeKeys), keys + g * head_dim_, stride, n, head_dim_);
}

SpanInfo KvCache::unit_span(int64_t layer, int64_t kv_head, Kind kind, uint64_t seed) const {
  SpanSource source;
  source.name = rope_.model.c_str();
  source.rope_applied = rope_.applied;
  source.rope_theta = rope_.theta;
  source.rope_inv_freq = rope_.inv_freq;
  const std::vector<float>& pre = unit(layer, kv_head, kPreRopeKeys);
  return kvb::unit_span(source, layer, kv_head, kind, seed, pre.empty() ? nullptr : pre.data(), head_dim_);
}

namespace {

// The plan's unit (layer, kv_head, kind) for a cache of `length` tokens, its phases
// switched where q says when the plan has a phase marker.
UnitPlan unit_plan_at(const CacheQuantization& q, int64_t layer, int64_t kv_head, Kind kind, int64_t length) {
  return q.plan->phase_marker() ? q.plan->unit_at(layer, kv_head, kind, length, q.second_phase)
                                : q.plan->unit_at(layer, kv_head, kind, length);
}

// Calls fn(kv_head, kind, unit view of v) for every K and V unit of a layer, on OpenMP's
// threads when `elements` (about what the units quantize) makes it worthwhile. A unit's
// exception is rethrown after the loop as kvb::Error, the first unit's, naming it.
template <class Fn>
void for_each_unit(int64_t layer, KvLayerView& v, double elements, Fn&& fn) {
  const int64_t units = 2 * static_cast<int64_t>(v.keys.size());
  std::vector<std::string> errors(static_cast<size_t>(units));
#pragma omp parallel for schedule(dynamic, 1) if (units > 1 && parallel_worthwhile(50.0 * elements))
  for (int64_t u = 0; u < units; ++u) {
    const int64_t g = u / 2;
    const Kind kind = u % 2 == 0 ? Kind::Key : Kind::Value;
    try {
      fn(g, kind, (kind == Kind::Key ? v.keys : v.values)[static_cast<size_t>(g)]);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(u)] = "layer " + std::to_string(layer) + " kv_head " + std::to_string(g) + " " +
                                       kind_name(kind) + ": " + e.what();
    }
  }
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
}

}  // namespace

KvLayerView KvCache::view(int64_t layer, const CacheQuantization& q, std::vector<float>& scratch) const {
  KvLayerView v;
  v.keys.resize(static_cast<size_t>(kv_heads_));
  v.values.resize(static_cast<size_t>(kv_heads_));
  for (int64_t g = 0; g < kv_heads_; ++g) {
    v.keys[static_cast<size_t>(g)].exact = v.keys[static_cast<size_t>(g)].stored = unit(layer, g, kKeys).data();
    v.values[static_cast<size_t>(g)].exact = v.values[static_cast<size_t>(g)].stored = unit(layer, g, kValues).data();
  }
  if (!q.plan) return v;
  v.prefill = q.effective_prefill();
  const int64_t length = this->length(layer), d = head_dim_;
  const int64_t unit_floats = length * d;
  // Scratch: per unit (2 g + kind), the stored version, then the window version.
  scratch.resize(static_cast<size_t>(4 * kv_heads_ * unit_floats));
  for_each_unit(layer, v, static_cast<double>(2 * kv_heads_ * unit_floats), [&](int64_t g, Kind kind, KvUnitView& view) {
    view.plan = unit_plan_at(q, layer, g, kind, length);
    const int64_t u = 2 * g + static_cast<int64_t>(kind);
    float* stored = scratch.data() + (2 * u) * unit_floats;
    float* window = scratch.data() + (2 * u + 1) * unit_floats;
    reconstruct_unit_versions(view.plan, view.exact, length, d, unit_span(layer, g, kind, q.seed), stored, window,
                              view.estimated);
    view.stored = stored;
    if (view.plan.window.active()) view.window = window;
  });
  return v;
}

KvLayerView KvCache::view_after_append(int64_t layer, const CacheQuantization& q, int64_t appended,
                                       std::vector<float>& scratch) {
  const bool keeping = kept(layer, 0, Kind::Key).length > 0;
  if (!q.plan || (!keeping && appended >= length(layer))) return view(layer, q, scratch);
  KvLayerView v = view(layer, CacheQuantization{}, scratch);  // the exact pointers
  v.prefill = q.effective_prefill();
  update_kept(layer, q, v);
  return v;
}

void KvCache::update_kept(int64_t layer, const CacheQuantization& q, KvLayerView& v) {
  const int64_t length = this->length(layer), d = head_dim_;
  // The units' plans, and how many rows they re-quantize (what decides the threads).
  int64_t rows = 0;
  for (int64_t g = 0; g < kv_heads_; ++g)
    for (const Kind kind : {Kind::Key, Kind::Value}) {
      UnitPlan& plan = (kind == Kind::Key ? v.keys : v.values)[static_cast<size_t>(g)].plan;
      plan = unit_plan_at(q, layer, g, kind, length);
      KeptVersions& k = kept(layer, g, kind);
      if (k.length > length || k.seed != q.seed) k.length = 0;  // another sequence's, or seed's
      rows += k.length > 0 ? rows_to_update(k.plan, k.length, plan, length) : 2 * length;
    }
  for_each_unit(layer, v, static_cast<double>(rows * d), [&](int64_t g, Kind kind, KvUnitView& view) {
    const UnitPlan& plan = view.plan;
    const SpanInfo span = unit_span(layer, g, kind, q.seed);
    KeptVersions& k = kept(layer, g, kind);
    k.stored.resize(static_cast<size_t>(length * d));
    if (plan.window.active()) k.window.resize(static_cast<size_t>(length * d));
    float* window = plan.window.active() ? k.window.data() : nullptr;
    const int64_t built = k.length;
    k.length = 0;  // nothing kept unless the update completes
    if (built == 0) {
      k.memos = {};
      reconstruct_unit_versions(plan, view.exact, length, d, span, k.stored.data(), window, view.estimated);
    } else {
      update_unit_versions(k.plan, built, plan, view.exact, length, d, span, k.stored.data(), window, view.estimated,
                           &k.memos);
    }
    k.plan = plan;
    k.length = length;
    k.seed = q.seed;
    view.stored = k.stored.data();
    view.window = window;
  });
}

void check_plan_fits(const Plan& plan, int64_t layers, int64_t kv_heads, int64_t head_dim) {
  if (plan.layers() != layers || plan.kv_heads() != kv_heads || plan.head_dim() != head_dim)
    throw Error("the plan is for " + std::to_string(plan.layers()) + " layers x " + std::to_string(plan.kv_heads()) +
                " KV heads x head_dim " + std::to_string(plan.head_dim()) + ", but the model's cache has " +
                std::to_string(layers) + " x " + std::to_string(kv_heads) + " x " + std::to_string(head_dim));
}

}  // namespace kvb
