#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "sim/attention_error.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/row_simd.h"

namespace kvb {

namespace {

using detail::HeadScratch;
using detail::UnitDelta;

// Zeroes the reconstruction error of every row outside `region` (attribution), in
// the decoded versions and in the score estimators' columns alike.
void keep_region(const ErrorRegion& region, const UnitPlan& unit, int64_t T, int64_t d, UnitDelta& u) {
  using Part = ErrorRegion::Part;
  const bool sink_head = !unit.segments.empty() && unit.segments.front().role == SegmentRole::SinkHead;
  auto zero_rows = [&](std::vector<float>& delta, int64_t j0, int64_t j1) {
    if (!delta.empty() && j1 > j0) std::fill(delta.begin() + j0 * d, delta.begin() + j1 * d, 0.0f);
  };
  // Estimated columns follow the stored version: keep [b, e) of each, drop the empty.
  auto keep_estimated = [&](auto keep_range) {
    for (EstimatedKeys& e : u.estimated) {
      const auto [kb, ke] = keep_range(e);
      e.keep_begin = std::max(e.begin, kb);
      e.keep_end = std::min(e.end, ke);
    }
    std::erase_if(u.estimated, [](const EstimatedKeys& e) { return e.keep_end <= e.keep_begin; });
  };
  auto none = [](const EstimatedKeys&) { return std::pair<int64_t, int64_t>{0, 0}; };
  if (region.part == Part::Tokens) {
    const int64_t b = std::clamp<int64_t>(region.begin, 0, T), e = std::clamp<int64_t>(region.end, b, T);
    for (std::vector<float>* delta : {&u.stored, &u.window}) {
      zero_rows(*delta, 0, b);
      zero_rows(*delta, e, T);
    }
    keep_estimated([&](const EstimatedKeys&) { return std::pair<int64_t, int64_t>{b, e}; });
    return;
  }
  if (region.part == Part::SinkHeads) {
    if (!sink_head) {
      zero_rows(u.stored, 0, T);
      zero_rows(u.window, 0, T);
      keep_estimated(none);
    }
    return;
  }
  // Window, SinkTokens and Rest never include sink-head units.
  if (sink_head) {
    zero_rows(u.stored, 0, T);
    zero_rows(u.window, 0, T);
    keep_estimated(none);
    return;
  }
  if (region.part != Part::Window) zero_rows(u.window, 0, T);
  const SegmentRole keep = region.part == Part::SinkTokens ? SegmentRole::SinkToken : SegmentRole::Allocated;
  auto kept = [&](const Segment& s) { return region.part != Part::Window && s.role == keep; };
  for (const Segment& s : unit.segments)
    if (!kept(s)) zero_rows(u.stored, s.begin, s.end);
  keep_estimated([&](const EstimatedKeys& e) {
    for (const Segment& s : unit.segments)
      if (s.begin == e.begin) return kept(s) ? std::pair<int64_t, int64_t>{e.begin, e.end} : std::pair<int64_t, int64_t>{0, 0};
    return std::pair<int64_t, int64_t>{0, 0};
  });
}

// x̂ - x into xhat [n], adding Σ (x̂ - x)² to err2 and Σ x² to norm2 (fp64, lane order fixed).
void subtract_and_sum(float* xhat, const float* x, int64_t n, double& err2, double& norm2) {
  using namespace simd;
  f64v e = f64v{}, s = f64v{};
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t cnt = std::min(kLanes, n - j);
    const f32v xj = load(x + j, cnt), delta = load(xhat + j, cnt) - xj;
    store(xhat + j, delta, cnt);
    const f64v dw = widen(delta), xw = widen(xj);
    e += dw * dw;
    s += xw * xw;
  }
  err2 += hsum(e);
  norm2 += hsum(s);
}

// Fills u (its buffers reused from an earlier unit of the same size).
void unit_delta_of(const Recording& rec, const Plan& plan, int64_t layer, int64_t g, Kind kind,
                   const SimOptions& opt, double& err2, double& norm2, UnitDelta& u) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const int64_t T = rec.tokens, d = rec.head_dim, n = T * d;
  const float* x = (kind == Kind::Key ? L.key : L.value).slice(g);
  const UnitPlan& unit = plan.unit(layer, g, kind);
  u.unit = &unit;
  u.stored.resize(static_cast<size_t>(n));
  u.window.clear();
  if (unit.window.active()) u.window.resize(static_cast<size_t>(n));
  reconstruct_unit_versions(unit, x, T, d, unit_span(rec, layer, g, kind, opt.seed), u.stored.data(),
                            u.window.data(), u.estimated);
  subtract_and_sum(u.stored.data(), x, n, err2, norm2);
  if (u.has_window())
    for (int64_t i = 0; i < n; ++i) u.window[i] -= x[i];
  if (opt.region) keep_region(*opt.region, unit, rec.tokens, rec.head_dim, u);
}

// unit_delta_of with errors naming the unit's KV head and kind (the sweep names the
// layer), keeping the error's type.
void unit_delta(const Recording& rec, const Plan& plan, int64_t layer, int64_t g, Kind kind, const SimOptions& opt,
                double& err2, double& norm2, UnitDelta& u) {
  try {
    unit_delta_of(rec, plan, layer, g, kind, opt, err2, norm2, u);
  } catch (Error& e) {
    e.add_context("kv_head " + std::to_string(g) + " " + kind_name(kind));
    throw;
  }
}

// The query heads of KV head g: both units reconstructed once, then every head.
void simulate_group(const Recording& rec, const Plan& plan, int64_t layer, int64_t g, const std::vector<int64_t>& pos,
                    const SimOptions& opt, HeadScratch& scratch, ErrorStats& stats) {
  unit_delta(rec, plan, layer, g, Kind::Key, opt, stats.k_err2, stats.k_norm2, scratch.dk);
  unit_delta(rec, plan, layer, g, Kind::Value, opt, stats.v_err2, stats.v_norm2, scratch.dv);
  for (int64_t h = g * rec.group_size(); h < (g + 1) * rec.group_size(); ++h)
    (opt.reference ? detail::measure_head_reference : detail::measure_head_fast)(
        rec, plan, layer, h, scratch.dk, scratch.dv, pos, opt, scratch, stats);
}

// One scratch per thread, kept between calls: its buffers (the block matrices
// [row_block, T], a unit's errors [T, head_dim]) are allocated and faulted in once per
// thread instead of once per layer. It holds what the largest measurement so far needed.
HeadScratch& thread_scratch() {
  thread_local HeadScratch scratch;
  return scratch;
}

}  // namespace

std::vector<int64_t> detail::evaluated_positions(const Recording& rec, const SimOptions& opt) {
  std::vector<int64_t> pos = opt.positions;
  if (pos.empty()) {
    pos.resize(static_cast<size_t>(rec.tokens));
    std::iota(pos.begin(), pos.end(), 0);
  }
  return pos;
}

ErrorStats simulate_layer(const Recording& rec, const Plan& plan, int64_t layer, const SimOptions& opt) {
  const std::vector<int64_t> pos = detail::evaluated_positions(rec, opt);
  ErrorStats stats;
  stats.rows.reserve(pos.size() * static_cast<size_t>(rec.q_heads));
  HeadScratch& scratch = thread_scratch();
  for (int64_t g = 0; g < rec.kv_heads; ++g) simulate_group(rec, plan, layer, g, pos, opt, scratch, stats);
  // Rows are in (q_head, position) order within the layer.
  return stats;
}

ErrorStats simulate_kv_head(const Recording& rec, const Plan& plan, int64_t layer, int64_t kv_head,
                            const SimOptions& opt) {
  const std::vector<int64_t> pos = detail::evaluated_positions(rec, opt);
  ErrorStats stats;
  stats.rows.reserve(pos.size() * static_cast<size_t>(rec.group_size()));
  HeadScratch& scratch = thread_scratch();
  simulate_group(rec, plan, layer, kv_head, pos, opt, scratch, stats);
  return stats;
}

ErrorStats simulate(const Recording& rec, const Plan& plan, const SimOptions& opt) {
  const std::string bad = plan.check();
  if (!bad.empty()) throw Error("invalid plan: " + bad);
  ErrorStats all;
  all.rows.reserve(detail::evaluated_positions(rec, opt).size() * static_cast<size_t>(rec.q_heads * rec.num_layers()));
  for (int64_t l = 0; l < rec.num_layers(); ++l) all.merge(simulate_layer(rec, plan, l, opt));
  return all;
}

}  // namespace kvb
